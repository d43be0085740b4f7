"""The image's SBOM: CycloneDX 1.6 JSON, made with cyclonedx-python-lib from the image itself.

    sbom = make_sbom(scan, image_name="docbroker-server:latest", wheel_hashes=wheel_hashes(WHEELHOUSE))
    check_sbom(sbom, scan)        # SbomError when the SBOM and the image disagree

What it names, all read from the image's file tree (broker/supply/content.py), never from the
build's intentions:

- the image (metadata.component, type container): its id and content digest;
- every Python distribution pip installed in it (each `site-packages/*.dist-info`): name, version, purl
  `pkg:pypi/…`, the SHA-256 of the wheel it was installed from when the build's wheelhouse
  holds exactly one such wheel, and the SHA-256 of its RECORD (`docbroker:record-sha256`),
  the installer's list of every file with its hash: checkable against the image, any time;
- the Debian packages of the base, from dpkg's status file, with the distribution.

`check_sbom` compares the Python distributions (name, version, RECORD hash) and the Debian
packages (name, version, architecture) both ways, and the image id and content digest: what
`docbroker image verify` means by "the SBOM agrees with the image".
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from broker.supply.content import ImageScan, canonical_name

PROPERTY_IMAGE_ID: Final = "docbroker:image-id"
PROPERTY_CONTENT: Final = "docbroker:content-digest"
PROPERTY_RECORD: Final = "docbroker:record-sha256"
PROPERTY_DIST_INFO: Final = "docbroker:dist-info"
MAX_SBOM_BYTES: Final = 16 * 1024 * 1024
_WHEEL = re.compile(r"(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl")


class SbomError(Exception):
    """The SBOM is unreadable or disagrees with the image. One line; counts, not names."""


def wheel_hashes(wheelhouse: Path) -> dict[tuple[str, str], str]:
    """(canonical name, version) → SHA-256 of the one wheel in `wheelhouse` for it."""
    found: dict[tuple[str, str], list[str]] = {}
    for wheel in sorted(wheelhouse.glob("*.whl")):
        match = _WHEEL.fullmatch(wheel.name)
        if match is None:
            continue
        key = (canonical_name(match["name"]), match["version"])
        found.setdefault(key, []).append(hashlib.sha256(wheel.read_bytes()).hexdigest())
    # Two wheels of one version (two platforms): which one pip chose is not known here.
    return {key: hashes[0] for key, hashes in found.items() if len(hashes) == 1}


def make_sbom(scan: ImageScan, *, image_name: str, wheel_hashes: Mapping[tuple[str, str], str]) -> bytes:
    """The CycloneDX JSON of the scanned image."""
    root = Component(
        type=ComponentType.CONTAINER,
        name=image_name,
        version=scan.image_id,
        bom_ref="image",
        properties=[
            Property(name=PROPERTY_IMAGE_ID, value=scan.image_id),
            Property(name=PROPERTY_CONTENT, value=scan.content_digest),
        ],
    )
    components = []
    for dist in scan.python:
        purl = PackageURL(type="pypi", name=canonical_name(dist.name), version=dist.version)
        wheel = wheel_hashes.get((canonical_name(dist.name), dist.version))
        components.append(
            Component(
                type=ComponentType.LIBRARY,
                name=dist.name,
                version=dist.version,
                purl=purl,
                bom_ref=f"{purl.to_string()}#{dist.dist_info}",
                hashes=[HashType(alg=HashAlgorithm.SHA_256, content=wheel)] if wheel else None,
                properties=[
                    Property(name=PROPERTY_RECORD, value=dist.record_sha256),
                    Property(name=PROPERTY_DIST_INFO, value=dist.dist_info),
                ],
            )
        )
    if scan.os_id:
        components.append(
            Component(
                type=ComponentType.OPERATING_SYSTEM,
                name=scan.os_id,
                version=scan.os_version,
                bom_ref=f"os:{scan.os_id}-{scan.os_version}",
            )
        )
    distro = f"{scan.os_id}-{scan.os_version}" if scan.os_id else None
    for package in scan.debian:
        qualifiers = {"arch": package.architecture, **({"distro": distro} if distro else {})}
        purl = PackageURL(type="deb", namespace="debian", name=package.name, version=package.version,
                          qualifiers=qualifiers)  # fmt: skip
        components.append(
            Component(
                type=ComponentType.LIBRARY,
                name=package.name,
                version=package.version,
                purl=purl,
                bom_ref=purl.to_string(),
            )
        )
    bom = Bom(metadata=BomMetaData(component=root), components=components)
    bom.register_dependency(root, components)
    return JsonV1Dot6(bom).output_as_string(indent=2).encode() + b"\n"


def check_sbom(sbom: bytes, scan: ImageScan) -> None:
    """SbomError unless `sbom` names exactly what `scan` found in the image."""
    if len(sbom) > MAX_SBOM_BYTES:
        raise SbomError(f"the SBOM is larger than {MAX_SBOM_BYTES} bytes")
    try:
        data = json.loads(sbom)
    except ValueError:
        raise SbomError("the SBOM is not JSON") from None
    if not isinstance(data, dict) or data.get("bomFormat") != "CycloneDX":
        raise SbomError("the SBOM is not a CycloneDX document")
    root = _get(data, "metadata", "component")
    root_props = _properties(root)
    if root_props.get(PROPERTY_IMAGE_ID) != scan.image_id:
        raise SbomError("the SBOM describes another image (its image id differs)")
    if root_props.get(PROPERTY_CONTENT) != scan.content_digest:
        raise SbomError("the SBOM's content digest differs from the image's")
    components = data.get("components")
    if not isinstance(components, list):
        raise SbomError("the SBOM lists no components")
    python: set[tuple[str, str, str]] = set()
    debian: set[tuple[str, str, str]] = set()
    for component in components:
        purl = component.get("purl") if isinstance(component, dict) else None
        if not isinstance(purl, str):
            continue
        try:
            parsed = PackageURL.from_string(purl)
        except ValueError:
            raise SbomError("the SBOM has a component with a malformed purl") from None
        version = str(component.get("version", ""))
        if parsed.type == "pypi":
            record = _properties(component).get(PROPERTY_RECORD, "")
            python.add((canonical_name(str(component.get("name", ""))), version, record))
        elif parsed.type == "deb":
            arch = parsed.qualifiers.get("arch", "") if isinstance(parsed.qualifiers, dict) else ""
            debian.add((str(component.get("name", "")), version, arch))
    in_image_python = {(canonical_name(d.name), d.version, d.record_sha256) for d in scan.python}
    in_image_debian = {(p.name, p.version, p.architecture) for p in scan.debian}
    differ_python = len(python ^ in_image_python)
    differ_debian = len(debian ^ in_image_debian)
    if differ_python or differ_debian:
        raise SbomError(
            f"the SBOM disagrees with the image: {differ_python} Python distribution and "
            f"{differ_debian} Debian package entries differ"
        )


def _properties(component: Any) -> dict[str, str]:
    props = component.get("properties") if isinstance(component, dict) else None
    if not isinstance(props, list):
        return {}
    return {str(p.get("name")): str(p.get("value")) for p in props if isinstance(p, dict)}


def _get(data: Any, *path: str) -> Any:
    for name in path:
        if not isinstance(data, dict):
            return None
        data = data.get(name)
    return data
