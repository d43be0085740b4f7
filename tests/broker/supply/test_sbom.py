"""The image's SBOM (broker/supply/sbom.py): valid CycloneDX 1.6, and every way it can
disagree with the image is caught by `check_sbom`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from broker.supply.content import DebPackage, ImageScan, PythonDist
from broker.supply.sbom import SbomError, check_sbom, make_sbom, wheel_hashes

SITE = "opt/venv/lib/python3.11/site-packages"
SCAN = ImageScan(
    image_id="sha256:" + "ab" * 32,
    content_digest="sha256:" + "cd" * 32,
    entries=1234,
    python=(
        PythonDist("pydantic", "2.14.4", "11" * 32, f"{SITE}/pydantic-2.14.4.dist-info"),
        PythonDist("typing_extensions", "4.16.0", "22" * 32, f"{SITE}/typing_extensions-4.16.0.dist-info"),
    ),
    debian=(DebPackage("libc6", "2.36-9+deb12u9", "amd64"), DebPackage("python3.11", "3.11.2-6", "amd64")),
    os_id="debian",
    os_version="12",
)
OTHER = "sha256:" + "ee" * 32
WHEELS = {("pydantic", "2.14.4"): "33" * 32}


def sbom() -> bytes:
    return make_sbom(SCAN, image_name="docbroker-server:latest", wheel_hashes=WHEELS)


def edited(change: Any) -> bytes:
    data = json.loads(sbom())
    change(data)
    return json.dumps(data).encode()


def component(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in data["components"] if c["name"] == name)


def set_property(item: dict[str, Any], name: str, value: str) -> None:
    next(p for p in item["properties"] if p["name"] == name)["value"] = value


def test_the_sbom_is_valid_cyclonedx_and_names_every_package() -> None:
    text = sbom()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text.decode()) is None
    data = json.loads(text)
    assert data["specVersion"] == "1.6"
    root = data["metadata"]["component"]
    assert (root["type"], root["name"], root["version"]) == (
        "container",
        "docbroker-server:latest",
        SCAN.image_id,
    )
    pydantic = component(data, "pydantic")
    assert pydantic["purl"] == "pkg:pypi/pydantic@2.14.4"
    assert pydantic["hashes"] == [{"alg": "SHA-256", "content": "33" * 32}]  # the wheel it came from
    assert {"name": "docbroker:record-sha256", "value": "11" * 32} in pydantic["properties"]
    assert "hashes" not in component(data, "typing_extensions")  # no single wheel known: no claim
    assert (
        component(data, "libc6")["purl"]
        == "pkg:deb/debian/libc6@2.36-9%2Bdeb12u9?arch=amd64&distro=debian-12"
    )
    assert component(data, "debian")["type"] == "operating-system"
    check_sbom(text, SCAN)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # a changed entry is two: the one the SBOM names, the one the image holds
        (lambda d: component(d, "pydantic").update(version="2.0.0"), "2 Python distribution and 0 Debian"),
        (lambda d: d["components"].remove(component(d, "typing_extensions")), "1 Python distribution"),
        (lambda d: set_property(component(d, "pydantic"), "docbroker:record-sha256", "44" * 32),
         "2 Python distribution"),
        (lambda d: component(d, "libc6").update(version="2.36-9+deb12u10"),
         "0 Python distribution and 2 Debian"),
        (lambda d: d["components"].remove(component(d, "python3.11")), "1 Debian package"),
        (lambda d: set_property(d["metadata"]["component"], "docbroker:image-id", OTHER),
         "describes another image"),
        (lambda d: set_property(d["metadata"]["component"], "docbroker:content-digest", OTHER),
         "content digest differs"),
        (lambda d: d.update(bomFormat="SPDX"), "not a CycloneDX document"),
        (lambda d: component(d, "libc6").update(purl="pkg:"), "malformed purl"),
    ],
)  # fmt: skip
def test_an_sbom_that_disagrees_with_the_image_is_refused(change: Any, message: str) -> None:
    with pytest.raises(SbomError, match=message) as caught:
        check_sbom(edited(change), SCAN)
    assert "pydantic" not in str(caught.value) and "libc6" not in str(caught.value)  # counts, not names


def test_a_package_added_to_the_image_but_not_to_the_sbom_is_caught() -> None:
    extra = PythonDist("evil", "0.0.1", "55" * 32, f"{SITE}/evil-0.0.1.dist-info")
    grown = ImageScan(**{**SCAN.__dict__, "python": (*SCAN.python, extra)})
    with pytest.raises(SbomError, match="1 Python distribution"):
        check_sbom(sbom(), grown)


def test_garbage_is_one_clear_error() -> None:
    with pytest.raises(SbomError, match="not JSON"):
        check_sbom(b"{", SCAN)
    with pytest.raises(SbomError, match="larger than"):
        check_sbom(b" " * (17 * 1024 * 1024), SCAN)


def test_wheel_hashes_name_only_the_one_wheel_of_a_version(tmp_path: Path) -> None:
    (tmp_path / "pydantic-2.14.4-py3-none-any.whl").write_bytes(b"wheel one")
    (tmp_path / "typing_extensions-4.16.0-py3-none-any.whl").write_bytes(b"a")
    (tmp_path / "typing_extensions-4.16.0-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"b")
    (tmp_path / "Not_A-wheel.txt").write_bytes(b"")
    assert wheel_hashes(tmp_path) == {("pydantic", "2.14.4"): hashlib.sha256(b"wheel one").hexdigest()}
