#!/bin/sh
# Fill deploy/wheelhouse (gitignored) with binary wheels for the image's Python 3.11: the
# server's dependencies, the docbroker wheel and the broker's dependencies. Offline when the
# wheelhouse already satisfies them; otherwise pip reaches the package index from the HOST
# (containers cannot). Air-gapped users copy a filled wheelhouse in instead. Every wheel is
# checked against the lock's hashes (requirements/server.txt, requirements/broker.txt): a file
# that does not match stops it with one line naming the package.
#
# Usage: deploy/wheelhouse.sh        env: PYTHON (default python3; needs pip, and setuptools
#                                    from the lock: run it with the venv's python)
set -eu
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m broker.cli.build_images wheelhouse
