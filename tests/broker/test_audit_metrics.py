"""The audit log's own counters on /metrics (issue 38): docs/audit.md says values that did not
fit their key, dropped keys and failed witness copies are counted there, and the alert rules
(k8s/components/prometheus-rules) are written against these names — they were never exported.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.audit import AuditLog
from broker.metrics import AUDIT_COUNTERS, Metrics
from broker.testing import make_broker
from tests.broker.audit.audit_helpers import CANARY, plain, request_fields
from tests.broker.support import open_http, post_modern, wait_for


def samples(text: str) -> dict[str, float]:
    """Every unlabelled sample of a Prometheus text page, by name."""
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


@pytest.mark.anyio
async def test_invalid_values_and_dropped_keys_reach_metrics(tmp_path: Path) -> None:
    audit = await AuditLog.open(plain(tmp_path / "audit.jsonl"))
    try:
        metrics = Metrics(lambda: 0, lambda: 0, lambda: 0, lambda: audit.stats.totals())
        before = samples(metrics.render().decode())
        fields = request_fields() | {"status": CANARY}  # a value outside its key's shape
        await audit.emit("mcp.request", **fields, arguments=CANARY)  # a key outside the schema
        after = samples(metrics.render().decode())
    finally:
        await audit.close()
    for name, _ in AUDIT_COUNTERS.values():
        assert f"{name}_total" in before, name
    assert before["docbroker_audit_values_invalid_total"] == 0
    assert after["docbroker_audit_values_invalid_total"] == 1
    assert after["docbroker_audit_keys_dropped_total"] == 1
    assert after["docbroker_audit_events_total"] == before["docbroker_audit_events_total"] + 1


def test_a_failing_witness_copy_is_counted_on_the_brokers_metrics(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")  # the witness file's folder is a file: every copy fails
    broker = make_broker(
        tmp_path,
        env={
            "DOCBROKER_AUDIT_WITNESS_FILE": str(blocked / "witness.jsonl"),
            "DOCBROKER_AUDIT_CHECKPOINT_EVERY": "1",  # a checkpoint (and its copy) per line
        },
    )
    broker.start()
    try:
        with open_http(broker, broker.token()) as http:
            assert post_modern(http, "tools/list").status_code == 200  # an event, its checkpoint

        def scraped() -> dict[str, float]:
            with open_http(broker) as operator:
                page = operator.get("/metrics", headers=broker.ops_headers)
            assert page.status_code == 200
            return samples(page.text)

        assert wait_for(lambda: scraped()["docbroker_audit_witness_failures_total"] >= 1, timeout=30)
        page = scraped()
        assert page["docbroker_audit_events_total"] >= 1 and page["docbroker_audit_checkpoints_total"] >= 1
        assert page["docbroker_audit_values_invalid_total"] == 0
        assert page["docbroker_audit_write_failures_total"] == 0  # the log itself is fine
    finally:
        broker.stop()
