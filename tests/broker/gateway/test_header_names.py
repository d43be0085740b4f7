"""Header names a client invents are values: the audit log records known names, the rest as `other`.

`Mcp-Param-*` headers mirror tool arguments; their names come from the tools' contract
(`x-mcp-header` in server/contracts.py). Any other `Mcp-Param-*` name is the client's own
choice, and a name can carry what a value would (`Mcp-Param-Secret-Q3-Layoffs-Plan.Md`).
"""

from __future__ import annotations

import secrets

from broker.testing import Broker
from tests.broker.support import call_modern, events_since, last_seq, open_http, terminal


def test_an_invented_mcp_param_header_name_never_reaches_the_audit_or_the_log(broker: Broker) -> None:
    canary = f"cnry{secrets.token_hex(6)}"
    before = last_seq(broker)
    with open_http(broker, broker.token()) as http:
        http.headers[f"mcp-param-secret-{canary}-plan.md"] = "1"
        http.headers[f"Mcp-Param-{canary}"] = "2"
        reply = call_modern(http, "search_documents", {"query": "intro"})
    assert reply.status_code == 200, reply.text
    [event] = terminal(events_since(broker, before))
    assert event["event"] == "mcp.request" and event["tool"] == "search_documents"
    assert event["header_names"] == ["other"]
    # The names are title-cased on the way into the audit: compare without case.
    assert canary not in broker.audit_file.read_text().lower()
    assert canary not in broker.logs().lower()


def test_a_request_without_mcp_param_headers_records_none(broker: Broker) -> None:
    before = last_seq(broker)
    with open_http(broker, broker.token()) as http:
        http.headers["x-custom-name"] = "1"  # not an Mcp-Param header: never listed at all
        assert call_modern(http, "search_documents", {"query": "intro"}).status_code == 200
    [event] = terminal(events_since(broker, before))
    assert "header_names" not in event
