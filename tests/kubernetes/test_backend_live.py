"""The Kubernetes backend on the live lab cluster, with the broker's own RBAC (a token of its
ServiceAccount): a tenant Pod that becomes Ready and answers MCP only with the bearer, two
replicas sharing one Pod, discovery after a restart, a deleted or crashed Pod replaced, the
inside probe from a live Pod (`exec` with the admin's credentials), the ServiceAccount refused
what it must not do, and the lab's restricted PodSecurityPolicy refusing tampered specs.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import secrets
import time
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from broker.master_key import sandbox_key, tenant_secret
from broker.runtime.base import SandboxStartError
from broker.runtime.kubernetes import KubernetesBackend, names
from broker.runtime.kubernetes.doctor import _rbac_needed, _rbac_refused, allowed
from broker.runtime.kubernetes.podspec import tenant_pod
from broker.runtime.lifecycle import Runtime
from broker.testing.kubernetes_lab import MASTER, Lab, unique_tenant
from broker.types import SandboxInfo, SandboxSpec
from server.approval import mint_token

pytestmark = pytest.mark.kubernetes
NS = names.TENANTS_NAMESPACE


def spec(tenant: str) -> SandboxSpec:
    # The Kubernetes backend uses the tenant only; the host paths are the Docker runtime's.
    return SandboxSpec(
        tenant=tenant, docs_root="/nonexistent", secret_file="/nonexistent", run_dir="/nonexistent"
    )


async def connect(lab: Lab, replica: str = "r1", **overrides: Any) -> KubernetesBackend:
    return await KubernetesBackend.connect(
        lab.settings(**overrides), MASTER, replica_id=replica, start_timeout=60.0
    )


async def mcp_calls(info: SandboxInfo, content: str = "# Summary\nok\n") -> dict[str, Any]:
    assert info.endpoint is not None and info.endpoint.token is not None
    headers = {"Authorization": f"Bearer {info.endpoint.token}"}
    async with httpx2.AsyncClient(timeout=20, headers=headers) as http:
        async with Client(streamable_http_client(info.endpoint.url, http_client=http)) as client:
            tools = sorted(t.name for t in (await client.list_tools()).tools)
            search = await client.call_tool("search_documents", {"query": "docbroker"})
            read = await client.call_tool("read_document", {"filename": "notes.md"})
            token = mint_token(
                secret=tenant_secret(MASTER, info.tenant),
                tenant=info.tenant,
                tool="save_report",
                filename="summary.md",
                sha256=hashlib.sha256(content.encode()).hexdigest(),
                expires=int(time.time()) + 120,
                jti=secrets.token_hex(16),
            )
            saved = await client.call_tool(
                "save_report", {"filename": "summary.md", "content": content, "approval_token": token}
            )
    return {
        "tools": tools,
        "search": search.structured_content,
        "read": read.structured_content,
        "saved": saved.structured_content,
    }


def test_tenant_pod_becomes_ready_and_answers_mcp_only_with_the_bearer(lab: Lab, tenant: str) -> None:
    async def run() -> tuple[SandboxInfo, dict[str, Any], list[int]]:
        backend = await connect(lab)
        try:
            info = await backend.create(spec(tenant))
            facts = await mcp_calls(info)
            assert info.endpoint is not None
            statuses = []
            async with httpx2.AsyncClient(timeout=10) as http:
                body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
                accept = {"Accept": "application/json, text/event-stream"}
                statuses.append((await http.post(info.endpoint.url, json=body, headers=accept)).status_code)
                wrong = {**accept, "Authorization": f"Bearer {sandbox_key(MASTER, 'other')}"}
                statuses.append((await http.post(info.endpoint.url, json=body, headers=wrong)).status_code)
            return info, facts, statuses
        finally:
            await backend.close()

    info, facts, statuses = asyncio.run(run())
    assert facts["tools"] == ["read_document", "save_report", "search_documents"]
    assert "notes.md" in str(facts["search"]) and "docbroker on a cluster" in str(facts["read"])
    assert facts["saved"]["status"] == "ok", facts["saved"]
    assert statuses == [401, 401]  # no bearer; another tenant's
    pod = lab.pod(tenant)
    assert pod.metadata.uid == info.backend_id
    assert pod.metadata.labels[names.REPLICA] == "r1"
    assert info.endpoint is not None and pod.status.pod_ip in info.endpoint.url
    assert info.endpoint.keeper_url == f"http://{pod.status.pod_ip}:8081"
    deadline = time.monotonic() + 10  # the kubelet's own probe says so too, a moment later
    while not any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ()):
        assert time.monotonic() < deadline, "the kubelet never saw the tenant pod Ready"
        time.sleep(0.2)
        pod = lab.pod(tenant)


def test_two_replicas_share_one_pod(lab: Lab, tenant: str) -> None:
    async def run() -> list[SandboxInfo]:
        first, second = await connect(lab, "r1"), await connect(lab, "r2")
        try:
            return list(await asyncio.gather(first.create(spec(tenant)), second.create(spec(tenant))))
        finally:
            await first.close()
            await second.close()

    a, b = asyncio.run(run())
    assert a.backend_id == b.backend_id  # one Pod
    assert sorted(bool(i.details.get("adopted")) for i in (a, b)) == [False, True]
    pods = lab.core.list_namespaced_pod(NS, label_selector=f"{names.TENANT}={tenant}").items
    assert [p.metadata.uid for p in pods] == [a.backend_id]


def test_a_restarted_broker_discovers_and_adopts_the_pod(lab: Lab, tenant: str) -> None:
    async def run() -> tuple[str, list[SandboxInfo], SandboxInfo | None]:
        before = await connect(lab, "r1")
        info = await before.create(spec(tenant))
        await before.close()
        after = await connect(lab, "r1-restarted")
        runtime = Runtime(
            after, spec, max_sandboxes=10, idle_timeout=600, start_timeout=60, on_event=_no_events
        )
        try:
            found = [i for i in await after.discover() if i.tenant == tenant]
            await runtime.start()
            return info.backend_id, found, runtime.get(tenant)
        finally:
            await runtime.close()  # peers are taken for alive: the Pod stays

    uid, found, adopted = asyncio.run(run())
    assert [(i.backend_id, i.details["replica"], i.state.value) for i in found] == [(uid, "r1", "running")]
    assert adopted is not None and adopted.backend_id == uid
    assert lab.pod(tenant).metadata.uid == uid  # closing the runtime left the shared Pod running


def test_a_deleted_pod_is_replaced_by_a_new_one(lab: Lab, tenant: str) -> None:
    async def run() -> tuple[str, bool, str, dict[str, Any]]:
        backend = await connect(lab)
        runtime = Runtime(
            backend, spec, max_sandboxes=10, idle_timeout=600, start_timeout=60, on_event=_no_events
        )
        try:
            await runtime.ensure(tenant)
            old = runtime.get(tenant)
            assert old is not None
            lab.core.delete_namespaced_pod(names.object_name(tenant), NS, grace_period_seconds=0)
            alive = await backend.alive(old)
            await runtime.mark_broken(tenant)
            await runtime.ensure(tenant)
            new = runtime.get(tenant)
            assert new is not None
            return old.backend_id, alive, new.backend_id, await mcp_calls(new)
        finally:
            await runtime.close()
            await backend.close()

    old, alive, new, facts = asyncio.run(run())
    assert alive is False
    assert new != old and lab.pod(tenant).metadata.uid == new
    assert facts["saved"]["status"] == "ok"


def test_a_crashed_server_container_makes_the_pod_dead(lab: Lab, tenant: str) -> None:
    """restartPolicy Never: the kubelet does not restart it; alive() says so and the
    lifecycle replaces the Pod (the server is not the one the broker admitted any more)."""

    async def run() -> tuple[bool, bool, str, str]:
        backend = await connect(lab)
        runtime = Runtime(
            backend, spec, max_sandboxes=10, idle_timeout=600, start_timeout=60, on_event=_no_events
        )
        try:
            await runtime.ensure(tenant)
            info = runtime.get(tenant)
            assert info is not None
            before = await backend.alive(info)
            lab.exec(names.object_name(tenant), "server", "import os, signal; os.kill(1, signal.SIGTERM)")
            deadline = time.monotonic() + 30
            while await backend.alive(info) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            after = await backend.alive(info)
            await runtime.mark_broken(tenant)
            await runtime.ensure(tenant)
            replaced = runtime.get(tenant)
            assert replaced is not None
            return before, after, info.backend_id, replaced.backend_id
        finally:
            await runtime.close()
            await backend.close()

    before, after, old, new = asyncio.run(run())
    assert before is True and after is False
    assert new != old


def test_a_pod_without_its_volumes_fails_with_what_to_do(lab: Lab) -> None:
    name = unique_tenant("nov")  # no PVCs made

    async def run() -> str:
        backend = await connect(lab)
        try:
            with pytest.raises(SandboxStartError) as caught:
                await backend.create(spec(name))
            return str(caught.value)
        finally:
            await backend.close()

    try:
        message = asyncio.run(run())
    finally:
        lab.drop_tenant(name)
    assert "tenant manifest" in message or "did not become ready" in message


PROBE = r"""
import errno, json, os
BOX = "/srv/docs/reports"
def attempt(fn):
    try:
        fn(); return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
def create(path, data=b"x"):
    def go():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o040); os.write(fd, data); os.close(fd)
    return go
found = []
for top in ("/", ):
    for d, subdirs, files in os.walk(top):
        if d.startswith(("/proc", "/sys", "/dev")):
            subdirs[:] = []; continue
        found += [os.path.join(d, f) for f in files if f in ("EARLIER_NAME", "keeper.key")]
        found += [d for s in subdirs if s == "EARLIER_NAME"]
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "CapEff": status["CapEff"].strip(), "CapBnd": status["CapBnd"].strip(),
    "NoNewPrivs": status["NoNewPrivs"].strip(), "Seccomp": status["Seccomp"].strip(),
    "rootfs": attempt(create("/evil")),
    "sources_new": attempt(create("/srv/docs/sources/new.md")),
    "sources_overwrite": attempt(lambda: os.close(os.open("/srv/docs/sources/notes.md", os.O_WRONLY))),
    "secret_write": attempt(lambda: os.close(os.open("/run/secrets/docbroker/approval.key", os.O_WRONLY))),
    "secret_files": sorted(n for n in os.listdir("/run/secrets/docbroker") if not n.startswith("..")),
    "sa_token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"),
    "reports_mount": os.path.exists("/reports") or os.path.exists("/srv/docs/reports/EARLIER_NAME"),
    "dropbox_create": attempt(create("/srv/docs/reports/new-from-server.md")),
    "dropbox_list": attempt(lambda: os.listdir("/srv/docs/reports")),
    "dropbox_read_own": attempt(lambda: os.close(os.open(BOX + "/new-from-server.md", os.O_RDONLY))),
    "dropbox_chmod_own": attempt(lambda: os.chmod("/srv/docs/reports/new-from-server.md", 0o600)),
    "dropbox_unlink_own": attempt(lambda: os.unlink("/srv/docs/reports/new-from-server.md")),
    "earlier_read": attempt(lambda: open("/srv/docs/reports/EARLIER_NAME", "rb").read()),
    "earlier_overwrite": attempt(lambda: os.close(os.open(BOX + "/EARLIER_NAME", os.O_WRONLY | os.O_TRUNC))),
    "earlier_unlink": attempt(lambda: os.unlink("/srv/docs/reports/EARLIER_NAME")),
    "found_anywhere": found,
    "chmod_tmp": attempt(lambda: (create("/tmp/x")(), os.chmod("/tmp/x", 0o600))),
}))
"""


def test_inside_probe_in_a_live_tenant_pod(lab: Lab) -> None:
    """DESIGN §7 from inside the server container: a report accepted earlier (in the reports
    PVC, which only the keeper mounts) cannot be listed, read, overwritten or deleted; the
    keeper's key is nowhere; the drop-box takes new files and cannot be listed."""
    name = unique_tenant("probe")
    base = lab.tenant(name)
    earlier = f"earlier-{secrets.token_hex(4)}.md"
    (base / "reports" / earlier).write_bytes(b"an accepted report")

    async def start() -> None:
        backend = await connect(lab)
        try:
            await backend.create(spec(name))
        finally:
            await backend.close()

    try:
        asyncio.run(start())
        facts = lab.probe(names.object_name(name), "server", PROBE.replace("EARLIER_NAME", earlier))
        kept = (base / "reports" / earlier).read_bytes()
    finally:
        lab.drop_tenant(name)
    assert facts["uid"] == 10001 and facts["gid"] == 10001 and 0 not in facts["groups"]
    assert int(facts["CapEff"], 16) == 0 and int(facts["CapBnd"], 16) == 0
    assert facts["NoNewPrivs"] == "1" and facts["Seccomp"] == "2"
    assert facts["rootfs"] == "EROFS" and facts["sources_new"] == "EROFS"
    assert facts["sources_overwrite"] in ("EROFS", "EACCES") and facts["secret_write"] in ("EROFS", "EACCES")
    assert facts["secret_files"] == ["approval.key", "sandbox.key"]
    assert facts["sa_token"] is False
    assert facts["reports_mount"] is False and facts["found_anywhere"] == []
    assert facts["dropbox_create"] == "ok"
    assert facts["dropbox_list"] == "EACCES"
    assert facts["dropbox_read_own"] == "EACCES"  # mode 0o040: the owner class has nothing
    assert facts["dropbox_chmod_own"] == "EPERM" and facts["dropbox_unlink_own"] == "EPERM"  # the profile
    assert facts["earlier_read"] == facts["earlier_overwrite"] == "ENOENT"  # no path reaches it
    assert facts["earlier_unlink"] in ("ENOENT", "EPERM")  # the profile refuses unlink before the lookup
    assert facts["chmod_tmp"] == "EPERM"
    assert kept == b"an accepted report"  # still there, untouched


def test_the_broker_service_account_is_refused_what_it_must_not_do(lab: Lab, tenant: str) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.stream import stream

    from broker.runtime.kubernetes.client import api_client

    broker = api_client(lab.broker_kubeconfig)
    core = client.CoreV1Api(broker)

    async def start() -> None:
        backend = await connect(lab)
        try:
            await backend.create(spec(tenant))  # the Secret exists now: created, never read
        finally:
            await backend.close()

    asyncio.run(start())
    refused = []
    for attempt in (
        lambda: core.read_namespaced_secret(names.object_name(tenant), NS),
        lambda: core.list_namespaced_secret(NS),
        lambda: core.list_secret_for_all_namespaces(),
        lambda: core.list_namespaced_pod(names.BROKER_NAMESPACE),
        lambda: stream(
            core.connect_get_namespaced_pod_exec,
            names.object_name(tenant),
            NS,
            container="server",
            command=["/opt/venv/bin/python", "-c", "print(1)"],
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
        ),
    ):
        with pytest.raises(ApiException) as caught:
            attempt()
        refused.append(caught.value.status)
    assert refused[:4] == [403, 403, 403, 403]
    assert refused[4] in (403, 0)  # exec upgrades to a websocket: the 403 arrives as its handshake failure
    assert not allowed(broker, NS, "pods", "create", "exec")
    # The doctor's checks say so, and can say otherwise: the admin has far more.
    assert _rbac_needed(broker, NS)[0] == "OK"
    assert _rbac_refused(broker, NS)[0] == "OK"
    level, detail = _rbac_refused(lab.admin, NS)
    assert level == "FAIL" and "get secrets" in detail and "create pods/exec" in detail
    broker.close()


@pytest.mark.parametrize(
    "tamper", ["privileged", "host_path", "root", "no_drop", "escalation", "writable_root"]
)
def test_the_restricted_psp_rejects_a_tampered_tenant_pod(lab: Lab, tamper: str) -> None:
    """The broker's own credentials could not start a weakened Pod even if its spec were
    changed: admission (the lab's restricted PodSecurityPolicy) refuses it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from broker.runtime.kubernetes.client import api_client

    name = unique_tenant("tamper")
    body = copy.deepcopy(tenant_pod(lab.settings(), name, instance="tamper", replica="r1"))
    server = body["spec"]["containers"][0]
    if tamper == "privileged":
        server["securityContext"]["privileged"] = True
    elif tamper == "host_path":
        body["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
        server["volumeMounts"].append({"name": "host", "mountPath": "/host"})
    elif tamper == "root":
        server["securityContext"]["runAsUser"] = 0
        server["securityContext"]["runAsNonRoot"] = False
        body["spec"]["securityContext"]["runAsNonRoot"] = False
    elif tamper == "no_drop":
        server["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}
    elif tamper == "escalation":
        server["securityContext"]["allowPrivilegeEscalation"] = True
    elif tamper == "writable_root":
        server["securityContext"]["readOnlyRootFilesystem"] = False
    broker = api_client(lab.broker_kubeconfig)
    try:
        untampered = copy.deepcopy(tenant_pod(lab.settings(), name, instance="tamper", replica="r1"))
        # the same spec untampered passes admission (server-side dry run: nothing starts)
        client.CoreV1Api(broker).create_namespaced_pod(NS, untampered, dry_run="All")
        with pytest.raises(ApiException) as caught:
            client.CoreV1Api(broker).create_namespaced_pod(NS, body, dry_run="All")
    finally:
        broker.close()
    assert caught.value.status == 403
    assert "PodSecurityPolicy" in (caught.value.body or "")


async def _no_events(*_: object) -> None:
    return None
