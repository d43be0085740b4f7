"""Prometheus metrics, in a registry of the broker's own (no process-global state)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# The audit log's own totals (broker/audit/log.py `AuditStats.totals()`, by field name) as
# /metrics names them, each `<name>_total`. The alert rules in k8s/components/prometheus-rules
# and docs/audit.md ("Troubleshooting") are written against these names.
AUDIT_COUNTERS: dict[str, tuple[str, str]] = {
    "written": ("docbroker_audit_events", "Audit events written (the log's checkpoint and gap lines aside)"),
    "keys_dropped": (
        "docbroker_audit_keys_dropped",
        "Audit keys outside the schema dropped, their count written under `dropped` (a broker bug)",
    ),
    "values_invalid": (
        "docbroker_audit_values_invalid",
        "Audit values that did not fit their key, its name written under `invalid` (a broker bug)",
    ),
    "write_failures": (
        "docbroker_audit_write_failures",
        "Audit writes that failed: the log refuses requests (503) until it can write again",
    ),
    "sync_failures": ("docbroker_audit_sync_failures", "Audit fsyncs that failed"),
    "recoveries": ("docbroker_audit_recoveries", "Times the audit log could write again after failing"),
    "checkpoints": ("docbroker_audit_checkpoints", "Signed audit checkpoints written"),
    "gaps": ("docbroker_audit_gaps", "Signed audit gap records written (requests refused while unwritable)"),
    "rotations": ("docbroker_audit_rotations", "Audit log files rotated"),
    "witness_failures": (
        "docbroker_audit_witness_failures",
        "Checkpoints and gap records not copied to the witness file (the log has them)",
    ),
    "stdout_failures": (
        "docbroker_audit_stdout_failures",
        "Audit lines not copied to stdout (DOCBROKER_AUDIT_STDOUT; the log has them)",
    ),
}


class _AuditTotals(Collector):
    """Reads the audit log's totals at each scrape: the log keeps them, nothing is copied."""

    def __init__(self, totals: Callable[[], Mapping[str, int]]) -> None:
        self._totals = totals

    def collect(self) -> Iterator[Metric]:
        totals = self._totals()
        for key, (name, documentation) in AUDIT_COUNTERS.items():
            yield CounterMetricFamily(name, documentation, value=float(totals.get(key, 0)))

    def describe(self) -> Iterator[Metric]:
        for name, documentation in AUDIT_COUNTERS.values():
            yield CounterMetricFamily(name, documentation)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        sandboxes_running: Callable[[], int],
        approvals_pending: Callable[[], int],
        upstream_clients: Callable[[], int],
        audit_totals: Callable[[], Mapping[str, int]],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_AuditTotals(audit_totals))
        self.requests = Counter(
            "docbroker_requests",
            "MCP requests by JSON-RPC method, tool and outcome",
            ("method", "tool", "outcome"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "docbroker_request_seconds",
            "Time from request to last byte of the response",
            ("method",),
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        # Cuts at the edge (`broker.http_edge`): before any identity, so no audit line; a rise
        # is what a slowloris or a header flood looks like from here.
        self.connections_cut = Counter(
            "docbroker_connections_cut",
            "Client connections closed at the edge, by reason "
            "(read_timeout, head_too_large, trailers_too_large)",
            ("reason",),
            registry=self.registry,
        )
        self.policy_reloads = Counter(
            "docbroker_policy_reloads",
            "Policy set reloads by result (ok, failed: the set in force was kept)",
            ("result",),
            registry=self.registry,
        )
        # Notices of new pending approvals (broker/web/webhooks.py): a rise in failed or
        # dropped means approvers are not being told.
        self.webhooks = Counter(
            "docbroker_webhooks",
            "Pending-approval webhooks by outcome (delivered, retried, failed, dropped)",
            ("outcome",),
            registry=self.registry,
        )
        # A sandbox's span records that failed the broker's checks (broker/tracing.py): any rise
        # is a sandbox saying what the server never writes.
        self.sandbox_spans_dropped = Counter(
            "docbroker_sandbox_span_records_dropped",
            "Span records from sandboxes dropped by the tracing checks (DOCBROKER_TRACING)",
            registry=self.registry,
        )
        running = Gauge("docbroker_sandboxes_running", "Tenant sandboxes running", registry=self.registry)
        running.set_function(lambda: float(sandboxes_running()))
        pending = Gauge(
            "docbroker_approvals_pending", "Approvals waiting for a human", registry=self.registry
        )
        pending.set_function(lambda: float(approvals_pending()))
        # One per tenant with a sandbox at most: more, and clients of gone sandboxes are kept.
        clients = Gauge(
            "docbroker_upstream_clients",
            "Sandbox clients (connection pools) the broker keeps",
            registry=self.registry,
        )
        clients.set_function(lambda: float(upstream_clients()))
        # Children by label values: `labels()` checks and locks on every call, on every request.
        self._counted: dict[tuple[str, str, str], Counter] = {}
        self._timed: dict[str, Histogram] = {}

    def observe(self, method: str, tool: str, outcome: str, seconds: float) -> None:
        # Label values come from fixed sets (allow-listed methods, tool names, outcomes),
        # so a client cannot blow up the series count, nor these caches.
        key = (method, tool, outcome)
        counted = self._counted.get(key)
        if counted is None:
            counted = self._counted[key] = self.requests.labels(method, tool, outcome)
        counted.inc()
        timed = self._timed.get(method)
        if timed is None:
            timed = self._timed[method] = self.latency.labels(method)
        timed.observe(seconds)

    def cut(self, reason: str) -> None:
        """A connection was cut at the edge; `reason` is one of the edge's fixed codes."""
        self.connections_cut.labels(reason).inc()

    def webhook(self, outcome: str) -> None:
        """One webhook attempt's or notice's fixed outcome code."""
        self.webhooks.labels(outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
