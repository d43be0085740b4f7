"""`docbroker image build|keygen|verify`: the images, built offline, recorded and signed.

    docbroker image keygen --out release.key           # release.key (0600) and release.key.pub
    docbroker image build server --sign-key release.key
    docbroker image verify docbroker-server:latest --key release.key.pub

`build` scans each image it built (content digest, SBOM) and, with `--sign-key`, signs its
provenance; the records go to DOCBROKER_IMAGE_RECORDS, named by the image's id. `verify`
checks one image offline against them (broker/supply/records.py). docs/supply-chain.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from broker.cli.base import CliError, Subparsers, UsageError, note


def register(sub: Subparsers) -> None:
    image = sub.add_parser("image", help="container images").add_subparsers(
        dest="image_command", required=True, metavar="COMMAND"
    )
    build = image.add_parser(
        "build",
        help="build the images offline (base, wheelhouse, server, broker), record and sign them",
        description="Build the images, then write each one's SBOM and (with --sign-key) signed provenance "
        "to DOCBROKER_IMAGE_RECORDS; progress on stderr. Exit 1 when a build fails.",
    )
    build.add_argument("which", nargs="*", default=["server"], choices=["server", "broker"])
    build.add_argument("--base", default=None, help="base image (default: a locally built Debian base)")
    sign_help = "the release key (Ed25519 private key, PEM, chmod 600) to sign the provenance with"
    build.add_argument("--sign-key", type=Path, default=None, metavar="PATH", help=sign_help)
    build.add_argument("--no-cache", action="store_true", help="run every build step again (a clean build)")
    build.set_defaults(func=cmd_image_build)
    keygen = image.add_parser(
        "keygen",
        help="write a new release key pair (Ed25519): PATH (private, 0600) and PATH.pub",
        description="Write a new Ed25519 release key pair; an existing file is never replaced.",
    )
    keygen.add_argument("--out", type=Path, required=True, metavar="PATH", help="the private key's file")
    keygen.set_defaults(func=cmd_image_keygen)
    verify = image.add_parser(
        "verify",
        help="check an image against its signed provenance and SBOM, offline",
        description="Resolve IMAGE to its id, check its recorded provenance (signed by one of the keys, "
        "subject = the id), its SBOM (the one signed, and the image's packages) and its content "
        "digest. One line; exit 0 when verified, 1 when not.",
    )
    image_help = "an image name or id (default: DOCBROKER_DOCKER_IMAGE, the broker's sandbox image)"
    verify.add_argument("image", nargs="?", default=None, metavar="IMAGE", help=image_help)
    key_help = "a trusted release public key (repeatable; default DOCBROKER_IMAGE_TRUST_KEYS)"
    verify.add_argument("--key", type=Path, action="append", default=[], metavar="PUB", help=key_help)
    verify.set_defaults(func=cmd_image_verify)


def cmd_image_build(args: argparse.Namespace) -> int:
    from broker.images import ImageError, build_images, docker_client
    from broker.settings import SettingsError, docker_host_from_env, image_supply_from_env
    from broker.supply.provenance import ProvenanceError, load_signing_key
    from broker.supply.records import RecordError, record_image

    try:
        base_url = docker_host_from_env()
        records_dir = image_supply_from_env().records_dir
    except SettingsError as exc:
        raise UsageError(f"configuration error: {exc}") from None
    try:
        # Before the build: a wrong key is told in a second, not after minutes of building.
        key = load_signing_key(args.sign_key) if args.sign_key else None
    except ProvenanceError as exc:
        raise UsageError(str(exc)) from None
    try:
        started = time.monotonic()
        built = build_images(
            args.which, base=args.base, progress=note, base_url=base_url, no_cache=args.no_cache
        )
        note(f"images built in {time.monotonic() - started:.0f} s")
        client = docker_client(base_url)
        try:
            for image in built.values():
                recorded = record_image(client, image.image_id, key, records_dir, note, name=image.tag)
                signed = f"signed by key {recorded.key_id[:16]}" if key else "not signed (no --sign-key)"
                note(f"{image.tag}: {recorded.image_digest} content {recorded.content_digest}, {signed}")
        finally:
            client.close()
    except (ImageError, RecordError) as exc:
        raise CliError(str(exc)) from None
    return 0


def cmd_image_keygen(args: argparse.Namespace) -> int:
    from broker.supply.provenance import ProvenanceError, write_keypair

    out: Path = args.out
    try:
        key_id = write_keypair(out, out.with_name(out.name + ".pub"))
    except ProvenanceError as exc:
        raise CliError(str(exc)) from None
    print(f"release key {key_id}: private key written (0600), public key beside it (.pub)")
    return 0


def cmd_image_verify(args: argparse.Namespace) -> int:
    from broker.images import ImageError, docker_client
    from broker.settings import (
        SettingsError,
        docker_host_from_env,
        docker_image_from_env,
        image_supply_from_env,
    )
    from broker.supply.provenance import ProvenanceError, load_trust_keys
    from broker.supply.records import VerifyError, verify_image

    try:
        base_url = docker_host_from_env()
        supply = image_supply_from_env()
        image = args.image or docker_image_from_env()
    except SettingsError as exc:
        raise UsageError(f"configuration error: {exc}") from None
    try:
        keys = load_trust_keys(args.key or list(supply.trust_keys))
    except ProvenanceError as exc:
        raise UsageError(str(exc)) from None
    if not keys:
        raise UsageError("no trust key: give --key PUB or set DOCBROKER_IMAGE_TRUST_KEYS")
    started = time.monotonic()
    try:
        client = docker_client(base_url)
        try:
            verdict = verify_image(client, image, keys, supply.records_dir, lambda _line: None)
        finally:
            client.close()
    except (ImageError, VerifyError) as exc:
        raise CliError(f"NOT verified: {exc}") from None
    print(
        f"verified: {verdict.image_digest} signed by key {verdict.key_id[:16]}, "
        f"content {verdict.content_digest}, SBOM agrees ({verdict.python} Python distributions, "
        f"{verdict.debian} Debian packages) in {time.monotonic() - started:.1f} s"
    )
    return 0
