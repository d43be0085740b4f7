"""`python -m broker.cli.build_images [server] [broker] [--base IMAGE] | wheelhouse`: the images
(or only the wheelhouse) built from this checkout, nothing recorded or signed.

For .ci/docker.sh and deploy/wheelhouse.sh, which build on a host before any broker is set up
(DOCKER_HOST names the daemon). An operator's build is `docbroker image build`, which also
records and signs each image (broker/cli/image.py); the building is broker/images.py.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from broker.images import DEFAULT_BASE, IMAGE_TAGS, ImageError, build_images, build_wheelhouse

    parser = argparse.ArgumentParser(prog="python -m broker.cli.build_images")
    parser.add_argument("which", nargs="*", default=["server"], choices=[*IMAGE_TAGS, "wheelhouse"])
    parser.add_argument("--base", default=None, help=f"base image (default: build {DEFAULT_BASE} locally)")
    args = parser.parse_args(argv)
    try:
        if args.which == ["wheelhouse"]:
            build_wheelhouse(with_broker=True, progress=print)
        else:
            build_images(args.which, args.base, lambda line: print(line, flush=True))
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
