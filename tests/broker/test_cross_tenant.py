"""Tenant A's token never reaches tenant B's sandbox, files, sessions or approvals (DESIGN §1,
§3, §4): whatever A sends, it is answered from A's own sandbox or refused."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from broker.testing import Broker, structured
from tests.broker.support import (
    MODES,
    LegacySession,
    approver,
    decide,
    events_since,
    last_seq,
    open_http,
    open_mcp,
    server_pids,
    terminal,
    unique,
)

pytestmark = pytest.mark.anyio

ACME_SECRET = "acme-only-7d1f"
GLOBEX_SECRET = "globex-only-4be2"


@pytest.fixture(scope="module")
def planted(broker: Broker) -> dict[str, Path]:
    files = {}
    for tenant, word in (("acme", ACME_SECRET), ("globex", GLOBEX_SECRET)):
        folder = broker.sources(tenant)
        folder.mkdir(parents=True, exist_ok=True)
        files[tenant] = folder / f"{tenant}-plan.md"
        files[tenant].write_text(f"plan of {tenant}: {word}\n")
    return files


@pytest.mark.parametrize("mode", MODES)
async def test_each_tenant_sees_only_its_own_documents(
    broker: Broker, planted: dict[str, Path], mode: str
) -> None:
    before = last_seq(broker)
    for tenant, other, mine, theirs in (
        ("acme", "globex", ACME_SECRET, GLOBEX_SECRET),
        ("globex", "acme", GLOBEX_SECRET, ACME_SECRET),
    ):
        async with open_mcp(broker, broker.token(tenant=tenant), mode=mode) as c:
            own = structured(await c.call_tool("read_document", {"filename": f"{tenant}-plan.md"}))
            assert own["status"] == "ok" and mine in own["data"]["content"]
            foreign = structured(await c.call_tool("read_document", {"filename": f"{other}-plan.md"}))
            assert foreign["status"] in ("rejected", "failed") and foreign["data"] is None
            for query in (theirs, "plan of"):
                found = structured(await c.call_tool("search_documents", {"query": query}))
                assert theirs not in str(found)
                assert {h["filename"] for h in found["data"]["hits"]} <= {f"{tenant}-plan.md"}
    # every request was attributed to the tenant of its token, by its own sandbox
    requests = terminal(events_since(broker, before))
    assert requests and all(e.get("tenant") in ("acme", "globex") for e in requests)
    sandboxes = {e["tenant"]: set() for e in requests}
    for e in requests:
        if "sandbox" in e:
            sandboxes[e["tenant"]].add(e["sandbox"])
    assert sandboxes["acme"] and sandboxes["globex"] and sandboxes["acme"].isdisjoint(sandboxes["globex"])


async def test_path_tricks_do_not_leave_the_tenant(broker: Broker, planted: dict[str, Path]) -> None:
    names = [
        "../../globex/docs/sources/globex-plan.md",
        "../globex-plan.md",
        "/etc/passwd",
        f"{planted['globex']}",
        "globex-plan.md\x00.md",
        "..",
        ".",
    ]
    async with open_mcp(broker, broker.token(tenant="acme")) as c:
        for name in names:
            result = structured(await c.call_tool("read_document", {"filename": name}))
            assert result["status"] in ("rejected", "failed") and GLOBEX_SECRET not in str(result), name


def test_tenant_servers_are_separate_processes_with_their_own_sockets(
    broker: Broker, planted: dict[str, Path]
) -> None:
    acme, globex = server_pids(broker, "acme"), server_pids(broker, "globex")
    assert len(acme) == 1 and len(globex) == 1 and acme != globex
    for tenant, pid in (("acme", acme[0]), ("globex", globex[0])):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"DOCS_SCOPE={tenant}".encode() in environ
        assert not any(b"DOCBROKER_" in v or b"AUTHORIZATION" in v.upper() for v in environ)


async def test_reports_land_only_in_the_writers_tenant(broker: Broker) -> None:
    name, content = unique("mine"), "globex's report"
    async with open_mcp(broker, broker.token(tenant="globex"), mode="legacy") as c:
        waiting = structured(await c.call_tool("save_report", {"filename": name, "content": content}))
    approval_id = waiting["data"]["approval_id"]
    # acme's approver cannot see or decide it; acme's client cannot use it
    assert decide(broker, approval_id, tenant="acme").status_code == 404
    async with open_mcp(broker, broker.token(tenant="acme"), mode="legacy") as c:
        acme = structured(await c.call_tool("save_report", {"filename": name, "content": content}))
    assert acme["status"] == "waiting_approval" and acme["data"]["approval_id"] != approval_id
    assert decide(broker, approval_id, tenant="globex").status_code == 200
    async with open_mcp(broker, broker.token(tenant="acme"), mode="legacy") as c:
        again = structured(await c.call_tool("save_report", {"filename": name, "content": content}))
    assert again["status"] == "waiting_approval"
    assert not (broker.reports("acme") / name).exists()
    async with open_mcp(broker, broker.token(tenant="globex"), mode="legacy") as c:
        done = structured(await c.call_tool("save_report", {"filename": name, "content": content}))
    assert done["status"] == "ok"
    assert (broker.reports("globex") / name).read_text() == content
    assert not (broker.reports("acme") / name).exists()


async def test_approval_lists_are_per_tenant(broker: Broker) -> None:
    ids = {}
    for tenant in ("acme", "globex"):
        async with open_mcp(broker, broker.token(tenant=tenant), mode="legacy") as c:
            result = structured(
                await c.call_tool("save_report", {"filename": unique(tenant), "content": tenant})
            )
        ids[tenant] = result["data"]["approval_id"]
    for tenant, other in (("acme", "globex"), ("globex", "acme")):
        with approver(broker, tenant=tenant) as http:
            listed = {a["approval_id"] for a in http.get("/v1/approvals").json()["approvals"]}
            assert ids[tenant] in listed and ids[other] not in listed
            for state in ("pending", "approved", "denied", "consumed", "expired", "all", "bogus"):
                body = http.get("/v1/approvals", params={"state": state}).json()
                assert ids[other] not in str(body)
            assert http.get(f"/v1/approvals/{ids[other]}").status_code == 404
            assert http.post(f"/v1/approvals/{ids[other]}/deny").status_code == 404


def test_legacy_session_of_one_tenant_is_unknown_to_another(broker: Broker) -> None:
    with open_http(broker, broker.token(tenant="acme")) as acme:
        session = LegacySession(acme)
        with open_http(broker, broker.token(tenant="globex")) as globex:
            response = session.call("read_document", {"filename": "acme-plan.md"}, globex)
        assert response.status_code == 404
        assert ACME_SECRET not in response.text


def test_tenant_claim_cannot_be_swapped_after_signing(broker: Broker) -> None:
    head, payload, sig = broker.token(tenant="acme").split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["tenant"] = "globex"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with open_http(broker, f"{head}.{forged}.{sig}") as http:
        assert http.get("/v1/approvals").status_code == 401
