"""Fixtures for the live Kubernetes tests: the lab cluster `.ci/kube-lab.sh` runs, nothing mocked.

`./dev test` builds (cached) and starts a one-node v1.20.2 cluster and exports its `DIR/env`:
DOCBROKER_TEST_KUBECONFIG (an admin kubeconfig), DOCBROKER_TEST_KUBE_NODE_IP (where pods reach
the API server) and DOCBROKER_TEST_KUBE_LAB (the lab's folder). Without the kubeconfig these
tests FAIL, never skip: a cluster suite that skips is a suite that lies. By hand:

    bash .ci/kube-lab.sh build && bash .ci/kube-lab.sh start /tmp/kube-lab
    set -a && . /tmp/kube-lab/env && set +a

Every test gets a namespace of its own (`namespace`), deleted after it; cluster-scoped objects a
test makes are removed through `kube_cleanup`. The lab's own namespaces (`docbroker`,
`docbroker-tenants`) are shared: each file holds the lab lock shared while its tests run, and a
file that sets `ALONE_ON_THE_LAB = True` (an install from nothing, which deletes them) takes it
alone, through `lab_lock`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.testing.kubernetes_lab import Lab, unique_tenant

REPO = Path(__file__).resolve().parents[2]
KUBECONFIG_ENV = "DOCBROKER_TEST_KUBECONFIG"
LAB_SCRIPT = REPO / ".ci" / "kube-lab.sh"
# The lab installs the project's seccomp profiles under this folder of the kubelet's profile root.
SECCOMP_PREFIX = "docbroker/"


def kubeconfig_path() -> str:
    path = os.environ.get(KUBECONFIG_ENV, "").strip()
    if not path:
        pytest.fail(
            f"{KUBECONFIG_ENV} is not set: these tests need the lab cluster. `./dev test` starts it; "
            "by hand: bash .ci/kube-lab.sh build && bash .ci/kube-lab.sh start /tmp/kube-lab && "
            "set -a && . /tmp/kube-lab/env && set +a",
            pytrace=False,
        )
    if not Path(path).is_file():
        pytest.fail(f"{KUBECONFIG_ENV} names no file: is the lab cluster still running?", pytrace=False)
    return path


def lab_dir() -> Path:
    raw = os.environ.get("DOCBROKER_TEST_KUBE_LAB", "").strip()
    if not raw:
        pytest.fail("DOCBROKER_TEST_KUBE_LAB is not set (source the lab's DIR/env)", pytrace=False)
    return Path(raw)


@contextlib.contextmanager
def lab_lock(*, exclusive: bool) -> Iterator[None]:
    """The lab's namespaces: shared by the files that stand on them (both workers at once),
    alone for a test that deletes them. Held on a file in the lab's folder."""
    with (lab_dir() / "lab.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="module", autouse=True)
def _shares_the_lab(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each file's tests hold the lab lock shared (autouse: first among the module's fixtures,
    so before `lab` applies the namespaces). Without a lab there is nothing to share: the tests
    that need one fail on their own."""
    if getattr(request.module, "ALONE_ON_THE_LAB", False) or not os.environ.get("DOCBROKER_TEST_KUBE_LAB"):
        yield
        return
    with lab_lock(exclusive=False):
        yield


@pytest.fixture(scope="session")
def kube_api() -> Iterator[Any]:
    """An ApiClient for the lab's admin (system:masters), checked to answer."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=kubeconfig_path())
    try:
        client.VersionApi(api).get_code(_request_timeout=10)
    except Exception as exc:  # any failure to reach it is the same finding for the suite
        pytest.fail(f"the lab's API server does not answer: {type(exc).__name__}", pytrace=False)
    yield api
    api.close()


@pytest.fixture(scope="session")
def kube_dynamic(kube_api: Any) -> Any:
    """A discovery-based client: reaches APIs the current Python client dropped (policy/v1beta1)."""
    from kubernetes.dynamic import DynamicClient

    return DynamicClient(kube_api)


@pytest.fixture
def kube_cleanup() -> Iterator[Callable[[Callable[[], object]], None]]:
    """Register undo steps (run last-first after the test, each even if another fails)."""
    steps: list[Callable[[], object]] = []
    yield steps.append
    errors = []
    for step in reversed(steps):
        try:
            step()
        except Exception as exc:  # collect: one failing undo must not skip the others
            if getattr(exc, "status", None) != 404:
                errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture
def namespace(kube_api: Any, kube_cleanup: Callable[[Callable[[], object]], None]) -> str:
    """A fresh namespace for this test, deleted (with everything in it) after it."""
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    name = f"dbtest-{secrets.token_hex(4)}"
    core.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(name=name, labels={"app.kubernetes.io/part-of": "docbroker-tests"})
        )
    )
    kube_cleanup(lambda: core.delete_namespace(name, propagation_policy="Background", grace_period_seconds=0))
    return name


def wait_until(what: str, check: Callable[[], object], timeout: float = 60.0, every: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}", pytrace=False)
        time.sleep(every)


def load_image(image: str) -> str:
    """Import an image from the rootful Docker into the lab's containerd (`imagePullPolicy: Never`);
    returns the `name@sha256:…` a Pod names it by (tenant Pods must: never a tag)."""
    argv = ["bash", str(LAB_SCRIPT), "load-image", image]
    done = subprocess.run(argv, check=True, capture_output=True, timeout=300, text=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def lab() -> Lab:
    """The lab with what every Kubernetes test stands on applied (namespaces, RBAC, storage)."""
    return Lab.open()


@pytest.fixture
def tenant(lab: Lab) -> Iterator[str]:
    """A tenant of its own on the lab (its sources PVC holds the lab's default documents)."""
    name = unique_tenant()
    lab.tenant(name)
    yield name
    lab.drop_tenant(name)
