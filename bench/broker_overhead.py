"""What the broker adds to a tools/call, next to the bare server and a peer proxy, in one run.

    python bench/broker_overhead.py                      # ~2-3 min, prints one table
    python bench/broker_overhead.py --rounds 10 --calls 2000 --seconds 60   # longer, steadier
    python bench/broker_overhead.py --no-mcp-proxy       # without the peer proxy (no PyPI needed)

Run it with the project's environment (e.g. /work/venv/bin/python): the broker and the
document-tools server are started from this checkout (or --root) with that interpreter.

The same document-tools server code, over the same six documents, is called:

  direct (unix socket)   the broker's own sandbox process (local runtime), on its socket
  direct (TCP)           a second `python -m server --http` process, same code and documents
  broker                 `python -m broker serve` over TCP, RS256 JWT checked on every request,
                         audit log on (default fsync=interval), local runtime → the socket above
  mcp-proxy HTTP→HTTP    mcp-proxy (PyPI, own venv, mcp<2) has no HTTP→HTTP mode of its own,
                         so two of them are chained: a server-mode mcp-proxy exposing Streamable
                         HTTP runs a client-mode mcp-proxy (its stdio "server") that connects to
                         the direct (TCP) server's Streamable HTTP. Baseline: direct (TCP).
  mcp-proxy HTTP→stdio   one server-mode mcp-proxy exposing Streamable HTTP in front of
                         `python -m server` over stdio: a single proxy process, the setup
                         mcp-proxy is built for. Baseline: direct (TCP).

The client sends raw JSON-RPC over keep-alive HTTP with httpx2, so what is measured is the
servers and proxies, not an MCP client library: protocol 2026-07-28 (no handshake; headers
MCP-Protocol-Version / Mcp-Method / Mcp-Name, `params._meta`) for direct and broker, and the
2025-11-25 handshake (initialize → Mcp-Session-Id → notifications/initialized) for mcp-proxy,
which speaks only that. The workload everywhere: tools/call alternating search_documents and
read_document. Every response is checked (HTTP 200 and a tool status "ok").

Measurements alternate: each round runs every target once at concurrency 1 (latency) and once
at concurrency 8 (throughput), in a rotated order; per-round numbers are paired and the median
over rounds is reported. Added latency = the target's p50 minus its baseline's p50 in the same
round. CPU per call is read from /proc for the processes behind each target during the c=8 runs.

Targets (issue 3, item 7): broker added p50 ≤ 1.5 ms at c=1; broker throughput ≥ 85% of direct
at c=8; broker added latency ≤ 1/3 of mcp-proxy's (checked against the smaller of the two
mcp-proxy setups, the one most favourable to mcp-proxy). Exit status: 0 all PASS, 1 a FAIL,
2 the benchmark could not run.

Only loopback traffic; every process started here is stopped and the temporary folder removed
at exit (also on Ctrl-C / SIGTERM). mcp-proxy's venv is created on first use (pip, PyPI) in
~/.cache/docbroker-bench/ and reused, outside the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

# Run as a file: this checkout's bench/ and broker/, not an installed copy's.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.clients import CLIENTS, CallFailed, Target, measure_latency, measure_throughput, wait_ready
from bench.overhead_table import Series, build_report, report_lines, verdicts
from bench.processes import Noise, Processes, become_subreaper, free_port
from bench.targets import broker_setup, compared_broker, docs_root, ensure_mcp_proxy, revision, server_env
from bench.workload import CALLS, DEFAULT_PROXY_VENV, REPO, TENANT, documents


# -- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    p.add_argument(
        "--calls", type=int, default=500, help="c=1 calls per target, over all rounds (default 500)"
    )
    p.add_argument(
        "--seconds", type=float, default=15.0, help="c=N seconds per target, over all rounds (default 15)"
    )
    p.add_argument(
        "--concurrency", type=int, default=8, help="concurrency of the throughput runs (default 8)"
    )
    p.add_argument("--warmup", type=int, default=100, help="c=1 warm-up calls per target before round 1")
    p.add_argument(
        "--client",
        choices=sorted(CLIENTS),
        default="raw",
        help="load generator: raw asyncio HTTP/1.1 (default, ~0.3 ms CPU/call) or httpx2 (~2 ms)",
    )
    p.add_argument("--no-mcp-proxy", action="store_true", help="leave mcp-proxy out (no PyPI access needed)")
    p.add_argument(
        "--mcp-proxy-venv", type=Path, default=DEFAULT_PROXY_VENV, help="venv for mcp-proxy (created)"
    )
    p.add_argument("--root", type=Path, default=REPO, help="checkout whose broker/ and server/ to run")
    p.add_argument(
        "--compare",
        type=Path,
        metavar="CHECKOUT",
        help="also run the broker (and its sandbox) of another checkout, in the same rounds: an A/B",
    )
    p.add_argument(
        "--broker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra DOCBROKER_* for the broker",
    )
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, audit log)")
    p.add_argument(
        "--hold",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="after the table, keep the broker under load this long (attach a profiler to its pid)",
    )
    p.add_argument(
        "--hold-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="concurrency of the --hold load (default: --concurrency)",
    )
    args = p.parse_args(argv)
    if args.rounds < 1 or args.calls < args.rounds or args.seconds <= 0 or args.concurrency < 1:
        p.error("need rounds ≥ 1, calls ≥ rounds, seconds > 0, concurrency ≥ 1")
    return args


def run(args: argparse.Namespace, procs: Processes, tmp: Path) -> int:
    root = args.root.resolve()
    py = sys.executable
    extra = dict(kv.split("=", 1) for kv in args.broker_env)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    proxy_exe = None
    if not args.no_mcp_proxy:
        proxy_exe = ensure_mcp_proxy(args.mcp_proxy_venv, quiet=False)
        if proxy_exe is None:
            say("mcp-proxy unavailable: its rows and the ratio target are skipped")

    say("starting broker, servers" + (" and mcp-proxy" if proxy_exe else "") + "…")
    bs = broker_setup(root, tmp, extra)
    broker = procs.start("broker", [py, "-m", "broker", "serve"], bs.env, tmp / "broker.log", root)
    docs, secret = docs_root(tmp)
    tcp_port = free_port()
    tcp_server = procs.start(
        "server (TCP)",
        [py, "-m", "server", "--http", f"127.0.0.1:{tcp_port}"],
        server_env(root, docs, secret),
        tmp / "server-tcp.log",
        root,
    )
    token = {"value": ""}

    def bearer() -> str:
        return token["value"]

    token["value"] = bs.mint()

    def sandbox_pids() -> list[int]:
        return broker.remember_family()

    targets: list[Target] = []
    t_broker = Target(
        "broker",
        "broker (JWT+audit, TCP → uds)",
        bs.url,
        token=bearer,
        baseline="direct_uds",
        proxy_pids=lambda: [broker.pid],
        server_pids=sandbox_pids,
    )
    t_tcp = Target(
        "direct_tcp",
        "direct (TCP)",
        f"http://127.0.0.1:{tcp_port}/mcp",
        server_pids=lambda: [tcp_server.pid],
    )
    wait_ready(t_tcp, tcp_server)
    wait_ready(t_broker, broker)  # the first call provisions the tenant and starts its sandbox
    sock = bs.data_dir / "run" / TENANT / "mcp.sock"
    if not sock.exists():
        found = sorted(bs.data_dir.rglob("*.sock"))
        if not found:
            raise RuntimeError("the broker's sandbox socket was not found under its data dir")
        sock = found[0]
    t_uds = Target(
        "direct_uds",
        "direct (unix socket, broker's sandbox)",
        "http://localhost/mcp",
        uds=str(sock),
        server_pids=sandbox_pids,
    )
    wait_ready(t_uds, None)
    bare_port = free_port()
    bare = procs.start(
        "bare forwarder",
        [py, str(REPO / "bench" / "bare_forwarder.py"), "--socket", str(sock), "--port", str(bare_port)],
        # The floor is this checkout's (the script imports its modules), whatever --root says.
        {"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        tmp / "bare-forwarder.log",
        root,
    )
    t_bare = Target(
        "bare",
        "bare forwarder (floor: no checks)",
        f"http://127.0.0.1:{bare_port}/mcp",
        baseline="direct_uds",
        proxy_pids=lambda: [bare.pid],
        server_pids=sandbox_pids,
    )
    wait_ready(t_bare, bare)
    targets = [t_uds, t_tcp, t_broker, t_bare]
    if args.compare is not None:
        targets.append(compared_broker(args.compare.resolve(), procs, tmp / "compare", extra))

    if proxy_exe is not None:
        p1, p2 = free_port(), free_port()
        quiet = ["--log-level", "WARNING"]
        chain = procs.start(
            "mcp-proxy (HTTP→HTTP)",
            [str(proxy_exe), "--host", "127.0.0.1", "--port", str(p1), *quiet, "--",
             str(proxy_exe), "--transport", "streamablehttp", *quiet, f"http://127.0.0.1:{tcp_port}/mcp"],
            {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")},
            tmp / "mcp-proxy-http.log",
            root,
        )  # fmt: skip
        senv = server_env(root, docs, secret)
        wrapped = procs.start(
            "mcp-proxy (HTTP→stdio)",
            [str(proxy_exe), "--host", "127.0.0.1", "--port", str(p2), *quiet, "--cwd", str(root),
             *[a for k in ("PYTHONPATH", "DOCS_ROOT", "DOCS_SCOPE", "DOCS_SECRET_FILE")
               for a in ("-e", k, senv[k])],
             "--", py, "-m", "server"],
            {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")},
            tmp / "mcp-proxy-stdio.log",
            root,
        )  # fmt: skip
        t_chain = Target(
            "mcp_proxy_http",
            "mcp-proxy HTTP→stdio→HTTP (2 procs)",
            f"http://127.0.0.1:{p1}/mcp",
            legacy=True,
            baseline="direct_tcp",
            proxy_pids=lambda: [chain.pid, *chain.remember_family()],
            server_pids=lambda: [tcp_server.pid],
        )
        stdio_server: list[int] = []

        def wrapped_split() -> tuple[list[int], list[int]]:
            kids = wrapped.remember_family()
            if not stdio_server:
                for pid in kids:
                    with contextlib.suppress(OSError):
                        if b"server" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                            stdio_server.append(pid)
            return [wrapped.pid, *(k for k in kids if k not in stdio_server)], stdio_server

        t_wrapped = Target(
            "mcp_proxy_stdio",
            "mcp-proxy HTTP→stdio server",
            f"http://127.0.0.1:{p2}/mcp",
            legacy=True,
            baseline="direct_tcp",
            proxy_pids=lambda: wrapped_split()[0],
            server_pids=lambda: wrapped_split()[1],
        )
        wait_ready(t_chain, chain)
        wait_ready(t_wrapped, wrapped)
        targets += [t_chain, t_wrapped]

    say(f"warming up ({args.warmup} calls at c=1 and 1 s at c={args.concurrency} per target)…")
    for t in targets:
        measure_latency(t, args.client, args.warmup)
        measure_throughput(t, args.client, args.concurrency, 1.0)

    data = {t.key: Series() for t in targets}
    per_round_calls = max(1, args.calls // args.rounds)
    per_round_seconds = args.seconds / args.rounds
    started = time.monotonic()
    loads = [os.getloadavg()[0]]
    noise = Noise()
    for r in range(args.rounds):
        token["value"] = bs.mint()  # fresh, well inside its lifetime, whatever --seconds is
        order = targets[r % len(targets) :] + targets[: r % len(targets)]
        if r % 2:
            order.reverse()
        for t in order:
            latency = measure_latency(t, args.client, per_round_calls)
            data[t.key].lat_rounds.append(latency.latencies)
            data[t.key].lat_proxy_cpu.append(latency.proxy_cpu / max(latency.calls, 1))
        for t in order:
            data[t.key].load_rounds.append(
                measure_throughput(t, args.client, args.concurrency, per_round_seconds)
            )
        loads.append(os.getloadavg()[0])
        say(
            f"round {r + 1}/{args.rounds} done ({time.monotonic() - started:.0f} s, load avg {loads[-1]:.1f})"
        )

    report = build_report(targets, data, args.concurrency)
    audit_lines = 0
    with contextlib.suppress(OSError):
        with (bs.data_dir / "audit.jsonl").open("rb") as f:
            audit_lines = sum(1 for _ in f)
    broker_calls = data["broker"]
    cpus = os.cpu_count() or 1
    foreign, steal = noise.foreign()
    header = [
        f"docbroker broker overhead — {time.strftime('%Y-%m-%d %H:%M:%S')}, {socket.gethostname()}, "
        f"{cpus} CPUs; during the rounds other processes used {foreign * 100:.0f}% of the CPUs"
        f"{f', VM steal {steal * 100:.0f}%' if steal >= 0.005 else ''}, "
        f"load avg {min(loads):.1f} to {max(loads):.1f}; "
        f"code: {revision(root)}",
        f"workload: tools/call alternating {' / '.join(n for n, _ in CALLS)} "
        f"over {len(documents())} documents; "
        f"{args.rounds} alternating rounds; c=1: {per_round_calls} calls/round/target "
        f"(p50 = median of round p50s, p99 over all {len(broker_calls.all_latencies)}); "
        f"c={args.concurrency}: {per_round_seconds:.1f} s/round/target (median calls/s)",
        f"client: {args.client} (keep-alive, one connection per concurrent caller); "
        f"broker: RS256 JWT per request, audit log on ({audit_lines} lines written, "
        f"fsync={extra.get('DOCBROKER_AUDIT_FSYNC', 'default')}), local runtime, "
        "tenant limits set out of reach",
    ]
    if foreign + steal > 0.10:
        header.append(
            "WARNING: not an idle machine: other processes (or the hypervisor) took "
            f"{(foreign + steal) * 100:.0f}% of the CPUs while this measured; latencies include "
            "their scheduling delays. Rerun when idle."
        )
    lines = report_lines(report, header)
    print("\n".join(lines))
    report["header"] = header
    report["load_avg"] = loads
    report["foreign_cpu_share"], report["steal_share"] = foreign, steal
    report["verdicts"] = verdicts(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))

    if args.hold > 0:
        held = args.hold_concurrency or args.concurrency
        say(f"holding the broker (pid {broker.pid}) under c={held} load for {args.hold:.0f} s…")
        measure_throughput(t_broker, args.client, held, args.hold)

    failed = any(v[3] == "FAIL" for v in report["verdicts"])
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="docbroker-bench-"))
    become_subreaper()
    procs = Processes()

    def on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        return run(args, procs, tmp)
    except (RuntimeError, CallFailed, httpx2.HTTPError) as exc:
        print(f"broker_overhead: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish the clean-up
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        procs.stop_all()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
