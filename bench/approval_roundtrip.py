"""The approval round trip on SQLite and on PostgreSQL, side by side in one run (issue 17).

    python bench/approval_roundtrip.py                 # ~1 min as root: starts its own PostgreSQL
    python bench/approval_roundtrip.py --rounds 10 --per-round 50
    python bench/approval_roundtrip.py --database-url postgresql://…   # an existing (empty) database

Two real brokers (`python -m broker serve`, local runtime, the tests' setup from
broker/testing/) that differ only in their approvals store: the embedded SQLite file,
and PostgreSQL (a throw-away cluster from .ci/postgres.sh, unix socket, unless a URL is
given; its schema is created with `docbroker db upgrade`). One round trip, at concurrency 1:

  propose   tools/call save_report → `waiting_approval` (a pending record is written)
  approve   GET /v1/approvals/{id} then POST …/approve (a human reads, then decides, over REST)
  consume   tools/call save_report again → `ok` (the record is consumed, the report written)

Rounds alternate between the two brokers in a rotated order, so drift on a shared machine
hits both. Target: PostgreSQL adds at most 3 ms p50 to the whole round trip. Exit status:
0 PASS, 1 FAIL, 2 the benchmark could not run. Everything started here is stopped, and the
temporary folder removed, at exit (also on Ctrl-C / SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench._stats import pct  # noqa: E402
from bench.workload import call_body, call_headers  # noqa: E402
from broker.testing import Broker, make_broker  # noqa: E402

TENANT = "bench"
TARGET_ADDED_MS = 3.0
STEPS = ("propose", "approve", "consume", "round trip")


@dataclass
class Target:
    name: str
    broker: Broker
    samples: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STEPS})
    mcp: httpx2.Client | None = None
    rest: httpx2.Client | None = None

    def open(self) -> None:
        b = self.broker
        scope = "docs:read docs:write"
        self.mcp = httpx2.Client(
            base_url=b.url, headers=_auth(b.token(TENANT, "bench-user", scope)), timeout=30
        )
        approver = b.token(TENANT, "bench-approver", "reports:approve")
        self.rest = httpx2.Client(base_url=b.url, headers=_auth(approver), timeout=30)

    def close(self) -> None:
        for client in (self.mcp, self.rest):
            if client is not None:
                client.close()

    def round_trip(self, record: bool) -> None:
        assert self.mcp is not None and self.rest is not None
        name, content = f"r-{secrets.token_hex(6)}.md", f"report {secrets.token_hex(8)}\n"
        t0 = time.perf_counter()
        waiting = _save(self.mcp, name, content)
        t1 = time.perf_counter()
        if waiting["status"] != "waiting_approval":
            raise RuntimeError(f"{self.name}: propose gave {waiting['status']}")
        # The human's part: read the content (a yes counts only then), approve.
        self.rest.get(f"/v1/approvals/{waiting['data']['approval_id']}")
        approved = self.rest.post(f"/v1/approvals/{waiting['data']['approval_id']}/approve")
        t2 = time.perf_counter()
        if approved.status_code != 200:
            raise RuntimeError(f"{self.name}: approve gave HTTP {approved.status_code}")
        done = _save(self.mcp, name, content)
        t3 = time.perf_counter()
        if done["status"] != "ok":
            raise RuntimeError(f"{self.name}: consume gave {done['status']}")
        if record:
            for step, seconds in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
                self.samples[step].append(seconds * 1000)


def _auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _save(http: httpx2.Client, name: str, content: str) -> dict[str, Any]:
    body = call_body("save_report", {"filename": name, "content": content})
    reply = http.post("/mcp", json=body, headers=call_headers("save_report"))
    if reply.status_code != 200:
        raise RuntimeError(f"save_report gave HTTP {reply.status_code}")
    result: dict[str, Any] = reply.json()["result"]["structuredContent"]
    return result


def start_postgres(tmp: Path) -> str:
    tmp.chmod(0o755)  # the cluster belongs to an unprivileged user, who must reach its socket
    pg = tmp / "pg"
    subprocess.run(
        ["bash", str(REPO / ".ci" / "postgres.sh"), "start", str(pg)], check=True, capture_output=True
    )
    env = dict(line.split("=", 1) for line in (pg / "env").read_text().splitlines() if "=" in line)
    return env["DOCBROKER_TEST_DATABASE_URL"]


def upgrade(broker: Broker) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "broker", "db", "upgrade"],
        cwd=REPO,
        env=broker.env,
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        raise RuntimeError(f"docbroker db upgrade failed: {run.stderr.strip()[-300:]}")


def summary(targets: list[Target], rounds: int, per_round: int) -> dict[str, Any]:
    """The table's numbers, for --json: per step and store, p50 and p90 in ms."""
    sqlite, postgres = targets
    added = pct(postgres.samples["round trip"], 0.5) - pct(sqlite.samples["round trip"], 0.5)
    return {
        "n": len(sqlite.samples["round trip"]),
        "rounds": rounds,
        "per_round": per_round,
        "steps": {
            step: {
                t.name: {"p50_ms": pct(t.samples[step], 0.5), "p90_ms": pct(t.samples[step], 0.9)}
                for t in targets
            }
            for step in STEPS
        },
        "added_p50_ms": added,
        "target_added_ms": TARGET_ADDED_MS,
        "verdict": "PASS" if added <= TARGET_ADDED_MS else "FAIL",
    }


def report(targets: list[Target], rounds: int, per_round: int) -> bool:
    sqlite, postgres = targets
    n = len(sqlite.samples["round trip"])
    print(f"approval round trip, c=1, n={n} per store ({rounds} rounds x {per_round}), ms")
    print(f"{'step':<12}{'sqlite p50 / p90':>20}{'postgresql p50 / p90':>24}{'added p50':>12}")
    for step in STEPS:
        a, b = sqlite.samples[step], postgres.samples[step]
        print(
            f"{step:<12}{f'{pct(a, 0.5):.2f} / {pct(a, 0.9):.2f}':>20}"
            f"{f'{pct(b, 0.5):.2f} / {pct(b, 0.9):.2f}':>24}{pct(b, 0.5) - pct(a, 0.5):>+12.2f}"
        )
    added = pct(postgres.samples["round trip"], 0.5) - pct(sqlite.samples["round trip"], 0.5)
    ok = added <= TARGET_ADDED_MS
    print(f"target: PostgreSQL adds <= {TARGET_ADDED_MS:.0f} ms p50 to the round trip: {added:+.2f} ms "
          f"{'PASS' if ok else 'FAIL'}")  # fmt: skip
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument(
        "--database-url", default=None, help="an empty PostgreSQL database (default: start one)"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    tmp = Path(tempfile.mkdtemp(prefix="docbroker-bench-approvals-"))
    targets: list[Target] = []
    try:
        url = args.database_url or start_postgres(tmp)
        limits = "[limits]\nrate_per_minute = 1000000\nburst = 1000000\n[approvals]\nmax_pending = 100000\n"
        for name, env in (("sqlite", {}), ("postgresql", {"DOCBROKER_DATABASE_URL": url})):
            broker = make_broker(tmp / name, tenants=(TENANT,), env=env, limits=limits)
            if env:
                upgrade(broker)
            broker.start()
            targets.append(Target(name, broker))
        for target in targets:
            target.open()
            for _ in range(args.warmup):
                target.round_trip(record=False)
        for r in range(args.rounds):
            for target in targets[r % 2 :] + targets[: r % 2]:
                for _ in range(args.per_round):
                    target.round_trip(record=True)
        ok = report(targets, args.rounds, args.per_round)
        if args.json:
            args.json.write_text(json.dumps(summary(targets, args.rounds, args.per_round), indent=2))
        return 0 if ok else 1
    except (RuntimeError, OSError, subprocess.CalledProcessError, httpx2.HTTPError) as exc:
        print(f"approval_roundtrip: could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    finally:
        for target in targets:
            target.close()
            target.broker.stop()
        if args.database_url is None and (tmp / "pg").exists():
            subprocess.run(
                ["bash", str(REPO / ".ci" / "postgres.sh"), "stop", str(tmp / "pg")], capture_output=True
            )
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
