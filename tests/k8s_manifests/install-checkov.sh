#!/usr/bin/env bash
# checkov in a virtualenv of its own: checkov 3.3.30 pins packaging<24 and the project's pytest
# needs packaging>=24, so the two cannot share the dev venv. Its set is the `checkov` group of
# the project's one lock (uv.lock, a fork that never meets the project's own dependencies),
# exported by `./dev lock` to requirements/checkov.txt and installed with --require-hashes,
# binary wheels only (an sdist would be built with a setuptools fetched unhashed). Cached
# outside the checkout, keyed by that file's hash; the checks find it through
# DOCBROKER_TEST_CHECKOV (printed here).
#   bash tests/k8s_manifests/install-checkov.sh   →  export DOCBROKER_TEST_CHECKOV=<path>
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LOCKED=$ROOT/requirements/checkov.txt
VERSION=$(sed -n 's/^checkov==\([^ ;]*\).*/\1/p' "$LOCKED")
KEY=$(sha256sum "$LOCKED" | cut -c1-12)
DIR=${DOCBROKER_CHECKOV_DIR:-/var/cache/docbroker/checkov-$VERSION-$KEY}
PYTHON=${PYTHON:-python3}
if ! "$DIR/bin/checkov" --version 2>/dev/null | grep -qx "$VERSION"; then
  rm -rf "$DIR"
  "$PYTHON" -m venv "$DIR"
  "$DIR/bin/python" -m pip install -q --disable-pip-version-check --require-hashes --only-binary :all: \
    -r "$LOCKED" >&2
fi
echo "$DIR/bin/checkov"
