#!/usr/bin/env bash
# A real OpenID Provider for the sign-in tests: npm's `oidc-provider` (a certified
# implementation) on Debian's Node, installed into a cache outside the checkout so a clean
# clone finds it and re-running skips it. tests/oidc/provider.mjs is started by the tests.
#
#   bash .ci/oidc-provider.sh    → /var/cache/docbroker/oidc-provider-$VERSION/node_modules
set -euo pipefail

VERSION=9.13.3
CACHE=${DOCBROKER_OIDC_PROVIDER_DIR:-/var/cache/docbroker/oidc-provider-$VERSION}
step() { printf '\033[1m--> %s\033[0m\n' "$*" >&2; }

if [ ! -x /usr/bin/node ] || [ ! -x /usr/bin/npm ]; then
  step "installing nodejs and npm (the test OpenID Provider)"
  apt-get update -q && apt-get install -y -q nodejs npm
fi
major=$(/usr/bin/node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "oidc-provider.sh: oidc-provider $VERSION needs Node 20 or later (found $major)" >&2
  exit 1
fi
if [ -f "$CACHE/node_modules/oidc-provider/package.json" ] \
  && [ "$(/usr/bin/node -p "require('$CACHE/node_modules/oidc-provider/package.json').version")" = "$VERSION" ]; then
  step "oidc-provider $VERSION already in $CACHE"
  exit 0
fi
step "installing oidc-provider $VERSION into $CACHE"
mkdir -p "$CACHE"
/usr/bin/npm install --prefix "$CACHE" --no-audit --no-fund --loglevel=error "oidc-provider@$VERSION"
step "oidc-provider $VERSION ready"
