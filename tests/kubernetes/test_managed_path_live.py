"""docs/kubernetes.md, "A managed cluster, step by step": every command it gives, run.

Each command of the section is in `STEPS` with how this suite runs it: here, as written, on the
lab (`lab`) or offline (`offline`); or by the test file that runs the same command on the lab
(`elsewhere`); or not at all, with the reason (`not_here`: what the lab lacks). The first test
holds the table and the section to each other: a command added to the doc and not to the table,
or one the doc dropped, fails it. The substitutions the lab needs (its kubeconfig, a tenant
name, its storage class) are the `<…>` placeholders the doc itself marks, and the `example`
values the doc tells the reader to replace.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from broker.testing import ROOT
from broker.testing.kubernetes_lab import STORAGE_CLASS, Lab, _kubectl, unique_tenant
from tests.docs.markdown import section, snippets
from tests.kubernetes.test_deployment_live import deployment_lock
from tests.kubernetes.test_docs_install_live import Operator

pytestmark = [pytest.mark.kubernetes, pytest.mark.timeout(300)]
PAGE = ROOT / "docs" / "kubernetes.md"
HEADING = "A managed cluster, step by step"
# A command a reader types: the program first (after any VAR=value), then a space or the end.
_COMMAND = re.compile(r"^(\w+=\S+ )*(kubectl|docbroker|docker|cp|curl|for|done)( |$)")


@dataclass(frozen=True)
class Step:
    how: str  # lab | offline | elsewhere | not_here
    why: str  # lab, offline: the test here; elsewhere: the test file; not_here: what is missing
    runs: str = ""  # elsewhere: the text in that file that runs the command


STEPS: dict[str, Step] = {
    # 1. Images
    "docbroker image build": Step(
        "elsewhere", "tests/docker/test_image_supply.py", '"image", "build", "server", "--sign-key"'
    ),
    "docker tag": Step("not_here", "no registry on this offline machine to tag for"),
    "docker push": Step("not_here", "no registry on this offline machine to push to"),
    # 2. The overlay copied, its example values replaced, rendered
    "cp -r k8s/overlays/managed k8s/overlays/mine": Step("offline", "test_the_copied_overlay_renders"),
    "kubectl get endpoints kubernetes -n default -o wide": Step("lab", "test_the_api_server_endpoints"),
    # 4. Namespaces, then the registry's credentials in both
    "kubectl apply -f k8s/base/namespaces.yaml": Step("lab", "test_namespaces_then_pull_secrets"),
    "for ns in docbroker docbroker-tenants; do": Step("lab", "test_namespaces_then_pull_secrets"),
    "kubectl -n $ns create secret docker-registry registry-credentials "
    "--docker-server=registry.example.com --docker-username=USER --docker-password=TOKEN": Step(
        "lab", "test_namespaces_then_pull_secrets"
    ),
    "done": Step("lab", "test_namespaces_then_pull_secrets"),
    # 5. Apply: the managed overlay is for Kubernetes 1.25+ (policy/v1, Pod Security Admission);
    # the lab is 1.20. The same apply of the lab overlay, Job and StatefulSet included, runs there.
    "kubectl apply -k k8s/overlays/mine": Step(
        "elsewhere", "tests/kubernetes/test_docs_install_live.py", 'operator.run("Apply")'
    ),
    # 6. Check
    "kubectl -n docbroker exec statefulset/docbroker-broker -- docbroker doctor": Step(
        "elsewhere", "tests/kubernetes/test_docs_install_live.py", 'operator.line(f"{DOCTOR_IN_A_POD}'
    ),
    "docbroker doctor": Step(
        "elsewhere", "tests/kubernetes/test_network_doctor_live.py", "_network_policies(lab.admin, NS)"
    ),
    "curl -s https://docbroker.example.com/readyz": Step(
        "not_here", "no ingress controller or certificate here; /readyz at a Pod: test_deployment_live.py"
    ),
    # 7. Tenants
    "docbroker tenant manifest <tenant> --sources-storage-class <class> --reports-storage-class <class> "
    "--sources-access-mode ReadWriteOnce "
    "| kubectl apply -f -": Step("lab", "test_tenant_manifest_with_two_classes"),
    "docbroker tenant sources push": Step(
        "elsewhere", "tests/kubernetes/test_sources_push.py", '"tenant", "sources", "push"'
    ),
}


def commands() -> list[str]:
    lines = section(PAGE, HEADING)
    found = (s.text for s in snippets(PAGE) if s.line in lines and _COMMAND.match(s.text))
    return [" ".join(text.split()) for text in found]


def shell_block() -> str:
    """The section's one shell block, as a reader pastes it."""
    lines = section(PAGE, HEADING)
    return "\n".join(s.text for s in snippets(PAGE) if s.block and s.line in lines) + "\n"


def operator(tmp_path: Path, lab: Lab | None) -> Operator:
    """An operator (the install test's: bash, `~/.kube/config` the lab admin's, this tree's
    `docbroker`) in a reader's checkout: the k8s/ tree the commands name."""
    work = tmp_path / "work"
    shutil.copytree(ROOT / "k8s", work / "k8s")
    return Operator(work, lab, [])


def run(operator: Operator, command: str) -> str:
    done = operator.line(command)
    assert done.returncode == 0, f"{command[:80]!r}: {done.stderr[-1500:]}"
    return done.stdout


def test_the_table_is_the_sections_commands() -> None:
    found = commands()
    assert sorted(set(found)) == sorted(STEPS), (
        f"commands in docs/kubernetes.md {HEADING!r} and this file's STEPS differ: "
        f"not in STEPS {sorted(set(found) - set(STEPS))}, gone from the doc {sorted(set(STEPS) - set(found))}"
    )
    here = Path(__file__).read_text(encoding="utf-8")
    for command, step in STEPS.items():
        assert step.how in {"lab", "offline", "elsewhere", "not_here"}, command
        if step.how in {"lab", "offline"}:
            assert f"def {step.why}(" in here, f"{command!r}: no test {step.why}"
        if step.how == "elsewhere":
            assert (ROOT / step.why).is_file(), f"{command!r}: {step.why} does not exist"
            assert step.runs and step.runs in (ROOT / step.why).read_text(encoding="utf-8"), (
                f"{step.why} does not run {command!r} (no {step.runs!r} there)"
            )


# The `example` values step 2 tells the reader to replace, by file: a lab's own.
REPLACE = {
    "kustomization.yaml": {
        "registry.example.com/docbroker/": "registry.lab.invalid/docbroker/",
        "https://docbroker.example.com": "https://docbroker.lab.invalid",
        "https://login.example.com": "https://login.lab.invalid",
    },
    "ingress.yaml": {"docbroker.example.com": "docbroker.lab.invalid"},
    "network.yaml": {"172.16.0.2/32": "10.244.77.1/32", "10.20.0.15/32": "10.244.76.1/32"},
}


def test_the_copied_overlay_renders(tmp_path: Path) -> None:
    """Step 2: the copy, as written; every `example` mark is in a file the step names; with them
    replaced the overlay renders, and nothing marked example is left but what the step allows
    (the certificate issuer's name, the provider's address: both named in the step)."""
    offline = operator(tmp_path, None)
    run(offline, next(c for c in STEPS if c.startswith("cp ")))
    mine = offline.work / "k8s" / "overlays" / "mine"
    marked = {f.name for f in mine.rglob("*.yaml") if "# example" in f.read_text(encoding="utf-8")}
    step_two = PAGE.read_text(encoding="utf-8").split("2. **Copy the overlay**")[1].split("3. **")[0]
    for name in marked:
        assert f"`{name}`" in step_two, f"{name} holds example values that step 2 does not name"
    for name, pairs in REPLACE.items():
        path = mine / name
        text = path.read_text(encoding="utf-8")
        for old, new in pairs.items():
            assert old in text, f"{name}: {old!r} is no longer the example value"
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
    rendered = run(offline, "kubectl kustomize k8s/overlays/mine")
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert {d["kind"] for d in docs} >= {"StatefulSet", "Job", "Ingress", "NetworkPolicy"}
    assert "example.com" not in rendered.replace("registry.example.com", "")  # only step 4's registry


def test_the_api_server_endpoints(lab: Lab, tmp_path: Path) -> None:
    """Step 2's way to find the API server's address and port, on the lab: the node's address."""
    out = run(operator(tmp_path, lab), next(c for c in STEPS if c.startswith("kubectl get endpoints")))
    node_ip = os.environ["DOCBROKER_TEST_KUBE_NODE_IP"]
    assert re.search(rf"\b{re.escape(node_ip)}:\d+", out), out


@pytest.fixture
def pull_secrets_removed(lab: Lab) -> Iterator[None]:
    yield
    for ns in ("docbroker", "docbroker-tenants"):
        _kubectl(lab.kubeconfig, "-n", ns, "delete", "secret", "registry-credentials", "--ignore-not-found")


def test_namespaces_then_pull_secrets(lab: Lab, tmp_path: Path, pull_secrets_removed: None) -> None:
    """Step 4's block as written: the namespaces, then the registry's credentials in both, of the
    name the overlay's service accounts pull with."""
    with deployment_lock(lab.folder):  # the namespaces are the lab's one pair
        run(operator(tmp_path, lab), shell_block())
        for ns in ("docbroker", "docbroker-tenants"):
            secret = lab.core.read_namespaced_secret("registry-credentials", ns)
            assert secret.type == "kubernetes.io/dockerconfigjson"
            namespace = lab.core.read_namespace(ns)
            assert namespace.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    pulls = (ROOT / "k8s/overlays/managed/pull-secrets.yaml").read_text(encoding="utf-8")
    assert "registry-credentials" in pulls


def test_tenant_manifest_with_two_classes(lab: Lab, tmp_path: Path) -> None:
    """Step 7's manifest, as written with the doc's placeholders filled: two claims, each of its
    class, the sources `ReadWriteOnce` as the managed overlay's brokers expect."""
    tenant = unique_tenant("m")
    command = next(c for c in STEPS if c.startswith("docbroker tenant manifest"))
    command = command.replace("<tenant>", tenant).replace("<class>", STORAGE_CLASS)
    try:
        run(operator(tmp_path, lab), command)
        claims = {
            c.metadata.name: c
            for c in lab.core.list_namespaced_persistent_volume_claim("docbroker-tenants").items
            if tenant in c.metadata.name
        }
        sources = claims[f"docbroker-tenant-{tenant}-sources"]
        reports = claims[f"docbroker-tenant-{tenant}-reports"]
        assert sources.spec.storage_class_name == reports.spec.storage_class_name == STORAGE_CLASS
        managed = (ROOT / "k8s/overlays/managed/kustomization.yaml").read_text(encoding="utf-8")
        assert "DOCBROKER_KUBE_SOURCES_ACCESS_MODE=ReadWriteOnce" in managed
        assert sources.spec.access_modes == ["ReadWriteOnce"]
    finally:
        claims = ("-l", f"docbroker.io/tenant={tenant}")
        _kubectl(lab.kubeconfig, "-n", "docbroker-tenants", "delete", "pvc", *claims)
