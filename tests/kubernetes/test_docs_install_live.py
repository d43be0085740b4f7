"""docs/kubernetes.md's install, followed on the lab as an operator would, from no namespace to
a first MCP call and an approved report (issue 38), with no step done by hand.

The shell lines of "Secrets", "Apply", "Storage", "Push a tenant's documents" and "Uninstall",
and the commands "Provision a tenant" names, are read from the page when the test runs and run
AS WRITTEN by bash: kubectl with the operator's `~/.kube/config` (a HOME of the run's own,
holding the lab admin's kubeconfig), in a folder holding a copy of the repository's `k8s/`.
Only `substitutions` change them, each for a reason the lab imposes; a line not run is in
`SKIPPED`, with why; the test fails when the page has a line in neither (or a substitution
matches nothing), so an edit of the page is noticed. "Database"'s SQL blocks make the two
roles on the run's own PostgreSQL, which offers TLS with a certificate for the address the
Pods reach it at, so the Secrets' URLs keep `sslmode=verify-full` and `db-ca.pem`.

What the page leaves to the operator are files: `k8s/overlays/mine` ("Your overlay": here the
lab overlay with this run's addresses, images by digest, issuer and the tenant's policy),
`issuer-jwks.json` (the test's identity provider), `db-ca.pem` (the CA of the run's database),
the tenant's documents. Then a real MCP SDK client at a broker Pod's address, with a token of
that issuer, searches and saves a report approved over REST on the other Pod: its bytes in the
tenant's reports volume are exactly the approved ones. The page's "Uninstall" ends it; what a
failure leaves is removed after it either way, the lab's namespaces included: the test runs
alone on the lab (`ALONE_ON_THE_LAB`, conftest.lab_lock).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from broker.testing import Broker, make_broker, structured
from broker.testing.kubernetes_lab import (
    KEEPER_IMAGE,
    ROOT,
    SERVER_IMAGE,
    STORAGE_CLASS,
    Lab,
    _kubectl,
)
from tests.broker.approvals.test_database_roles import SQL_BLOCKS, documented_roles
from tests.broker.pgtest import ThrowAwayCluster
from tests.docs.markdown import section, snippets
from tests.kubernetes.conftest import lab_lock, wait_until
from tests.kubernetes.test_deployment_live import (
    BROKER_NS,
    PODS,
    REPLICAS,
    TENANTS_NS,
    _env,
    broker_image,
    broker_settings,
    deployment_lock,
    postgres_for_pods,
    print_broker_logs,
    ready_broker_ips,
    readyz,
    save_approved,
)

pytestmark = [pytest.mark.kubernetes, pytest.mark.timeout(1800)]
ALONE_ON_THE_LAB = True  # it deletes the lab's namespaces: no other file may stand on them meanwhile

PAGE = ROOT / "docs" / "kubernetes.md"
TENANT = "acme"  # the page's own example; every other lab test makes tenants of random names
REPORT = "# Findings\n\nSaved on a cluster installed as docs/kubernetes.md says.\n"
DOCUMENT = "# Plan\nthe install follows the page line by line\n"

# The sections whose commands the install runs, in the order it runs them. True: the commands
# its prose names count too (a numbered list of steps), not only its code blocks.
SECTIONS = {
    "Secrets (after the namespaces, before the first apply)": False,
    "Apply": False,
    "Provision a tenant": True,
    "Storage": False,
    "Push a tenant's documents": False,
    "Uninstall": False,
}
DATABASE = "Database (PostgreSQL 15 or later)"
DOCTOR_IN_A_POD = "kubectl -n docbroker exec statefulset/docbroker-broker -- docbroker doctor"

# Commands of those sections the install does not run, and why.
SKIPPED = {
    "kubectl apply -k": "'Provision a tenant' step 1 names the Apply block's command, which runs",
    "docbroker tenant manifest <tenant> --storage-class <class> | kubectl apply -f -": (
        "the Storage block runs the same command, with each claim's class named"
    ),
    "docbroker tenant sources push <tenant> <folder>": "the block of 'Push a tenant's documents' runs it",
}


@dataclasses.dataclass(frozen=True)
class Database:
    host: str  # where the lab's Pods reach the host
    port: int


def substitutions(db: Database) -> list[tuple[str, str]]:
    """What must differ on the lab, and nothing else: (the page's text, this run's)."""
    return [
        # The run's own PostgreSQL, where the lab's Pods reach the host (it has no DNS name);
        # its certificate names that address, so `sslmode=verify-full` and `db-ca.pem` stay.
        ("db.example.com:5432", f"{db.host}:{db.port}"),
        # The lab's one storage class, of local volumes the test makes (it has no provisioner).
        (
            "--sources-storage-class gp3 --reports-storage-class gp3-retain",
            f"--sources-storage-class {STORAGE_CLASS} --reports-storage-class {STORAGE_CLASS}",
        ),
        # No registry: the images are imported into the lab's containerd, named by digest.
        ("registry.example.com/docbroker/docbroker-server@sha256:<digest>", SERVER_IMAGE),
        ("registry.example.com/docbroker/docbroker-broker@sha256:<digest>", KEEPER_IMAGE),
        # `[--json]`: the page's notation for an option; the run takes it, to read the result.
        ("./acme-docs [--json]", "./acme-docs --json"),
    ]


def commands(heading: str) -> list[str]:
    """The section's shell lines (a trailing `\\` joins the next) and, where SECTIONS says so,
    the commands its prose names."""
    lines = section(PAGE, heading)
    return [
        s.text
        for s in snippets(PAGE)
        if s.line in lines
        and s.text
        and (s.block or (SECTIONS[heading] and s.text.startswith(("docbroker ", "kubectl "))))
    ]


class Operator:
    """Runs the page's lines as an operator would: bash in `work`, `~/.kube/config` the lab
    admin's, `docbroker` this tree's CLI; records which lines ran and which substitutions
    were used."""

    def __init__(self, work: Path, lab: Lab | None, substitutions: list[tuple[str, str]]) -> None:
        self.work = work
        self.substitutions = substitutions
        self.ran: list[str] = []
        self.used: set[str] = set()
        home, bin_dir = work.parent / "home", work.parent / "bin"
        (home / ".kube").mkdir(parents=True)
        if lab is not None:  # None: an operator with no cluster yet (offline steps)
            shutil.copy(lab.kubeconfig, home / ".kube" / "config")  # its paths are absolute
        bin_dir.mkdir()
        # This tree's CLI and Python (a pyenv shim would look for its root under HOME).
        for name, line in (
            ("docbroker", f'PYTHONPATH={ROOT} exec {sys.executable} -m broker "$@"'),
            ("python3", f'exec {sys.executable} "$@"'),
        ):
            (bin_dir / name).write_text(f"#!/bin/sh\n{line}\n")
            (bin_dir / name).chmod(0o755)
        self.env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home), "LANG": "C.UTF-8"}

    def run(self, heading: str) -> str:
        lines = [line for line in commands(heading) if line not in SKIPPED]
        script = "\n".join(self._substituted(line) for line in lines)
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=1300,  # the Apply block's two waits, 600 s each at most
        )
        assert done.returncode == 0, f"{heading!r} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        self.ran.extend(lines)
        return done.stdout

    def line(self, command: str) -> subprocess.CompletedProcess[str]:
        """One command a page's prose names, as written (its exit code is the caller's to read)."""
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", self._substituted(command)],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return done

    def _substituted(self, line: str) -> str:
        for old, new in self.substitutions:
            if old in line:
                self.used.add(old)
                line = line.replace(old, new)
        return line


def certificate_authority(host: str) -> tuple[bytes, tuple[bytes, bytes]]:
    """A CA (PEM) and a server certificate and key it signed (PEM) for the IP address `host`."""
    now = datetime.datetime.now(datetime.UTC)

    def issue(subject: str, key: Any, issuer: x509.Name, signer: Any, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            ip = ipaddress.ip_address(host)
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ip)]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "docbroker test database CA")])
    ca = issue("docbroker test database CA", ca_key, ca_name, ca_key, ca=True)
    server = issue(host, server_key, ca_name, ca_key, ca=False)
    pem = serialization.Encoding.PEM
    key_pem = server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca.public_bytes(pem), (server.public_bytes(pem), key_pem)


def database_url_patch(kind: str, version: str, name: str, container: str, secret: str) -> dict[str, Any]:
    """The database URL from the page's Secret again (the lab overlay builds it from its
    ConfigMap for the CI's PostgreSQL, trusted and without TLS): a strategic merge patch."""
    url = {"secretKeyRef": {"name": secret, "key": "url"}}
    env = {"name": "DOCBROKER_DATABASE_URL", "value": None, "valueFrom": url}
    patch = {
        "apiVersion": version,
        "kind": kind,
        "metadata": {"name": name, "namespace": BROKER_NS},
        "spec": {"template": {"spec": {"containers": [{"name": container, "env": [env]}]}}},
    }
    return {"target": {"kind": kind, "name": name}, "patch": yaml.safe_dump(patch)}


def write_mine(work: Path, idp: Broker) -> Path:
    """`k8s/overlays/mine`, the operator's overlay ("Your overlay"): the lab overlay with this
    run's node address, the broker image by digest, the issuer, the tenant's policy ("Provision
    a tenant" step 1), ReadWriteOnce sources as the Storage block makes them, the operators'
    token file ("Secrets"), and the database URLs from the page's Secrets."""
    mine = work / "k8s" / "overlays" / "mine"
    (mine / "tenants").mkdir(parents=True)
    (mine / "tenants" / f"{TENANT}.toml").write_text("[limits]\nrate_per_minute = 120\n")
    name, digest = broker_image()
    settings = {**broker_settings(idp), "DOCBROKER_KUBE_SOURCES_ACCESS_MODE": "ReadWriteOnce"}
    merge = {"namespace": BROKER_NS, "behavior": "merge"}
    node_ip = _env("DOCBROKER_TEST_KUBE_NODE_IP")  # where Pods reach the API server (no kube-proxy)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../lab"],
        "images": [{"name": "docbroker-broker", "newName": name, "digest": digest}],
        "configMapGenerator": [
            {"name": "docbroker-lab", **merge, "literals": [f"node-ip={node_ip}"]},
            {"name": "docbroker-config", **merge, "literals": [f"{k}={v}" for k, v in settings.items()]},
            {"name": "docbroker-tenant-policies", **merge, "files": [f"tenants/{TENANT}.toml"]},
        ],
        "patches": [
            database_url_patch("StatefulSet", "apps/v1", "docbroker-broker", "broker", "docbroker-database"),
            database_url_patch(
                "Job", "batch/v1", "docbroker-db-upgrade", "db-upgrade", "docbroker-database-migrate"
            ),
        ],
    }
    (mine / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return mine


def remove_install(lab: Lab, mine: Path) -> None:
    """Everything the install makes, gone: what the overlay renders (the namespaces with all in
    them, the cluster-scoped objects), the replicas' and the tenant's volumes."""
    rendered = [d for d in yaml.safe_load_all(_kubectl(lab.kubeconfig, "kustomize", str(mine))) if d]
    delete = ("delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=300s")
    _kubectl(lab.kubeconfig, *delete, stdin=yaml.safe_dump_all(rendered))
    lab.drop_broker_volumes(REPLICAS)
    lab.drop_tenant(TENANT)


@dataclasses.dataclass
class Install:
    lab: Lab
    operator: Operator
    idp: Broker
    db: ThrowAwayCluster


@pytest.fixture
def install(tmp_path: Path) -> Iterator[Install]:
    lab = Lab.connect()  # nothing applied: the page's first line makes the namespaces
    with lab_lock(exclusive=True), deployment_lock(lab.folder):
        work = tmp_path / "work"
        work.mkdir()
        shutil.copytree(ROOT / "k8s", work / "k8s")
        idp = make_broker(tmp_path / "idp", tenants=[TENANT])  # never started: its keys and JWKS
        mine = write_mine(work, idp)
        remove_install(lab, mine)  # from nothing: what an earlier test or run left, gone
        host = _env("DOCBROKER_TEST_KUBE_HOST_IP")
        ca, server = certificate_authority(host)
        # The two roles of "Database" log in with the page's passwords, over TLS only.
        hba = f"hostssl docbroker docbroker_owner,docbroker_app {PODS} scram-sha-256"
        cluster, port = postgres_for_pods(host, hba=hba, tls=server)
        try:
            (work / "db-ca.pem").write_bytes(ca)
            shutil.copy(tmp_path / "idp" / "jwks.json", work / "issuer-jwks.json")
            (work / "acme-docs").mkdir()
            (work / "acme-docs" / "plan.md").write_text(DOCUMENT)
            yield Install(lab, Operator(work, lab, substitutions(Database(host, port))), idp, cluster)
        finally:
            print_broker_logs(lab)
            try:
                remove_install(lab, mine)
            finally:
                cluster.remove()


def test_the_page_s_commands_are_the_ones_the_install_runs_or_skips() -> None:
    """Offline, and the live test again at its end: every command of the sections is run or
    skipped with a reason, and every substitution and skip still matches the page."""
    on_page = [line for heading in SECTIONS for line in commands(heading)]
    assert on_page, "no commands found: were the sections renamed?"
    gone = set(SKIPPED) - set(on_page)
    assert not gone, f"skips for lines the page no longer has: {gone}"
    for old, _ in substitutions(Database("10.0.0.1", 5432)):
        assert any(old in line for line in on_page), f"a substitution the page no longer needs: {old!r}"
    prose = {s.text for s in snippets(PAGE) if not s.block}
    assert DOCTOR_IN_A_POD in prose, "the page no longer says to run doctor in a broker Pod"
    sql = [s.text for s in snippets(PAGE) if s.block and s.line in section(PAGE, DATABASE)]
    firsts = [line for line in sql if line.startswith("-- as ")]  # each block's first line
    assert len(firsts) == len(SQL_BLOCKS), f"Database has blocks documented_roles does not run: {firsts}"
    assert all(line.startswith(first) for line, first in zip(firsts, SQL_BLOCKS, strict=True))


def test_the_documented_install_serves_a_first_call_and_an_approved_report(install: Install) -> None:
    lab, operator, idp = install.lab, install.operator, install.idp
    for ns in (BROKER_NS, TENANTS_NS):
        found = lab.core.list_namespace(field_selector=f"metadata.name={ns}").items
        assert found == [], f"{ns} exists before the install"

    # "Database", its blocks as written: the administrator's, then the owner's, each connected
    # by the server's socket (their `psql` comments name db.example.com: the connection is the
    # administrator's own business, the install's are the URLs below).
    documented_roles(install.db)
    operator.run("Secrets (after the namespaces, before the first apply)")
    lab.broker_volumes(REPLICAS)  # the claims' class has no provisioner on the lab: local volumes
    applied = operator.run("Apply")
    assert applied.count("Running") == REPLICAS, applied
    storage, _ = lab.tenant_volumes(TENANT, {}, sources_access_mode="ReadWriteOnce")
    operator.run("Provision a tenant")  # what its prose names is run below or skipped
    operator.run("Storage")
    pushed = json.loads(operator.run("Push a tenant's documents"))
    assert pushed["tenant"] == TENANT and pushed["documents"] == 1, pushed

    # "Apply" and the managed path's step 6: `docbroker doctor` in a broker Pod, with the
    # brokers' own settings and account, as the page says to run it.
    doctor = operator.line(f"{DOCTOR_IN_A_POD} --json")
    rows = {row["check"]: row for row in json.loads(doctor.stdout)["checks"]}
    assert doctor.returncode == 0, (doctor.stderr[-1500:], rows)
    assert rows["kubernetes api"]["level"] == rows["rbac needed"]["level"] == "OK", rows
    for check in ("namespaces", "network policies"):  # the brokers' account may not read them
        assert rows[check]["level"] == "WARN" and "may not read" in rows[check]["detail"], rows

    ips = ready_broker_ips(lab)
    assert len(ips) == REPLICAS
    ops = dataclasses.replace(idp, ops_token=(operator.work / "ops.token").read_text().strip())
    check = wait_until("/readyz with the ops token", lambda: readyz(ips[0], ops), timeout=60)
    assert check["checks"]["sandboxes"]["backend"] == "kubernetes", check
    a, b = (dataclasses.replace(idp, url=f"http://{ip}:8000") for ip in ips)
    writer = a.token(TENANT, subject="alice", scope="docs:read docs:write")
    approver = b.token(TENANT, subject="bob", scope="reports:approve")

    async def first_calls() -> tuple[dict[str, Any], dict[str, Any]]:
        async with a.client(writer) as client:
            found = structured(await client.call_tool("search_documents", {"query": "line by line"}))
            saved = await save_approved(client, b, approver, "findings.md", REPORT)
        return found, saved

    found, saved = asyncio.run(first_calls())
    assert found["status"] == "ok" and "plan.md" in str(found["data"]), found
    assert saved["status"] == "ok", saved
    assert (storage / "reports" / "findings.md").read_bytes() == REPORT.encode()
    # The brokers reached the database as the page's URL says: the app role, over verified TLS.
    with psycopg.connect(install.db.url, autocommit=True) as conn:
        sessions = conn.execute(
            "SELECT a.usename, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)"
            " WHERE a.datname = 'docbroker' AND a.backend_type = 'client backend'"
        ).fetchall()
    assert sessions and set(sessions) == {("docbroker_app", True)}, sessions

    operator.run("Uninstall")
    for ns in (BROKER_NS, TENANTS_NS):
        assert lab.core.list_namespace(field_selector=f"metadata.name={ns}").items == []
    # Every command of the sections ran, or is skipped with a reason; every substitution was needed.
    on_page = [line for heading in SECTIONS for line in commands(heading)]
    assert sorted(operator.ran + list(SKIPPED)) == sorted(on_page)
    assert operator.used == {old for old, _ in operator.substitutions}
