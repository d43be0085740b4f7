"""The broker image carries no test harness (issue 24, item 26; the wheel's side is
tests/broker/test_packaging.py): `broker.testing` mints tokens with a key of its own and
starts subprocesses, and has no business on a production import path. The images are the
ones `.ci/docker.sh` builds from this checkout (`python -m broker.cli.build_images server broker`)."""

from __future__ import annotations

import json
import os

import pytest

from tests.docker.conftest import PYTHON, docker_hosts

pytestmark = pytest.mark.docker

BROKER_IMAGE = os.environ.get("DOCBROKER_TEST_BROKER_IMAGE", "docbroker-broker:latest")
PROBE = (
    "import importlib.util, json; "
    "print(json.dumps({m: importlib.util.find_spec(m) is not None "
    "for m in ('broker.testing', 'broker.cli', 'broker.keeper')}))"
)


def test_the_broker_image_has_no_test_harness() -> None:
    import docker

    client = docker.DockerClient(base_url=docker_hosts()[0])  # the rootful daemon builds it
    try:
        out = client.containers.run(BROKER_IMAGE, entrypoint=[PYTHON, "-c", PROBE], remove=True)
    finally:
        client.close()
    found = json.loads(out.decode().strip().splitlines()[-1])
    assert found == {"broker.testing": False, "broker.cli": True, "broker.keeper": True}
