"""The whole path on the lab cluster: a real MCP SDK client, a real broker process with
DOCBROKER_RUNTIME=kubernetes and the broker ServiceAccount's own token, real tenant Pods.

The broker runs on the host and reaches each tenant Pod at its pod IP over the lab's bridge,
as a broker Pod would (the lab has no kube-proxy; NetworkPolicy is not enforced there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp.shared.exceptions import MCPError

from broker.runtime.kubernetes import names
from broker.testing import Broker, structured
from broker.testing.kubernetes_lab import Lab, host_broker, unique_tenant
from tests.kubernetes.test_deployment_live import save_approved

pytestmark = pytest.mark.kubernetes
NS = names.TENANTS_NAMESPACE
REPORT = "# Summary\n\nApproved by a human, kept by the keeper.\n"


@pytest.fixture
def setup(lab: Lab) -> Iterator[tuple[str, Path, Path]]:
    tenant = unique_tenant("b")
    storage = lab.tenant(tenant, {"notes.md": "# Notes\nthe broker on a cluster keeps tenants apart\n"})
    base = Path(tempfile.mkdtemp(prefix="docbroker-kube-"))
    try:
        yield tenant, storage, base
    finally:
        lab.drop_tenant(tenant)
        shutil.rmtree(base, ignore_errors=True)


def start(broker: Broker) -> Broker:
    try:
        broker.start()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    return broker


def audit(broker: Broker, event: str) -> list[dict[str, object]]:
    """The replica's audit lines of one event (its own file: audit-<replica id>.jsonl)."""
    lines = []
    for path in sorted(broker.data_dir.glob("audit-*.jsonl")):
        if "witness" not in path.name:
            lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in lines if e.get("event") == event]


def tenant_pods(lab: Lab, tenant: str) -> list[str]:
    return [
        p.metadata.uid
        for p in lab.core.list_namespaced_pod(NS, label_selector=f"{names.TENANT}={tenant}").items
    ]


def test_search_read_and_an_approved_save_through_the_broker(lab: Lab, setup: tuple[str, Path, Path]) -> None:
    tenant, storage, base = setup
    broker = start(host_broker(lab, base, [tenant]))
    try:
        writer = broker.token(tenant, subject="alice", scope="docs:read docs:write")
        approver = broker.token(tenant, subject="bob", scope="reports:approve")

        async def run() -> dict[str, dict[str, object]]:
            async with broker.client(writer) as client:
                found = structured(await client.call_tool("search_documents", {"query": "tenants apart"}))
                read = structured(await client.call_tool("read_document", {"filename": "notes.md"}))
                saved = await save_approved(client, broker, approver, "summary.md", REPORT)
            return {"found": found, "read": read, "saved": saved}

        facts = asyncio.run(run())
        with broker.http() as http:
            ready = http.get("/readyz", headers=broker.ops_headers).json()
    finally:
        broker.stop()
    assert facts["found"]["status"] == "ok" and "notes.md" in str(facts["found"]["data"])
    assert facts["read"]["status"] == "ok"
    assert facts["saved"]["status"] == "ok", facts["saved"]
    # What lands in the reports PVC is exactly what was approved; the drop-box ends empty.
    assert (storage / "reports" / "summary.md").read_bytes() == REPORT.encode()
    sandboxes = ready["checks"]["sandboxes"]
    assert sandboxes["backend"] == "kubernetes" and sandboxes["seccomp_fallback"] is False
    started = audit(broker, "sandbox.started")
    assert [e["tenant"] for e in started] == [tenant]
    assert len(tenant_pods(lab, tenant)) == 1


def test_two_broker_replicas_share_the_tenant_pod(lab: Lab, setup: tuple[str, Path, Path]) -> None:
    tenant, _, base = setup
    a = start(host_broker(lab, base / "a", [tenant], replica="a"))
    master = a.data_dir / "master.key"
    b = start(host_broker(lab, base / "b", [tenant], replica="b", master=master))
    try:

        async def search(broker: Broker) -> str:
            async with broker.client(broker.token(tenant, scope="docs:read")) as client:
                result = structured(await client.call_tool("search_documents", {"query": "cluster"}))
            return str(result["status"])

        async def both() -> list[str]:
            return list(await asyncio.gather(search(a), search(b)))

        statuses = asyncio.run(both())
        again = asyncio.run(both())
    finally:
        a.stop()
        b.stop()
    assert statuses == ["ok", "ok"] and again == ["ok", "ok"]
    pods = tenant_pods(lab, tenant)
    assert len(pods) == 1  # one Pod for the tenant, whichever replica started it
    started = [e for br in (a, b) for e in audit(br, "sandbox.started")]
    assert len(started) == 1  # the other replica adopted it (adoption is not a start)


def test_a_pod_killed_mid_use_gives_a_clean_error_and_the_next_call_a_new_pod(
    lab: Lab, setup: tuple[str, Path, Path]
) -> None:
    tenant, _, base = setup
    broker = start(host_broker(lab, base, [tenant]))
    try:
        token = broker.token(tenant, scope="docs:read")

        async def run() -> tuple[str, list[str], float, str, str]:
            async with broker.client(token) as client:
                first = structured(await client.call_tool("search_documents", {"query": "cluster"}))
                assert first["status"] == "ok"
                [old] = tenant_pods(lab, tenant)
                # a real kill: the kubelet stops the containers, then the object goes
                lab.core.delete_namespaced_pod(names.object_name(tenant), NS, grace_period_seconds=1)
                started = time.monotonic()
                outcomes = []
                for _ in range(2):
                    try:
                        result = structured(await client.call_tool("search_documents", {"query": "cluster"}))
                        outcomes.append(str(result["status"]))
                    except MCPError as exc:  # the broker's error answer, as the SDK raises it
                        outcomes.append(f"MCPError: {exc}")
                elapsed = time.monotonic() - started
                deadline = time.monotonic() + 60
                while old in tenant_pods(lab, tenant):  # the kubelet has stopped it: the object goes
                    assert time.monotonic() < deadline, "the killed pod never went"
                    await asyncio.sleep(0.2)
                try:  # the broker may still hold the dead Pod's address: one clean error at most
                    result = structured(await client.call_tool("search_documents", {"query": "cluster"}))
                    outcomes.append(str(result["status"]))
                except MCPError as exc:
                    outcomes.append(f"MCPError: {exc}")
                last = structured(await client.call_tool("read_document", {"filename": "notes.md"}))
            [new] = tenant_pods(lab, tenant)
            return old, outcomes, elapsed, str(last["status"]), new

        old, outcomes, elapsed, last, new = asyncio.run(run())
        logs = broker.logs()
    finally:
        broker.stop()
    assert "Traceback" not in logs
    # during the kill and just after: answered by the old Pod, or a clean error answer
    clean = ("ok", "MCPError: Tool call timed out", "MCPError: Tool call failed")
    assert all(o in clean for o in outcomes), outcomes
    assert elapsed < 90  # no hang: a clean error or a new Pod, within the start timeout
    assert last == "ok" and new != old


def test_the_reaper_does_not_delete_a_pod_the_broker_is_still_starting(
    lab: Lab, setup: tuple[str, Path, Path]
) -> None:
    """An idle timeout of 2 s makes the reaper look at the cluster every 0.5 s, so it sees the
    tenant's Pod many times while it starts (seconds): the broker's own start in progress is
    not an orphan. On the old code the reaper deleted it and the first call failed
    (sandbox_start_failed, found with 20 first calls at once through one broker)."""
    tenant, _, base = setup
    broker = host_broker(lab, base, [tenant])
    broker.env["DOCBROKER_IDLE_TIMEOUT"] = "2"
    start(broker)
    try:

        async def run() -> str:
            async with broker.client(broker.token(tenant, scope="docs:read")) as client:
                result = structured(await client.call_tool("search_documents", {"query": "cluster"}))
            return str(result["status"])

        status = asyncio.run(run())
    finally:
        broker.stop()
    assert status == "ok"
    assert [e["tenant"] for e in audit(broker, "sandbox.started")] == [tenant]
    assert audit(broker, "sandbox.failed") == []


def test_an_idle_replica_does_not_reap_the_pod_another_replica_is_using(
    lab: Lab, setup: tuple[str, Path, Path]
) -> None:
    """Issue 24: each replica reaped by its own last use, so replica a, which served the tenant
    once, deleted the Pod replica b was using (a save in flight then ended result_unknown).
    Last use is now the Pod's annotation, patched by the replica serving the calls: a's reaper
    looks, sees b's use and keeps the Pod (its log says so), b's calls all answer from the one
    Pod, and once neither calls, the Pod is reaped as idle."""
    tenant, _, base = setup
    idle = 6.0  # a reaper pass every 1.5 s, last use patched at most every 1.5 s
    a = host_broker(lab, base / "a", [tenant], replica="a")
    a.env["DOCBROKER_IDLE_TIMEOUT"] = str(idle)
    start(a)
    b = host_broker(lab, base / "b", [tenant], replica="b", master=a.data_dir / "master.key")
    b.env["DOCBROKER_IDLE_TIMEOUT"] = str(idle)
    start(b)
    kept_line = "idle sandbox kept: used on a replica since"
    try:

        async def search(client: Any) -> str:
            result = structured(await client.call_tool("search_documents", {"query": "cluster"}))
            return str(result["status"])

        async def run() -> tuple[str, list[str], list[str]]:
            async with a.client(a.token(tenant, scope="docs:read")) as client_a:
                assert await search(client_a) == "ok"  # a starts the Pod, then goes quiet
            [uid] = tenant_pods(lab, tenant)
            statuses: list[str] = []
            uids: list[str] = []
            deadline = time.monotonic() + 6 * idle
            async with b.client(b.token(tenant, scope="docs:read")) as client_b:
                # b calls until a's reaper has looked at the Pod twice (and kept it), or a
                # stopped it: the old code's outcome, one idle timeout after a's call.
                while a.logs().count(kept_line) < 2 and not audit(a, "sandbox.stopped"):
                    assert time.monotonic() < deadline, "a's reaper never looked at the tenant's Pod"
                    statuses.append(await search(client_b))
                    uids += tenant_pods(lab, tenant)
                    await asyncio.sleep(0.5)
            return uid, statuses, uids

        uid, statuses, uids = asyncio.run(run())
        a_stopped = audit(a, "sandbox.stopped")
        # Now neither calls: the Pod goes, as idle (by whichever replica looks first).
        gone_by = time.monotonic() + 6 * idle
        while tenant_pods(lab, tenant):
            assert time.monotonic() < gone_by, "the Pod nobody uses was never reaped"
            time.sleep(0.5)
        logs_a = a.logs()
    finally:
        a.stop()
        b.stop()
    assert a_stopped == [], "replica a reaped the Pod replica b was using"
    assert logs_a.count(kept_line) >= 2
    assert statuses and all(s == "ok" for s in statuses), statuses
    assert set(uids) == {uid}  # one Pod throughout: never deleted under b
    stopped = [e for br in (a, b) for e in audit(br, "sandbox.stopped")]
    assert stopped and {e["reason"] for e in stopped} == {"idle"}
    assert audit(a, "sandbox.failed") == [] and audit(b, "sandbox.failed") == []


def test_a_pod_spec_that_fails_pod_security_is_refused_audited_and_never_created(
    lab: Lab, setup: tuple[str, Path, Path]
) -> None:
    """Issue 24: podsecurity.check_pod_spec was documented and never ran. A memory limit of 0
    passes the settings' quantity check and means no memory cap at all on the tenant's Pod;
    the broker now checks every Pod it is about to create, refuses this one with a fixed
    reason, audits `sandbox.failed` (`pod_security`), and creates nothing (no Pod, no Secret)."""
    tenant, _, base = setup
    broker = host_broker(lab, base, [tenant])
    broker.env["DOCBROKER_KUBE_MEMORY_LIMIT"] = "0"
    start(broker)
    try:

        async def run() -> str:
            try:  # the client's handshake already reaches the sandbox
                async with broker.client(broker.token(tenant, scope="docs:read")) as client:
                    result = structured(await client.call_tool("search_documents", {"query": "cluster"}))
            except Exception as exc:  # the SDK may wrap it in an ExceptionGroup
                while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                    exc = exc.exceptions[0]
                return f"{type(exc).__name__}: {exc}"
            return str(result["status"])

        outcome = asyncio.run(run())
        logs = broker.logs()
    finally:
        broker.stop()
    assert outcome == "MCPError: Tool sandbox unavailable, retry later", outcome
    failed = audit(broker, "sandbox.failed")
    # one per attempt (the SDK's handshake tries twice): each refused and audited
    assert failed and {(e["tenant"], e["reason"], e.get("sandbox")) for e in failed} == {
        (tenant, "pod_security", None)
    }
    # and each request that needed the sandbox ends with the same fixed reason
    requests = [e for ev in ("mcp.request", "policy.denied") for e in audit(broker, ev) if "request_id" in e]
    assert requests and {e["reason"] for e in requests} <= {"pod_security", "circuit_open"}
    assert "pod_security" in {e["reason"] for e in requests}
    assert audit(broker, "sandbox.started") == []
    assert tenant_pods(lab, tenant) == []
    secrets = lab.core.list_namespaced_secret(NS, label_selector=f"{names.TENANT}={tenant}").items
    assert secrets == []
    assert "fails the Pod Security check (limits)" in logs and "Traceback" not in logs


class CuttableProxy:
    """A TCP forwarder on 127.0.0.1 to the API server (its certificate names 127.0.0.1), which
    the test cuts: every connection closed and the port refusing, as a restarting API server."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError:
                return  # cut
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with contextlib.suppress(OSError):  # wakes the blocked accept (Linux): the port refuses
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def test_the_api_server_away_is_one_line_in_the_log_and_warm_calls_go_on(
    lab: Lab, setup: tuple[str, Path, Path]
) -> None:
    """Issue 25 (found by the lab reliability run, the API server restarted): each reaper pass
    while the API was away logged a traceback (`reaper pass failed`, urllib3's MaxRetryError
    from listing the Pods). The engine away is expected: one line with a fixed reason, and the
    tenant's warm Pod keeps answering (the broker reaches it at its IP, not through the API)."""
    tenant, _, base = setup
    kubeconfig = yaml.safe_load(lab.broker_kubeconfig.read_text())
    server = kubeconfig["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    proxy = CuttableProxy(host, int(port))
    kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    via_proxy = base / "via-proxy.kubeconfig"
    via_proxy.write_text(yaml.safe_dump(kubeconfig))
    via_proxy.chmod(0o600)
    broker = host_broker(lab, base, [tenant])
    broker.env["DOCBROKER_KUBECONFIG"] = str(via_proxy)
    broker.env["DOCBROKER_IDLE_TIMEOUT"] = "8"  # a reaper pass every 2 s
    start(broker)
    reaper_lines = ("reaper pass skipped", "reaper pass failed")
    try:
        token = broker.token(tenant, scope="docs:read")

        async def search() -> str:
            async with broker.client(token) as client:
                result = structured(await client.call_tool("search_documents", {"query": "cluster"}))
            return str(result["status"])

        before = asyncio.run(search())
        proxy.cut()
        deadline = time.monotonic() + 30
        while sum(broker.logs().count(line) for line in reaper_lines) < 2:  # two passes, API away
            assert time.monotonic() < deadline, "no reaper pass was seen while the API was away"
            time.sleep(0.2)
        during = asyncio.run(search())
        logs = broker.logs()
    finally:
        proxy.cut()
        broker.stop()
    assert before == "ok" and during == "ok"
    assert "Traceback" not in logs
    assert "reaper pass skipped: sandbox_cluster_unavailable (ClusterUnavailable)" in logs
