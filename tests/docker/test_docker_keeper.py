"""The reports keeper's two-uid design, in live containers laid out like the tenant Pod.

A server container (uid 10001, the server image, seccomp-tcp.json) and a keeper container
(uid 10002 with the Pod's group 10001, the broker image, this checkout's code mounted over the
image's) share one drop-box folder and one network namespace, as the two containers of a Pod
do; only the keeper mounts the reports folder and holds the keeper key. Rootful daemon only:
the uids here are the host's (the Kubernetes tests prove the same in a real Pod).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.docker.conftest import IMAGE, PYTHON, REPO, docker_hosts

pytestmark = pytest.mark.docker

BROKER_IMAGE = os.environ.get("DOCBROKER_TEST_BROKER_IMAGE", "docbroker-broker:latest")
SERVER_UID, KEEPER_UID, POD_GID = 10001, 10002, 10001
APPROVED = b"# Q3\napproved\n"


@dataclass
class Pod:
    client: Any
    keeper: Any
    root: Path
    key: str

    @property
    def dropbox(self) -> Path:
        return self.root / "box" / "reports"  # a folder of the emptyDir ("box"), as in the Pod

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def server(self, code: str, *args: str) -> dict[str, Any]:
        """Run `code` as the server container would: uid 10001, no reports, the keeper's netns."""
        out = self.client.containers.run(
            IMAGE,
            entrypoint=[PYTHON, "-c", code, *args],
            user=f"{SERVER_UID}:{POD_GID}",
            cap_drop=["ALL"],
            security_opt=[
                "no-new-privileges:true",
                f"seccomp={(REPO / 'policies' / 'seccomp-tcp.json').read_text()}",
            ],
            read_only=True,
            network_mode=f"container:{self.keeper.id}",
            volumes={str(self.dropbox): {"bind": "/srv/docs/reports", "mode": "rw"}},
            remove=True,
        )
        return dict(json.loads(out.decode().strip().splitlines()[-1]))


def _rootful_host() -> str:
    import docker

    for host in docker_hosts():
        client = docker.DockerClient(base_url=host)
        try:
            options = client.info().get("SecurityOptions") or []
        finally:
            client.close()
        if not any("name=rootless" in str(o) for o in options):
            return host
    pytest.fail("no rootful Docker daemon in DOCBROKER_TEST_DOCKER_HOSTS: the keeper's uids need one")


@pytest.fixture
def pod() -> Iterator[Pod]:
    import docker

    client = docker.DockerClient(base_url=_rootful_host())
    root = Path(tempfile.mkdtemp(prefix="docbroker-keeper-", dir="/var/tmp"))
    root.chmod(0o755)
    code = root / "code"
    for package in ("server", "broker"):
        shutil.copytree(REPO / package, code / package, ignore=shutil.ignore_patterns("__pycache__"))
    for path in (code, *code.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    # As the Pod's keeper hook makes them: the drop-box the keeper's, 1733; reports the keeper's only.
    for name, mode in (("box", 0o700), ("box/reports", 0o1733), ("reports", 0o700)):
        (root / name).mkdir()
        os.chown(root / name, KEEPER_UID, POD_GID)
        (root / name).chmod(mode)
    key = secrets.token_hex(32)
    key_file = root / "keeper.key"
    key_file.write_text(key)
    os.chown(key_file, KEEPER_UID, KEEPER_UID)
    key_file.chmod(0o400)
    keeper = client.containers.run(
        BROKER_IMAGE,
        entrypoint=[PYTHON, "-m", "broker.keeper", "--http", "0.0.0.0:8081"],
        user=f"{KEEPER_UID}:{KEEPER_UID}",
        group_add=[str(POD_GID)],
        environment={
            "PYTHONPATH": "/opt/src",
            "KEEPER_DROPBOX": "/dropbox/reports",
            "KEEPER_REPORTS": "/reports",
            "KEEPER_KEY_FILE": "/run/secrets/keeper/keeper.key",
        },
        volumes={
            str(code): {"bind": "/opt/src", "mode": "ro"},
            str(root / "box"): {"bind": "/dropbox", "mode": "rw"},
            str(root / "reports"): {"bind": "/reports", "mode": "rw"},
            str(key_file): {"bind": "/run/secrets/keeper/keeper.key", "mode": "ro"},
        },
        cap_drop=["ALL"],
        security_opt=["no-new-privileges:true"],
        read_only=True,
        labels={"io.docbroker.test": "keeper"},
        detach=True,
    )
    try:
        made = Pod(client=client, keeper=keeper, root=root, key=key)
        deadline = time.monotonic() + 30
        while made.server(PROBE_KEEPER, "", "/v1/sweep", '{"reason": "dropbox_at_startup"}')["status"] != 401:
            assert time.monotonic() < deadline, keeper.logs().decode()
            time.sleep(0.3)
        yield made
    finally:
        keeper.remove(force=True)
        client.close()
        shutil.rmtree(root, ignore_errors=True)


# Run inside the server container: one POST to the keeper on the Pod's loopback.
PROBE_KEEPER = r"""
import json, sys, urllib.request, urllib.error
key, path, body = sys.argv[1:4]
headers = {"content-type": "application/json"}
if key:
    headers["authorization"] = "Bearer " + key
request = urllib.request.Request("http://127.0.0.1:8081" + path, data=body.encode(), headers=headers)
try:
    with urllib.request.urlopen(request, timeout=5) as response:
        print(json.dumps({"status": response.status, "body": response.read().decode()}))
except urllib.error.HTTPError as exc:
    print(json.dumps({"status": exc.code, "body": exc.read().decode()}))
except OSError as exc:
    print(json.dumps({"status": 0, "body": type(exc).__name__}))
"""

DROP = r"""
import errno, json, os, sys
D = "/srv/docs/reports/"
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
def create():
    fd = os.open(D + sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o040)
    os.write(fd, sys.argv[2].encode()); os.close(fd)
print(json.dumps({
    "create": attempt(create),
    "list": attempt(lambda: os.listdir(D)),
    "read": attempt(lambda: open(D + sys.argv[1], "rb").read()),
    "reports_mounted": any(os.path.exists(p) for p in ("/reports", "/srv/reports", "/dropbox")),
    "keeper_key_visible": os.path.exists("/run/secrets/keeper"),
}))
"""


def keeper_call(pod: Pod, path: str, body: dict[str, str], key: str) -> dict[str, Any]:
    return pod.server(PROBE_KEEPER, key, path, json.dumps(body))


def test_what_the_server_drops_is_accepted_by_the_keeper_only(pod: Pod) -> None:
    facts = pod.server(DROP, "q3.md", APPROVED.decode())
    assert facts == {
        "create": "ok",
        "list": "EACCES",
        "read": "EACCES",  # mode 0o040: not even its own file
        "reports_mounted": False,
        "keeper_key_visible": False,
    }
    sha = hashlib.sha256(APPROVED).hexdigest()
    answer = keeper_call(pod, "/v1/accept", {"name": "q3.md", "sha256": sha}, pod.key)  # as the broker
    assert answer == {"status": 200, "body": '{"accepted":"ok"}'}
    report = pod.reports / "q3.md"
    assert report.read_bytes() == APPROVED
    assert (report.stat().st_uid, report.stat().st_mode & 0o777) == (KEEPER_UID, 0o600)
    assert os.listdir(pod.dropbox) == []


def test_other_bytes_than_approved_are_caught(pod: Pod) -> None:
    pod.server(DROP, "q3.md", "what the sandbox wrote instead")
    sha = hashlib.sha256(APPROVED).hexdigest()
    answer = keeper_call(pod, "/v1/accept", {"name": "q3.md", "sha256": sha}, pod.key)
    assert answer == {"status": 200, "body": '{"accepted":"content_mismatch"}'}
    assert not (pod.reports / "q3.md").exists()
    assert os.listdir(pod.dropbox) == [], pod.keeper.logs().decode()
    assert len(os.listdir(pod.root / "box" / "quarantine")) == 1
    assert os.listdir(pod.reports) == []


def test_the_server_cannot_call_the_keeper(pod: Pod) -> None:
    """It shares the Pod's network, so it reaches the port; without the keeper key, nothing."""
    pod.server(DROP, "q3.md", APPROVED.decode())
    sha = hashlib.sha256(APPROVED).hexdigest()
    for key in ("", secrets.token_hex(32)):
        for path, body in (
            ("/v1/accept", {"name": "q3.md", "sha256": sha}),
            ("/v1/sweep", {"reason": "dropbox_before_save"}),
            ("/v1/exists", {"name": "q3.md"}),
        ):
            assert keeper_call(pod, path, body, key) == {"status": 401, "body": ""}
    assert os.listdir(pod.dropbox) == ["q3.md"]
    assert os.listdir(pod.reports) == []
