#!/usr/bin/env bash
# checkov in a virtualenv of its own: checkov 3.3.30 pins packaging<24 and the project's pytest
# needs packaging>=24, so the two cannot share the dev venv. Cached outside the checkout, keyed
# by version; the checks find it through DOCBROKER_TEST_CHECKOV (printed here).
#   bash tests/k8s_manifests/install-checkov.sh   →  export DOCBROKER_TEST_CHECKOV=<path>
set -euo pipefail
VERSION=3.3.30
DIR=${DOCBROKER_CHECKOV_DIR:-/var/cache/docbroker/checkov-$VERSION}
PYTHON=${PYTHON:-python3}
if ! "$DIR/bin/checkov" --version 2>/dev/null | grep -qx "$VERSION"; then
  rm -rf "$DIR"
  "$PYTHON" -m venv "$DIR"
  "$DIR/bin/python" -m pip install -q --disable-pip-version-check "checkov==$VERSION" >&2
fi
echo "$DIR/bin/checkov"
