"""`docbroker audit query`: the filters, the output forms, rotation, --follow and bad input.

Logs are written by the real AuditLog (with a clock the test sets, so time ranges are exact);
the command runs as the real CLI in a child process, as a security team would run it. Expected
results are computed from the parsed log with plain json, independently of query's byte filters.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.audit import AuditLog
from broker.audit.processors import rfc3339_ms
from broker.settings import AuditSettings
from tests.broker.audit.audit_helpers import plain, read_events, request_fields

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]
T0 = 1_796_000_000 * 10**9  # 2026-11-30T00:53:20Z, in ns
HOUR = 3600 * 10**9
TENANTS = ("acme", "globex", "initech")
SUBJECTS = ("alice@example.com", "bob", 'mallory","tenant":"acme')  # the last one forges a needle
OUTCOMES = (("ok", "ok"), ("denied", "scope_missing"), ("failed", "upstream_error"), ("rejected", "bad_args"))


class Clock:
    def __init__(self, start: int) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", "audit", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )


async def write_log(path: Path, n: int, *, start: int = T0, step: int = HOUR // 4) -> None:
    """n varied events, one every `step` ns from `start`, through the real writer."""
    clock = Clock(start)
    async with await AuditLog.open(plain(path), clock=clock) as log:
        for i in range(n):
            clock.now = start + i * step
            outcome, reason = OUTCOMES[i % len(OUTCOMES)]
            fields = request_fields(i) | {
                "tenant": TENANTS[i % 3],
                "subject": SUBJECTS[i % 5 % 3],
                "outcome": outcome,
                "reason": reason,
            }
            if i % 7 == 6:
                failed = {"tenant": fields["tenant"], "sandbox": f"ctr-{i}", "reason": "start_failed"}
                await log.emit("sandbox.failed", **failed)
            elif outcome == "denied":
                await log.emit("policy.denied", **fields)
            else:
                await log.emit("mcp.request", **fields)


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture
async def log(log_path: Path) -> list[dict[str, Any]]:
    await write_log(log_path, 60)
    return read_events(log_path)


def ts(ns: int) -> str:
    return rfc3339_ms(ns)


def where(**wanted: object) -> Callable[[dict[str, Any]], bool]:
    """Events whose fields hold these values (a tuple: one of them)."""

    def check(e: dict[str, Any]) -> bool:
        return all(e.get(k) in (v if isinstance(v, tuple) else (v,)) for k, v in wanted.items())

    return check


def between(low: int, high: int | None = None) -> Callable[[dict[str, Any]], bool]:
    return lambda e: ts(low) <= e["ts"] and (high is None or e["ts"] < ts(high))


ACME_DENIED = where(tenant="acme", outcome="denied")
CASES: list[tuple[list[str], Callable[[dict[str, Any]], bool]]] = [
    (["--tenant", "acme"], where(tenant="acme")),
    (["--tenant", "acme", "--tenant", "initech"], where(tenant=("acme", "initech"))),
    (["--subject", "bob"], where(subject="bob")),
    (["--subject", SUBJECTS[2]], where(subject=SUBJECTS[2])),
    (["--event", "policy.denied"], where(event="policy.denied")),
    (["--event", "sandbox.failed", "--tenant", "globex"], where(event="sandbox.failed", tenant="globex")),
    (["--outcome", "failed"], where(outcome="failed")),
    (["--reason", "bad_args", "--subject", "bob"], where(reason="bad_args", subject="bob")),
    (["--since", ts(T0 + 3 * HOUR)], between(T0 + 3 * HOUR)),
    (
        ["--since", ts(T0 + 2 * HOUR), "--until", "2026-11-30T06:53:20+01:00"],
        between(T0 + 2 * HOUR, T0 + 5 * HOUR),
    ),
    (
        ["--tenant", "acme", "--outcome", "denied", "--since", ts(T0 + HOUR)],
        lambda e: ACME_DENIED(e) and between(T0 + HOUR)(e),
    ),
    ([], lambda e: True),
]


@pytest.mark.parametrize(("args", "expect"), CASES, ids=[" ".join(a) or "all" for a, _ in CASES])
async def test_filters_select_exactly_the_matching_events(
    log_path: Path, log: list[dict[str, Any]], args: list[str], expect: Callable[[dict[str, Any]], bool]
) -> None:
    assert ts(T0 + 5 * HOUR) == "2026-11-30T05:53:20.000Z"  # the +01:00 bound above is this instant
    wanted = [e for e in log if expect(e)]
    assert wanted, "a filter that selects nothing proves nothing"
    result = run_cli("query", "--json", *args, str(log_path))
    assert result.returncode == 0, result.stderr
    assert json_lines(result.stdout) == wanted
    table = run_cli("query", *args, str(log_path))
    rows = table.stdout.splitlines()
    assert rows[0].split()[:3] == ["TS", "EVENT", "TENANT"]
    assert [r.split()[0] for r in rows[1:]] == [e["ts"] for e in wanted]


async def test_json_output_is_the_log_lines_byte_for_byte(log_path: Path, log: list[dict[str, Any]]) -> None:
    result = run_cli("query", "--json", "--tenant", "globex", str(log_path))
    originals = [line for line in log_path.read_text().splitlines() if '"tenant":"globex"' in line]
    assert result.stdout.splitlines() == originals and originals


async def test_a_subject_spelling_another_field_does_not_match_that_field(log_path: Path) -> None:
    """The byte prefilter must not be fooled: subject 'mallory","tenant":"acme' on a globex line."""
    clock = Clock(T0)
    async with await AuditLog.open(plain(log_path), clock=clock) as audit:
        await audit.emit("mcp.request", **request_fields(1) | {"tenant": "globex", "subject": SUBJECTS[2]})
        await audit.emit("mcp.request", **request_fields(2) | {"tenant": "acme", "subject": "bob"})
    assert SUBJECTS[2] in read_events(log_path)[0]["subject"]
    result = run_cli("query", "--json", "--tenant", "acme", str(log_path))
    assert [e["request_id"] for e in json_lines(result.stdout)] == ["req-000002"]


async def test_rotated_files_in_any_order_come_out_in_log_order(tmp_path: Path) -> None:
    first, second, live = tmp_path / "audit.jsonl.2", tmp_path / "audit.jsonl.1", tmp_path / "audit.jsonl"
    await write_log(first, 10, start=T0)
    await write_log(second, 10, start=T0 + 10 * HOUR)
    await write_log(live, 10, start=T0 + 20 * HOUR)
    expected = [e for p in (first, second, live) for e in read_events(p) if e.get("tenant") == "acme"]
    # a shell glob gives audit.jsonl, audit.jsonl.1, audit.jsonl.2: newest first
    result = run_cli("query", "--json", "--tenant", "acme", str(live), str(second), str(first))
    assert result.returncode == 0, result.stderr
    assert json_lines(result.stdout) == expected and len(expected) > 10


def evidence_line(seq: int) -> bytes:
    # The shape of the log's own lines (checkpoints, gaps): event audit.*, no tenant or subject.
    record = {
        "event": "audit.checkpoint",
        "prev": "0" * 64,
        "seq": seq,
        "ts": ts(T0),
        "v": 1,
        "tree_size": seq - 1,
    }
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n"


async def test_evidence_lines_are_left_out_unless_asked_for(log_path: Path, log: list[Any]) -> None:
    with log_path.open("ab") as f:
        f.write(evidence_line(len(log) + 1))
    plain = json_lines(run_cli("query", "--json", str(log_path)).stdout)
    assert plain == log
    included = json_lines(run_cli("query", "--json", "--evidence", str(log_path)).stdout)
    assert included[:-1] == log and included[-1]["event"] == "audit.checkpoint"
    only = json_lines(run_cli("query", "--json", "--event", "audit.checkpoint", str(log_path)).stdout)
    assert [e["event"] for e in only] == ["audit.checkpoint"]
    table = run_cli("query", "--evidence", str(log_path))
    assert table.returncode == 0 and "audit.checkpoint" in table.stdout.splitlines()[-1]


async def test_lines_that_are_not_events_are_skipped_and_counted(log_path: Path, log: list[Any]) -> None:
    data = log_path.read_bytes().splitlines(keepends=True)
    huge = b'{"tenant":"acme",' + b"x" * (3 << 20) + b"\n"  # longer than any valid line: not buffered
    data[3:3] = [b"not json\n", b'{"tenant":"acme" broken}\n', huge, b"[1,2]\n"]
    log_path.write_bytes(b"".join(data) + b'{"event":"mcp.request","tenant":"acme"')  # torn tail
    result = run_cli("query", "--tenant", "acme", str(log_path))
    assert result.returncode == 0
    assert len(result.stdout.splitlines()) - 1 == sum(e.get("tenant") == "acme" for e in log)
    assert "skipped 5 lines that are not audit events" in result.stderr
    assert "Traceback" not in result.stderr


def planted(record: dict[str, Any]) -> bytes:
    """A line as someone who can write the file plants it: real characters, not the writer's escapes."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


# What a planted value can do to a terminal, each with the escape the table must show instead.
TERMINAL_TRICKS = {
    "subject": ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # OSC: set the window title
    "reason": ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # CSI: clear the screen, cursor home
    "tool": ("ok\r\x08\x08", "ok\\x0d\\x08\\x08"),  # CR, backspace: overwrite the row
    "method": ("\x9b31m\x85", "\\x9b31m\\x85"),  # C1 CSI (colour), C1 NEL
    "tenant": ("a\x7fb", "a\\x7fb"),  # DEL
    "request_id": ("txt\u202eexe.md\u2066\u2028", "txt\\u202eexe.md\\u2066\\u2028"),  # bidi, LS
}


async def test_the_table_escapes_what_a_planted_line_would_send_to_a_terminal(
    log_path: Path, log: list[dict[str, Any]]
) -> None:
    record = dict(log[0]) | {k: raw for k, (raw, _) in TERMINAL_TRICKS.items()} | {"seq": len(log) + 1}
    with log_path.open("ab") as f:
        f.write(planted(record))
    result = run_cli("query", str(log_path))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rows = result.stdout.split("\n")
    assert rows.pop() == "" and len(rows) == len(log) + 2  # the header, every event, the planted one
    unsafe = sorted({f"U+{ord(c):04X}" for row in rows for c in row if not c.isprintable()})
    assert unsafe == [], f"characters a terminal acts on reached it: {unsafe}"
    last = rows[-1]
    for key, (_, shown) in TERMINAL_TRICKS.items():
        assert shown in last, (key, last)
    # The honest rows are untouched: each starts with its own ts, in order.
    assert [r.split()[0] for r in rows[1:-1]] == [e["ts"] for e in log]


async def test_json_output_skips_lines_that_are_not_the_writers_json(
    log_path: Path, log: list[dict[str, Any]]
) -> None:
    """`--json` prints lines as they are, so it prints only JSON objects in the writer's characters
    (ASCII: the writer escapes the rest); the others are skipped and counted."""
    good = log_path.read_bytes()
    bad = [
        b'{"tenant":"acme" broken}\n',  # braces outside, no JSON inside
        b'{"tenant":"acme","x":}\n',
        planted(dict(log[0]) | {"subject": "\x9b2J\u202e"}),  # JSON, but raw C1 and bidi bytes
        planted(dict(log[0]) | {"subject": "del\x7f"}),  # raw DEL
    ]
    with log_path.open("ab") as f:
        f.writelines(bad)
    result = run_cli("query", "--json", str(log_path))
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert result.stdout.encode() == good
    assert "skipped 4 lines that are not audit events" in result.stderr
    selected = run_cli("query", "--json", "--tenant", "acme", str(log_path))
    assert json_lines(selected.stdout) == [e for e in log if e.get("tenant") == "acme"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "last tuesday"], "--since"),
        (["--since", "2026-11-30T08:00:00"], "offset"),
        (["--until", "99x"], "--until"),
        (["--since", "1d", "--until", "2d"], "earlier"),
        (["--event", "mcp.requestx"], "--event"),
        (["--outcome", "fine"], "--outcome"),
        (["--tenant", "ACME corp"], "--tenant"),
        (["--reason", "Not A Code"], "--reason"),
        (["--subject", "a\nb"], "--subject"),
        (["--json", "--bogus"], "unrecognized"),
        # far times: before year 1 or after 9999 once counted back or moved to UTC
        (["--since", "999999999d"], "--since: out of range"),
        (["--since", "999999999w"], "--since: out of range"),
        (["--until", "0001-01-01T00:00:00+01:00"], "--until: out of range"),
        (["--since", "9999-12-31T23:59:59-00:01"], "--since: out of range"),
    ],
)
async def test_bad_filters_are_refused_with_exit_2_and_no_traceback(
    log_path: Path, log: list[dict[str, Any]], args: list[str], message: str
) -> None:
    for command in (["query"], ["export", "--format", "ocsf"]):
        result = run_cli(*command, *args, str(log_path))
        assert result.returncode == 2
        assert result.stdout == ""
        assert message in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.splitlines()) == 1 or "unrecognized" in message, result.stderr


async def test_an_unreadable_file_is_exit_1_and_no_traceback(tmp_path: Path) -> None:
    for form in (["--json"], []):
        result = run_cli("query", *form, str(tmp_path / "missing.jsonl"))
        assert result.returncode == 1 and "cannot read" in result.stderr and "Traceback" not in result.stderr
        assert result.stdout == ""  # not even the table's header


async def test_relative_since_counts_back_from_now(log_path: Path) -> None:
    now = time.time_ns()
    await write_log(log_path, 8, start=now - 8 * HOUR, step=HOUR)  # 8h ago .. 1h ago
    result = run_cli("query", "--json", "--since", "150m", str(log_path))
    assert [e["ts"] for e in json_lines(result.stdout)] == [ts(now - 2 * HOUR), ts(now - HOUR)]


async def test_a_closed_pipe_ends_quietly(log_path: Path) -> None:
    await write_log(log_path, 3000)
    query = subprocess.Popen(
        [sys.executable, "-m", "broker.cli", "audit", "query", str(log_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert query.stdout is not None and query.stderr is not None
    head = [query.stdout.readline() for _ in range(2)]
    query.stdout.close()  # what `| head -n 2` does once it has its lines
    err = query.stderr.read().decode()
    assert query.wait(timeout=30) == 0
    assert all(head) and "Traceback" not in err and "BrokenPipe" not in err, err


class Follower:
    """`audit query --follow --json` (or another command given) in a child process, its lines read
    as they arrive."""

    def __init__(self, *args: str, command: tuple[str, ...] = ("query", "--json")) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "audit", *command, "--follow", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            # A test run started in the background (`pytest &`) ignores SIGINT, and Python keeps
            # an ignored SIGINT ignored: `stop()` would then wait in vain.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        os.set_blocking(self.proc.stdout.fileno(), False)  # type: ignore[union-attr]
        self._buf = b""

    def lines(self, n: int, timeout: float = 20) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while self._buf.count(b"\n") < n and time.monotonic() < deadline:
            chunk = self.proc.stdout.read()  # type: ignore[union-attr]
            if chunk:
                self._buf += chunk
            else:
                time.sleep(0.05)
        *got, self._buf = self._buf.split(b"\n", n) if self._buf.count(b"\n") >= n else [self._buf]
        return [json.loads(line) for line in got]

    def stop(self) -> subprocess.CompletedProcess[bytes]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        err = self.proc.stderr.read() if self.proc.stderr else b""
        return subprocess.CompletedProcess(self.proc.args, rc, b"", err)


async def test_follow_sees_new_events_and_survives_rotation(log_path: Path) -> None:
    await write_log(log_path, 4)
    follower = Follower("--tenant", "acme", str(log_path))
    try:
        first = follower.lines(2)
        assert [e["seq"] for e in first] == [1, 4]
        clock = Clock(T0 + 10 * HOUR)
        async with await AuditLog.open(plain(log_path), clock=clock) as audit:
            await audit.emit("mcp.request", **request_fields(5) | {"tenant": "acme"})
            await audit.emit("mcp.request", **request_fields(6) | {"tenant": "globex"})
            assert [e["request_id"] for e in follower.lines(1)] == ["req-000005"]
        # rotation: the file is renamed and a new one appears under the same name
        log_path.rename(log_path.with_name("audit.jsonl.1"))
        async with await AuditLog.open(plain(log_path), clock=clock) as audit:
            await audit.emit("mcp.request", **request_fields(7) | {"tenant": "acme"})
            assert [e["request_id"] for e in follower.lines(1)] == ["req-000007"]
        # truncation in place (copytruncate): read again from the start
        assert (offset_of(follower.proc.pid, log_path) or 0) > 0
        log_path.write_bytes(b"")
        # It has seen the truncation (back at the start) before the next line makes the file grow.
        deadline = time.monotonic() + 20
        while offset_of(follower.proc.pid, log_path) != 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert offset_of(follower.proc.pid, log_path) == 0
        async with await AuditLog.open(plain(log_path), clock=clock) as audit:
            await audit.emit("mcp.request", **request_fields(8) | {"tenant": "acme"})
            assert [e["request_id"] for e in follower.lines(1)] == ["req-000008"]
    finally:
        done = follower.stop()
    assert done.returncode == 0 and b"Traceback" not in done.stderr


def offset_of(pid: int, path: Path) -> int | None:
    """Where process `pid` stands in its open `path` (the fd's offset, as /proc shows it)."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != str(path):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                return next(int(line.split()[1]) for line in info if line.startswith("pos:"))
        except (OSError, StopIteration):
            continue
    return None


def peak_rss_kib(*args: str) -> int:
    """Peak resident memory of `audit query ARGS` (stdout discarded), measured by a parent of its own."""
    probe = (
        "import resource, subprocess, sys;"
        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    cmd = [sys.executable, "-c", probe, sys.executable, "-m", "broker.cli", "audit", "query", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=True)
    return int(done.stdout)


async def test_memory_stays_flat_however_large_the_log(tmp_path: Path) -> None:
    """Streamed, never loaded: a log 20 times larger costs the same memory (a whole 80 MB read
    would show as 80 MB more)."""
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    await write_log(small, 8000)
    data = small.read_bytes()
    large.write_bytes(data * 20)  # not one chain, which query does not check: only the size matters
    assert large.stat().st_size > 60 << 20
    for args in (["--json"], ["--tenant", "acme"], ["--json", "--since", ts(T0)]):
        base = peak_rss_kib(*args, str(small))
        grown = peak_rss_kib(*args, str(large))
        assert grown - base < 16 << 10, (args, base, grown)  # KiB


N_ROTATED = 7000  # about 3 MB: two rotations at 1 MiB


async def test_the_writers_own_rotation_and_checkpoints(tmp_path: Path) -> None:
    """Size-based rotation with signed checkpoints on, as a broker runs: every event once, in order,
    across the live file and its rotated ones given in the shell's glob order."""
    path = tmp_path / "audit.jsonl"
    settings = AuditSettings(
        path=path,
        key_file=tmp_path / "audit.key",
        witness_file=None,
        checkpoint_every=50,
        replica="r1",
        rotate_bytes=1 << 20,
    )
    async with await AuditLog.open(settings) as audit:
        for i in range(N_ROTATED):
            await audit.emit("mcp.request", **request_fields(i) | {"tenant": TENANTS[i % 3]})
    files = sorted(str(p) for p in tmp_path.glob("audit.jsonl*"))
    assert len(files) >= 3  # the live file and at least two rotated ones
    lines = [e for f in sorted(files, key=lambda f: (len(f), f)) for e in read_events(Path(f))]
    assert any(e["event"] == "audit.checkpoint" for e in lines)
    events = json_lines(run_cli("query", "--json", *files).stdout)
    assert [e["request_id"] for e in events] == [f"req-{i:06d}" for i in range(N_ROTATED)]
    acme = json_lines(run_cli("query", "--json", "--tenant", "acme", *files).stdout)
    assert [e["request_id"] for e in acme] == [f"req-{i:06d}" for i in range(0, N_ROTATED, 3)]
    everything = json_lines(run_cli("query", "--json", "--evidence", *files).stdout)
    assert [e["seq"] for e in everything] == list(range(1, len(everything) + 1))
    assert len(everything) > N_ROTATED and all(
        e["event"] in ("mcp.request", "audit.checkpoint") for e in everything
    )
