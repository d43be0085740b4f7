#!/usr/bin/env bash
# Starts a broker with one demo tenant and prints its URL and a dev token.
# Called by `./dev demo` after setup. With the rootless daemon from .ci/docker.sh, the broker
# runs as that daemon's user (the production shape: no root anywhere on the sandbox path);
# otherwise it uses the default (rootful) daemon.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DOCBROKER_VENV:-$ROOT/.venv}
POLICIES=$ROOT/policies

RUN_AS=()
if [ -n "${DOCKER_HOST_ROOTLESS:-}" ] && id docbroker >/dev/null 2>&1; then
  RUN_AS=(runuser -u docbroker --)
  export DOCBROKER_DOCKER_HOST=$DOCKER_HOST_ROOTLESS
  DATA=${DOCBROKER_DATA_DIR:-/var/lib/docbroker-demo}
  mkdir -p "$DATA" && chown docbroker: "$DATA"
  # The checkout may sit where the docbroker user cannot enter (/root, a mktemp folder), so the
  # broker it runs is a regular install in a venv of its own, and its policies are a copy.
  APP=/opt/docbroker-demo
  if [ ! -x "$APP/venv/bin/python" ]; then
    echo "==> installing docbroker for the docbroker user in $APP/venv" >&2
    /usr/bin/python3 -m venv "$APP/venv"
  fi
  # The broker's locked set, hash-checked, then docbroker itself from the wheel that setup's
  # image build made (built with the dev venv's locked setuptools; nothing fetched for it).
  "$APP/venv/bin/python" -m pip install -q --disable-pip-version-check --require-hashes \
    -r "$ROOT/requirements/broker.txt"
  WHEEL=$(ls "$ROOT"/deploy/wheelhouse/docbroker-*.whl 2>/dev/null | head -n 1)
  [ -n "$WHEEL" ] || { echo "demo: no docbroker wheel in deploy/wheelhouse: run ./dev setup" >&2; exit 1; }
  "$APP/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$WHEEL"
  chmod -R a+rX "$APP"
  VENV=$APP/venv
  rm -rf "$DATA/policies" && cp -r "$ROOT/policies" "$DATA/policies" && chown -R docbroker: "$DATA/policies"
  POLICIES=$DATA/policies
else
  DATA=${DOCBROKER_DATA_DIR:-$ROOT/var/demo}
  mkdir -p "$DATA"
fi
chmod 700 "$DATA"

export DOCBROKER_DATA_DIR=$DATA
export DOCBROKER_POLICIES_DIR=$POLICIES
export DOCBROKER_HOST=${DOCBROKER_HOST:-127.0.0.1}
export DOCBROKER_PORT=${DOCBROKER_PORT:-8080}
export DOCBROKER_AUTH_ISSUER=${DOCBROKER_AUTH_ISSUER:-https://demo.docbroker.invalid}
export DOCBROKER_AUTH_AUDIENCE=${DOCBROKER_AUTH_AUDIENCE:-docbroker}
export DOCBROKER_AUTH_DEV_HS256_SECRET_FILE=$DATA/dev-hs256.key
export DOCBROKER_DOCKER_SECCOMP_PROFILE=$POLICIES/seccomp.json

# The sandbox image, signed: a release key of the demo's own (a real deployment keeps its key
# off the broker's host: docs/supply-chain.md), the image's SBOM and signed provenance recorded
# by `image build` (setup's build, from the cache), and the broker checking them before every
# sandbox start (DOCBROKER_IMAGE_TRUST_KEYS).
RELEASE_KEY=$DATA/release.key
export DOCBROKER_IMAGE_RECORDS=$DATA/images
if [ ! -s "$RELEASE_KEY" ]; then
  "$ROOT/.venv/bin/python" -m broker image keygen --out "$RELEASE_KEY" >/dev/null
fi
echo "==> signing the sandbox image (docbroker image build server --sign-key; cached build)" >&2
(cd "$ROOT" && DOCBROKER_DOCKER_HOST=${DOCKER_HOST_ROOTFUL:-unix:///var/run/docker.sock} \
  "$ROOT/.venv/bin/python" -m broker image build server --sign-key "$RELEASE_KEY" 2>"$DATA/.image-build.log") \
  || { tail -n 5 "$DATA/.image-build.log" >&2; exit 1; }
if [ ${#RUN_AS[@]} -gt 0 ]; then
  # The rootless daemon runs what the rootful one built: the same id, so the same records.
  built=$(DOCKER_HOST=$DOCKER_HOST_ROOTFUL docker image inspect -f '{{.Id}}' docbroker-server:latest)
  here=$(DOCKER_HOST=$DOCKER_HOST_ROOTLESS docker image inspect -f '{{.Id}}' docbroker-server:latest 2>/dev/null || true)
  if [ "$built" != "$here" ]; then
    DOCKER_HOST=$DOCKER_HOST_ROOTFUL docker save docbroker-server:latest | DOCKER_HOST=$DOCKER_HOST_ROOTLESS docker load -q >/dev/null
  fi
  chown -R docbroker: "$DOCBROKER_IMAGE_RECORDS"
  cp "$RELEASE_KEY.pub" "$DATA/release.pub" && chown docbroker: "$DATA/release.pub"
  export DOCBROKER_IMAGE_TRUST_KEYS=$DATA/release.pub
else
  export DOCBROKER_IMAGE_TRUST_KEYS=$RELEASE_KEY.pub
fi

as_broker() { "${RUN_AS[@]}" env $(env | grep -E '^(DOCBROKER_|PATH=|HOME=)' | sed 's/^HOME=.*/HOME=\/tmp/') "$@"; }
# The command from this checkout (the venv's install may be another checkout's, editable);
# the docbroker user's venv holds a regular install of this checkout.
if [ ${#RUN_AS[@]} -eq 0 ]; then DOCBROKER=(env PYTHONPATH="$ROOT" "$VENV/bin/python" -m broker); else DOCBROKER=("$VENV/bin/docbroker"); fi

if [ ! -s "$DOCBROKER_AUTH_DEV_HS256_SECRET_FILE" ]; then
  as_broker sh -c 'umask 077 && "$0" -c "import secrets; print(secrets.token_hex(32))" > "$1"' \
    "$VENV/bin/python" "$DOCBROKER_AUTH_DEV_HS256_SECRET_FILE"
fi

as_broker "${DOCBROKER[@]}" tenant add demo >/dev/null 2>"$DATA/.tenant-add.err" || { cat "$DATA/.tenant-add.err" >&2; exit 1; }
for doc in "$ROOT"/deploy/demo-docs/*.md; do
  target="$DATA/tenants/demo/docs/sources/$(basename "$doc")"
  # Copied by root (the checkout may be closed to the broker's user), then handed over.
  [ -e "$target" ] || { cp "$doc" "$target" && chown --reference="$(dirname "$target")" "$target"; }
done
TOKEN=$(as_broker "${DOCBROKER[@]}" token --tenant demo --subject demo-user)
export TOKEN
BASE="http://$DOCBROKER_HOST:$DOCBROKER_PORT"
URL="$BASE/mcp"
# One ready client configuration (Claude Code's one line; `--client` names the others).
CLIENT_LINE=$(as_broker "${DOCBROKER[@]}" client-config --tenant demo --client claude-code --url "$BASE")
AUDIT_QUERY="${DOCBROKER[*]} audit query $DATA/audit.jsonl --tenant demo --event mcp.request --since 1h"
# How an approver signs in: with the organisation's OpenID Provider when DOCBROKER_OIDC_* name
# one (docs/identity.md), else by pasting a dev token with the approver's scope.
if [ -n "${DOCBROKER_OIDC_ISSUER:-}" ]; then
  SIGN_IN="sign in with the provider $DOCBROKER_OIDC_ISSUER (docs/approvers.md)"
else
  APPROVER=$(as_broker "$VENV/bin/docbroker" token --tenant demo --subject demo-approver --scope reports:approve)
  SIGN_IN="paste this approver token: $APPROVER"
fi

cat <<MSG

  docbroker is starting with the demo tenant "demo".
  Sandboxes: Docker at ${DOCBROKER_DOCKER_HOST:-the default socket}${RUN_AS:+ (rootless; broker runs as user docbroker)}
  Image: docbroker-server:latest, signed with the demo's release key; its provenance is checked
  before every sandbox start (docbroker image verify; docs/supply-chain.md)

  MCP endpoint : $URL
  Dev token    : $TOKEN
  Approvals    : $BASE/approvals
                 $SIGN_IN
  Audit log    : $DATA/audit.jsonl

  Client config (Claude Code; \`docbroker client-config --client NAME\` also writes vscode,
  cursor, claude-desktop, python and typescript ones):
    export DOCBROKER_TOKEN=$TOKEN
    $CLIENT_LINE

  The calls you make, as the audit log saw them:
    $AUDIT_QUERY

  Try it (a real MCP request, protocol 2026-07-28):
    TOKEN=$TOKEN
    curl -s $URL -H "Authorization: Bearer \$TOKEN" -H "Content-Type: application/json" \\
      -H "Accept: application/json, text/event-stream" -H "MCP-Protocol-Version: 2026-07-28" \\
      -H "Mcp-Method: tools/call" -H "Mcp-Name: search_documents" \\
      -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_documents",
           "arguments":{"query":"sandbox"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
           "io.modelcontextprotocol/clientCapabilities":{}}}}'
  or point any MCP client at the endpoint with the header "Authorization: Bearer <token>".

MSG
# The broker replaces this script, as the docbroker user through setpriv (an exec, no process
# left in between): a SIGTERM or Ctrl-C reaches the broker itself, which removes its sandboxes
# before it exits. runuser would stay as the parent, and on SIGTERM it forwards the signal,
# waits 2 s and SIGKILLs the broker, often before its sandboxes are removed.
EXEC_AS=()
if [ ${#RUN_AS[@]} -gt 0 ]; then EXEC_AS=(setpriv --reuid=docbroker --regid=docbroker --init-groups); fi
exec "${EXEC_AS[@]}" env $(env | grep -E '^(DOCBROKER_|PATH=)' ) HOME=/tmp "${DOCBROKER[@]}" serve
