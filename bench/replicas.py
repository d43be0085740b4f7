"""Reads through one replica vs two, and a replica killed and restarted under load (issue 17).

    python bench/replicas.py                       # ~1-2 min, prints two tables
    python bench/replicas.py --rounds 8 --calls 300 --kill-seconds 40
    python bench/replicas.py --own-data-dirs       # a data dir (and sandbox) each (see below)

Two real replicas (`python -m broker serve`, local runtime) of one deployment, set up by the
tests' harness (broker/testing/replicas.py): one identity provider, one master key, the same
policies and documents, distinct ports and replica ids. The client sends raw JSON-RPC
(protocol 2026-07-28) over keep-alive HTTP; the workload is tools/call alternating
search_documents and read_document, every answer checked (HTTP 200, tool status "ok").

1. Reads: "one replica" sends every call to replica a; "two replicas" spreads them round-robin
   over a and b. Each round runs both, in a rotated order, at concurrency 1 (latency) and at
   concurrency 4 (throughput); medians over rounds. CPU per call: the broker processes' own
   CPU time (/proc), sandboxes not included, during the c=4 runs.
2. Kill: 4 client threads in a steady loop through the round-robin "load balancer", which on a
   connection error retries the call on the other replica (broker/testing/replicas.py RoundRobin);
   a few seconds in, replica b is SIGKILLed and started again. Reported: calls, failed calls
   (an error after the retries, or an answer that is not "ok"), retries, time b was away.
   Target: zero failed.

Sandboxes: by default both replicas share one data dir and so one sandbox per tenant (issue 17
item 3: whichever replica starts it, the other adopts it, and a restarted replica adopts it
again); `--own-data-dirs` gives each a data dir and sandbox of its own. Exit status: 0 PASS,
1 FAIL, 2 the benchmark could not run. Everything started here is stopped, and the temporary
folder removed, at exit (also on Ctrl-C / SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.workload import call_body, call_headers  # noqa: E402
from broker.testing.replicas import Replica, Replicas, RoundRobin, make_replicas  # noqa: E402

TENANT = "bench"
CALLS = (
    ("search_documents", {"query": "budget", "max_results": 3}),
    ("read_document", {"filename": "doc2.md"}),
)
DOCUMENTS = {
    f"doc{i}.md": f"# Document {i}\n\nThe budget for quarter {i} is {i * 1000} units.\n" * 20
    for i in range(6)
}


SEPARATE = "a data dir (and sandbox) each"


class CallFailed(Exception):
    pass


def call(lb: RoundRobin, token: str, i: int) -> None:
    tool, arguments = CALLS[i % len(CALLS)]
    response = lb.post(token, "/mcp", json=call_body(tool, arguments, i), headers=call_headers(tool))
    if response.status_code != 200:
        raise CallFailed(f"HTTP {response.status_code}")
    reply = response.json()
    status = reply.get("result", {}).get("structuredContent", {}).get("status")
    if status != "ok":
        raise CallFailed(f"tool status {status!r}")


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def pids(replicas: list[Replica]) -> list[int]:
    return [r.proc.pid for r in replicas if r.proc is not None]


# -- part 1: reads --------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    members: list[Replica]
    p50: list[float] = field(default_factory=list)
    p90: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)


def latency_round(target: Target, token: str, calls: int) -> None:
    lb = RoundRobin(target.members)
    times = []
    try:
        for i in range(calls):
            started = time.perf_counter()
            call(lb, token, i)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        lb.close()
    times.sort()
    target.p50.append(statistics.median(times))
    target.p90.append(times[int(len(times) * 0.9)])


def throughput_round(target: Target, token: str, calls: int, concurrency: int) -> None:
    lb = RoundRobin(target.members)
    errors: list[BaseException] = []
    per_thread = calls // concurrency

    def worker(offset: int) -> None:
        try:
            for i in range(per_thread):
                call(lb, token, offset + i)
        except BaseException as exc:  # reported below: the run is void
            errors.append(exc)
        finally:
            lb.close()  # this thread's connections

    before = cpu_seconds(pids(target.members))
    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k * per_thread,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    done = per_thread * concurrency
    target.rate.append(done / elapsed)
    target.cpu_ms.append((cpu_seconds(pids(target.members)) - before) * 1000 / done)


def reads(replicas: Replicas, token: str, rounds: int, calls: int, concurrency: int) -> list[Target]:
    a, b = replicas
    targets = [Target("one replica", [a]), Target("two replicas", [a, b])]
    for target in targets:  # warm: each replica's sandbox up, connections open
        latency_round(target, token, 20)
        target.p50.clear()
        target.p90.clear()
    for n in range(rounds):
        order = targets if n % 2 == 0 else targets[::-1]
        for target in order:
            latency_round(target, token, calls)
            throughput_round(target, token, calls, concurrency)
    return targets


# -- part 2: kill -----------------------------------------------------------------------------------


@dataclass
class KillReport:
    calls: int
    failed: int
    retries: int
    served: list[int]
    away_seconds: float
    failures: list[str]


def kill_test(replicas: Replicas, token: str, seconds: float, clients: int) -> KillReport:
    _, b = replicas
    lb = RoundRobin(replicas, attempts=4)
    stop = threading.Event()
    lock = threading.Lock()
    counts = {"calls": 0, "failed": 0}
    failures: list[str] = []

    def worker(k: int) -> None:
        i = k * 1_000_000
        while not stop.is_set():
            i += 1
            try:
                call(lb, token, i)
                ok = True
            except (httpx2.HTTPError, CallFailed, ValueError) as exc:
                ok = False
                with lock:
                    failures.append(type(exc).__name__ + (f": {exc}" if isinstance(exc, CallFailed) else ""))
            with lock:
                counts["calls"] += 1
                counts["failed"] += 0 if ok else 1
        lb.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    time.sleep(seconds / 3)
    killed = time.monotonic()
    b.kill()
    b.start()  # returns once /healthz answers
    away = time.monotonic() - killed
    time.sleep(max(seconds - seconds / 3 - away, 1.0))
    stop.set()
    for t in threads:
        t.join()
    return KillReport(counts["calls"], counts["failed"], lb.retries, list(lb.served), away, failures[:5])


# -- main -----------------------------------------------------------------------------------------


def setup(tmp: Path, share: bool) -> Replicas:
    """Two replicas, not started, with the documents in each data dir (once when shared)."""
    replicas = make_replicas(
        tmp,
        2,
        tenants=(TENANT,),
        share_data_dir=share,
        # No DOCBROKER_REPLICAS: it only shares out the limits (set far above the load here), and
        # above 1 the broker wants a shared database (SQLite is refused): these calls are reads.
        limits="[limits]\nrate_per_minute = 1000000\nburst = 1000000\nmax_concurrent = 256\n",
    )
    for member in replicas:
        sources = member.sources(TENANT)
        sources.mkdir(parents=True, exist_ok=True)
        for name, text in DOCUMENTS.items():
            (sources / name).write_text(text)
    return replicas


def print_reads(targets: list[Target], concurrency: int) -> None:
    print(
        f"{'reads (tools/call)':<16} {'p50 ms c=1':>11} {'p90 ms c=1':>11} "
        f"{f'calls/s c={concurrency}':>13} {'broker CPU ms/call':>19}"
    )
    for t in targets:
        print(
            f"{t.name:<16} {statistics.median(t.p50):>11.2f} {statistics.median(t.p90):>11.2f} "
            f"{statistics.median(t.rate):>13.0f} {statistics.median(t.cpu_ms):>19.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200, help="calls per target per round")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kill-seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--own-data-dirs", action="store_true", help="a data dir and sandbox each")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="docbroker-bench-replicas-"))
    replicas: Replicas | None = None

    def on_signal(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        replicas = setup(tmp, not args.own_data_dirs)
        replicas.start()
        token = replicas[0].token(
            TENANT, subject="bench-user", scope="docs:read", exp=int(time.time()) + 3000
        )
        print(
            f"two replicas, local runtime, {SEPARATE if args.own_data_dirs else 'one shared data dir'}; "
            f"{args.rounds} rounds x {args.calls} calls"
        )
        targets = reads(replicas, token, args.rounds, args.calls, args.concurrency)
        print_reads(targets, args.concurrency)
        kill = kill_test(replicas, token, args.kill_seconds, args.clients)
    except (RuntimeError, OSError, CallFailed, httpx2.HTTPError) as exc:
        print(f"benchmark could not run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 2
    finally:
        if replicas is not None:
            replicas.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(
        f"kill test: {args.clients} clients, {args.kill_seconds:.0f} s, "
        "replica b SIGKILLed at 1/3 and restarted"
    )
    print(f"{'calls':>7} {'failed':>7} {'retries':>8} {'served a/b':>12} {'b away s':>9}")
    print(
        f"{kill.calls:>7} {kill.failed:>7} {kill.retries:>8} "
        f"{f'{kill.served[0]}/{kill.served[1]}':>12} {kill.away_seconds:>9.2f}"
    )
    for failure in kill.failures:
        print(f"  failed: {failure}")
    ok = kill.failed == 0
    print(f"target: zero failed requests while a replica is killed and restarted: {'PASS' if ok else 'FAIL'}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "reads": [t.__dict__ | {"members": [m.replica_id for m in t.members]} for t in targets],
                    "kill": kill.__dict__,
                },
                indent=2,
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
