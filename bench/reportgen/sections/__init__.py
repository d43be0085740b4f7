"""The report's sections, in the order REPORT.md shows them: (key, title, function)."""

from __future__ import annotations

from collections.abc import Callable

from bench.reportgen.runner import Context, Part
from bench.reportgen.sections import approval, audit, overhead, policy, reliability, scale, startup

Section = tuple[str, str, Callable[[Context], Part]]

SECTIONS: list[Section] = [
    ("overhead", "Broker overhead vs direct, the bare forwarder and mcp-proxy", overhead.section),
    ("cold", "First call, pooled and cold", startup.cold_section),
    ("burst", "A burst of new tenants", startup.burst_section),
    ("scale", "Throughput and p99 against the number of tenants", scale.scale_section),
    ("memory", "Memory per tenant: Docker and Pod", scale.memory_section),
    ("audit", "Audit cost with checkpoints", audit.section),
    ("approval", "Approval round trip on SQLite and PostgreSQL", approval.section),
    ("policy", "Policy decision cost", policy.section),
    ("reliability", "Reliability runs: accounting", reliability.section),
]
