"""Is the server image reproducible? Build it twice from a clean state and compare.

    python bench/image_reproducible.py [--base IMAGE] [--keep]      # ~2 builds of 1-2 min each

Builds `docbroker-server` twice with `--no-cache` (every step runs again) under tags of its
own, then compares what Docker names — the image ids and each layer's digest — and what
`docbroker image build` records, the content digest of the file tree (broker/supply/content.py).
Prints the wall time of each build, of a scan, and of a sign + verify, and, when the content
digests differ, the first paths that differ (the cause to fix). Removes its two tags at the end
unless --keep. Needs the Docker daemon of DOCKER_HOST (or the default socket) and a filled
wheelhouse (`docbroker image build` fills it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.images import DEFAULT_BASE, build_images, docker_client, ensure_base
from broker.supply.content import scan_image
from broker.supply.provenance import load_signing_key, load_trust_keys, write_keypair
from broker.supply.records import record_image, verify_image

TAGS = ("docbroker-server:repro-a", "docbroker-server:repro-b")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default=None, help=f"base image (default {DEFAULT_BASE}, built if missing)")
    parser.add_argument("--keep", action="store_true", help="keep the two images")
    args = parser.parse_args()
    client = docker_client(None)
    quiet = lambda _line: None  # noqa: E731
    try:
        if args.base is None:
            ensure_base(client, DEFAULT_BASE, print)
        builds = []
        for tag in TAGS:
            started = time.monotonic()
            print(f"building {tag} with --no-cache ...", flush=True)
            build_images(["server"], args.base, quiet, no_cache=True, tags={"server": tag})
            builds.append(time.monotonic() - started)
        images = [client.images.get(tag) for tag in TAGS]
        layers = [image.attrs["RootFS"]["Layers"] for image in images]
        same_layers = sum(a == b for a, b in zip(*layers, strict=False))
        scans, scan_seconds = [], []
        for tag in TAGS:
            started = time.monotonic()
            scans.append(scan_image(client, tag, quiet, listing=True))
            scan_seconds.append(time.monotonic() - started)
        with tempfile.TemporaryDirectory() as tmp:
            key = Path(tmp) / "release.key"
            write_keypair(key, Path(tmp) / "release.pub")
            started = time.monotonic()
            record_image(client, TAGS[0], load_signing_key(key), Path(tmp) / "records", quiet)
            record_seconds = time.monotonic() - started
            started = time.monotonic()
            verify_image(
                client, TAGS[0], load_trust_keys([Path(tmp) / "release.pub"]), Path(tmp) / "records", quiet
            )
            verify_seconds = time.monotonic() - started
        print(f"builds (--no-cache): {builds[0]:.0f} s and {builds[1]:.0f} s")
        same_id = "equal" if images[0].id == images[1].id else "differ"
        print(f"image ids: {same_id} ({images[0].id[:19]}, {images[1].id[:19]})")
        print(f"layer digests: {same_layers} of {len(layers[0])} equal")
        for index, (a, b) in enumerate(zip(*layers, strict=False)):
            print(f"  layer {index}: {'equal' if a == b else 'differ'}  {a[:19]}  {b[:19]}")
        equal = scans[0].content_digest == scans[1].content_digest
        print(f"content digests: {'equal' if equal else 'differ'} ({scans[0].content_digest[:19]}, "
              f"{scans[1].content_digest[:19]}), {scans[0].entries} entries")  # fmt: skip
        if not equal:
            only = sorted(set(scans[0].listing) ^ set(scans[1].listing))
            print(f"  {len(only)} differing lines; the first:")
            for line in only[:20]:
                print("   ", line.decode().strip()[:160])
        print(f"scan: {scan_seconds[0]:.1f} s, {scan_seconds[1]:.1f} s; record (scan + SBOM + sign): "
              f"{record_seconds:.1f} s; verify: {verify_seconds:.1f} s")  # fmt: skip
        return 0 if equal else 1
    finally:
        if not args.keep:
            for tag in TAGS:
                try:
                    client.images.remove(tag)
                except Exception as exc:  # clean-up: report, never mask the result
                    print(f"could not remove {tag}: {exc.__class__.__name__}")
        client.close()


if __name__ == "__main__":
    sys.exit(main())
