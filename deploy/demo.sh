#!/usr/bin/env bash
# Starts a broker with one demo tenant and prints its URL and a dev token.
# Called by `./dev demo` after setup; expects the venv and a Docker daemon (DOCKER_HOST or
# DOCBROKER_DEMO_DOCKER_HOST; the rootless daemon when .ci/docker.env names one).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DOCBROKER_VENV:-$ROOT/.venv}
DATA=${DOCBROKER_DATA_DIR:-$ROOT/var/demo}

export DOCBROKER_DATA_DIR=$DATA
export DOCBROKER_POLICIES_DIR=$ROOT/policies
export DOCBROKER_HOST=${DOCBROKER_HOST:-127.0.0.1}
export DOCBROKER_PORT=${DOCBROKER_PORT:-8080}
export DOCBROKER_AUTH_ISSUER=${DOCBROKER_AUTH_ISSUER:-https://demo.docbroker.invalid}
export DOCBROKER_AUTH_AUDIENCE=${DOCBROKER_AUTH_AUDIENCE:-docbroker}
export DOCBROKER_AUTH_DEV_HS256_SECRET_FILE=$DATA/dev-hs256.key
export DOCBROKER_DOCKER_SECCOMP_PROFILE=$ROOT/policies/seccomp.json
if [ -n "${DOCBROKER_DEMO_DOCKER_HOST:-${ROOTLESS_DOCKER_HOST:-}}" ]; then
  export DOCBROKER_DOCKER_HOST=${DOCBROKER_DEMO_DOCKER_HOST:-$ROOTLESS_DOCKER_HOST}
fi

mkdir -p "$DATA"
chmod 700 "$DATA"
if [ ! -s "$DOCBROKER_AUTH_DEV_HS256_SECRET_FILE" ]; then
  (umask 077 && "$VENV/bin/python" -c 'import secrets; print(secrets.token_hex(32))' > "$DOCBROKER_AUTH_DEV_HS256_SECRET_FILE")
fi

"$VENV/bin/docbroker" tenant demo >/dev/null
cp -n "$ROOT"/deploy/demo-docs/*.md "$DATA/tenants/demo/docs/sources/" 2>/dev/null || true
TOKEN=$("$VENV/bin/docbroker" token --tenant demo --subject demo-user)
URL="http://$DOCBROKER_HOST:$DOCBROKER_PORT/mcp"

cat <<MSG

  docbroker is starting with the demo tenant "demo" (sandbox: Docker ${DOCBROKER_DOCKER_HOST:-default daemon}).

  MCP endpoint : $URL
  Dev token    : $TOKEN
  Approvals    : http://$DOCBROKER_HOST:$DOCBROKER_PORT/approvals   (paste the token)
  Audit log    : $DATA/audit.jsonl

  Try it:
    npx @modelcontextprotocol/inspector-cli@1.0.3 --cli --transport http --server-url $URL \\
        --header "Authorization: Bearer \$TOKEN" --method tools/list

MSG
exec "$VENV/bin/docbroker" serve
