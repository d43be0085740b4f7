"""`docbroker image build`: the container images, built offline."""

from __future__ import annotations

import argparse

from broker.cli.base import CliError, Subparsers, note


def register(sub: Subparsers) -> None:
    image = sub.add_parser("image", help="container images").add_subparsers(
        dest="image_command", required=True, metavar="COMMAND"
    )
    build = image.add_parser(
        "build",
        help="build the images offline (base, wheelhouse, server, broker)",
        description="Build the images; progress on stderr. Exit 1 when a build fails.",
    )
    build.add_argument("which", nargs="*", default=["server"], choices=["server", "broker"])
    build.add_argument("--base", default=None, help="base image (default: a locally built Debian base)")
    build.set_defaults(func=cmd_image_build)


def cmd_image_build(args: argparse.Namespace) -> int:
    from broker.images import ImageError, build_images
    from broker.settings import docker_host_from_env

    try:
        build_images(args.which, base=args.base, progress=note, base_url=docker_host_from_env())
    except ImageError as exc:
        raise CliError(str(exc)) from None
    return 0
