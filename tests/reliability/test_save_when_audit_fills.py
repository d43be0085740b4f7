"""A save whose write went to the sandbox, and whose terminal audit line then cannot be written
(the audit disk full), is answered `result_unknown` — never "503, request refused" (found by
the reliability run, issue 25).

Seen in the run during `audit_fs_full`: replica b forwarded an approved save, the sandbox wrote
the report, b moved it into the reports store, and then its audit file system filled. The
terminal event failed, and the answer held back for want of audit became the fixed refusal
"Audit log unavailable; request refused" — for a report that now exists. A client told
"refused" asks for the report again (a human approves it twice, or the retry meets "report
exists" and the client never learns its first write succeeded). A write that was sent may or
may not have happened: the answer is `result_unknown` (DESIGN §2), audited or not.

Here with the local runtime (root, for the tmpfs): the tenant's server is SIGSTOPped, the
approved save is seen waiting in its socket, the audit tmpfs is filled to the last byte, and
the server continued.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from broker.protocol.jsonrpc import AUDIT_UNAVAILABLE
from broker.testing import Broker, make_broker
from tests.broker.support import call_modern, decide, open_http, rpc_reply, server_pids, wait_for
from tests.reliability.services import SmallFs
from tests.reliability.test_docker_reliability import process_state, queued

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]


@pytest.fixture
def broker_with_small_audit_disk(tmp_path: Path) -> Iterator[tuple[Broker, SmallFs]]:
    disk = SmallFs(tmp_path / "audit", "4m", os.getuid(), os.getgid())
    disk.mount()
    broker = make_broker(tmp_path, env={"DOCBROKER_AUDIT_LOG": str(disk.path / "audit.jsonl")})
    (sources := broker.sources("acme")).mkdir(parents=True)
    (sources / "notes.md").write_text("# Notes\n", encoding="utf-8")
    try:
        broker.start()
        yield broker, disk
    finally:
        broker.stop()
        disk.unmount()


def test_a_sent_save_whose_audit_line_cannot_be_written_is_result_unknown(
    broker_with_small_audit_disk: tuple[Broker, SmallFs],
) -> None:
    broker, disk = broker_with_small_audit_disk
    writer = broker.token("acme", subject="alice", scope="docs:read docs:write")
    args = {"filename": "audit-full.md", "content": "# Written as the audit disk filled\n"}
    with open_http(broker, writer) as http:
        read = rpc_reply(call_modern(http, "read_document", {"filename": "notes.md"}))  # the server up
        assert read["result"]["structuredContent"]["status"] == "ok", read
        waiting = rpc_reply(call_modern(http, "save_report", args))["result"]["structuredContent"]
        assert waiting["status"] == "waiting_approval", waiting
    assert decide(broker, waiting["data"]["approval_id"]).status_code == 200

    [pid] = server_pids(broker, "acme")
    os.kill(pid, signal.SIGSTOP)
    assert wait_for(lambda: process_state(pid) == "T", 10)
    before = queued(pid)
    with ThreadPoolExecutor(1) as pool, open_http(broker, writer) as http:
        save = pool.submit(call_modern, http, "save_report", args)
        assert wait_for(lambda: queued(pid) > before or save.done(), 30)
        assert not save.done(), "the save was answered before it reached the stopped server"
        disk.fill()  # the approval's lines are written; the terminal one will not be
        # The log's last page may still take a few lines: other requests use it up, until
        # one is refused for want of audit.
        with open_http(broker, broker.token("acme", subject="bob", scope="docs:read")) as other:
            refused = False
            for _ in range(200):
                answer = call_modern(other, "no_such_tool", {})  # refused by policy: no sandbox
                if answer.status_code == 503 and answer.json()["error"]["code"] == AUDIT_UNAVAILABLE:
                    refused = True
                    break
            assert refused, "the audit disk never refused a request"
        os.kill(pid, signal.SIGCONT)
        response = save.result(timeout=60)

    assert (broker.reports("acme") / "audit-full.md").exists()  # the write happened
    assert response.status_code == 200, (response.status_code, response.text[:300])
    result = rpc_reply(response)["result"]["structuredContent"]
    assert result["status"] == "result_unknown", result
    assert "Traceback" not in broker.logs()
