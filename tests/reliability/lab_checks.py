"""The lab run's own checks, beside the shared ones of tests/reliability/accounting.py (which
this run calls for everything they cover). These are what only a cluster run has, from its
files and what it observed: the kubelet's restarts of the broker containers, where approvals
were decided, the faults' entry, the time to a fresh call after them.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.reliability.accounting import Check


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def no_broker_container_restarted(restarts: Mapping[str, int]) -> Check:
    """No broker container was restarted by the kubelet (a liveness probe that went unanswered,
    a crash): the only broker Pod that ends is the one the run deletes."""
    return Check(
        "no_broker_container_restarted",
        not any(restarts.values()),
        sum(1 for n in restarts.values() if n),
        tuple(pod for pod, n in sorted(restarts.items()) if n),
    )


def approved_on_both_replicas(ops: Iterable[dict[str, Any]]) -> Check:
    """Saves written `ok` were approved on the other replica than the one that asked, and on
    the same one: both paths ran."""
    where = Counter(o.get("approved_where") for o in ops if o["op"] == "save" and o["outcome"] == "ok")
    missing = [w for w in ("other", "same") if not where[w]]
    return Check("approved_on_the_other_replica_and_the_same", not missing, len(missing), tuple(missing))


def faults_entered(faults: Iterable[tuple[str, bool]]) -> Check:
    missed = [name for name, entered in faults if not entered]
    return Check("every_fault_entered", not missed, len(missed), tuple(missed))


def pod_in_use_kept(facts: Mapping[str, Any]) -> Check:
    """The reaper's phase: the Pod of the tenant in use on the other replica was never
    replaced, and every one of its calls was answered ok."""
    found = (("pod_replaced", not facts["pod_kept"]), ("calls_not_ok", bool(facts["calls_not_ok"])))
    bad = [name for name, failed in found if failed]
    return Check("pod_in_use_on_a_replica_not_reaped", not bad, len(bad), tuple(bad))


def fresh_call_within(taken: Mapping[str, float], limit_s: float, replicas: int) -> Check:
    """Each Ready broker Pod answered a fresh call within `limit_s` of the faults' end."""
    late = [pod for pod, s in sorted(taken.items()) if not s <= limit_s]
    missing = max(0, replicas - len(taken))
    return Check(
        "replicas_answer_within_10s_of_the_faults_end",
        not late and not missing,
        len(late) + missing,
        tuple(late),
    )


def by_outcome(ops: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for o in ops:
        table[o["op"]][o["outcome"]] += 1
    return {op: dict(c) for op, c in table.items()}
