"""bench/make_report.py: REPORT.md and its plots from real bench runs, and a clear "not measured"
line (never a crash) for every input that is missing, failing or malformed.

The cheap benches run for real in --quick mode; a bench another helper is still writing
(burst.py, scale.py) and the reliability runs' files are stood in for by small scripts and
files of the documented JSON shape, written here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest

from bench import make_report
from bench.reportgen.runner import Context
from bench.reportgen.sections import SECTIONS

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    pixels = matplotlib.image.imread(path)  # decodes the whole image: a truncated file fails
    assert pixels.shape[0] >= 200 and pixels.shape[1] >= 400, pixels.shape


def linked_plots(report: str, out: Path) -> list[Path]:
    return [out / link for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)]


def table_rows(report: str, heading: str) -> list[list[str]]:
    """The body rows of the first table at or after the line starting with `heading`."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows: list[list[str]] = []
    for line in lines[start:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    aligned = next(i for i, row in enumerate(rows) if all(set(cell) <= set("-:") for cell in row))
    return rows[aligned + 1 :]  # less the header and the alignment row


def context(tmp_path: Path, benches: Path, **kwargs: Any) -> Context:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    defaults: dict[str, Any] = {
        "repo": tmp_path,
        "benches": benches,
        "plots": tmp_path / "out" / "plots",
        "work": work,
        "quick": False,
        "timeout": 60.0,
        "env": {"PATH": os.environ["PATH"]},
        "say": lambda message: None,
    }
    return Context(**(defaults | kwargs))


def fake_bench(benches: Path, name: str, data: Any, extra: str = "") -> None:
    """A stand-in bench: writes `data` to its --json path (and its arguments beside it)."""
    benches.mkdir(exist_ok=True)
    (benches / name).write_text(
        textwrap.dedent(
            f"""
            import json, sys
            from pathlib import Path
            args = sys.argv[1:]
            out = Path(args[args.index("--json") + 1])
            out.with_suffix(".args").write_text(json.dumps(args))
            {extra}
            out.write_text({json.dumps(json.dumps(data))})
            """
        )
    )


def text(part: Any) -> str:
    return "\n".join(part.lines)


@pytest.mark.timeout(400)
def test_quick_report_of_the_cheap_benches_measured_for_real(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "left-from-another-run.png").write_bytes(PNG_SIGNATURE)
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "make_report.py"), "--quick", "--only", "policy,audit,approval",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=380,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    for n, key in enumerate(("audit", "approval", "policy"), 1):  # progress, in the report's order
        assert f"[{n}/3] {key}: done" in run.stderr
    assert "Traceback" not in run.stderr
    report = (out / "REPORT.md").read_text()

    assert report.startswith("# Benchmark report\n")
    assert re.search(r"^\| machine \| \d+ CPUs \(.+\), [\d.]+ GiB memory \|$", report, re.M)
    assert re.search(r"^\| kernel, Python \| Linux \S+, Python 3\.\d+\.\d+ \|$", report, re.M)
    assert re.search(r"^\| load during the run \| 1-min load average [\d.]+ to [\d.]+ ", report, re.M)
    assert re.search(r"^\| date \| \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, \d+ s to run \|$", report, re.M)
    described = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty", "--tags"], capture_output=True, text=True
    ).stdout.strip()
    assert f"| revision | `{described}` |" in report
    headings = re.findall(r"^## (.+)$", report, re.M)
    assert headings == [
        "1. Audit cost with checkpoints",
        "2. Approval round trip on SQLite and PostgreSQL",
        "3. Policy decision cost",
    ]
    assert "not measured" not in report.lower()

    intervals = table_rows(report, "`bench/audit_checkpoints.py`")
    assert [row[0] for row in intervals] == ["100", "1,000", "10,000"]
    for row in intervals:  # signed ÷ plain, measured side by side: a positive ratio
        assert float(row[4]) > 0
    commands = table_rows(report, "`bench/audit_throughput.py`")
    assert commands and all(float(row[3].replace(",", "")) > 0 for row in commands)
    steps = table_rows(report, "`bench/approval_roundtrip.py`")
    assert [row[0] for row in steps] == ["propose", "approve", "consume", "round trip"]
    assert all(float(row[3]) > 0 for row in steps)  # PostgreSQL ÷ SQLite
    target = r"Target: PostgreSQL adds ≤ 3 ms p50 to the round trip: [+-][\d.]+ ms, \*\*(PASS|FAIL)\*\*"
    assert re.search(target, report)
    paths = table_rows(report, "`bench/policy_decision.py`")
    assert paths[0][0] == "TOML path (before)" and len(paths) == 7
    assert sum("(PASS)" in row[4] or "(FAIL)" in row[4] for row in paths) == 3  # the rows the target is about

    plots = linked_plots(report, out)
    assert {p.name for p in plots} == {
        "audit-checkpoint-interval.png",
        "audit-read-throughput.png",
        "approval-roundtrip.png",
        "policy-decision.png",
    }
    for plot in plots:
        assert_png(plot)
    assert sorted((out / "plots").iterdir()) == sorted(plots)  # the other run's plot is gone


def test_every_section_is_a_not_measured_line_without_its_bench(tmp_path: Path) -> None:
    empty = tmp_path / "no-benches"
    empty.mkdir()
    ctx = context(tmp_path, empty)
    parts, clean = make_report.run_sections(ctx, make_report.KEYS)
    assert clean
    rendered = {title: text(part) for title, part in parts}
    for key, title, _ in SECTIONS:
        body = rendered[title]
        if key == "memory":
            assert "not measured: the scale section did not run" in body
            assert "not measured: the first-call section did not run" in body
            assert "not measured this run: no lab cluster" in body
        elif key == "reliability":
            assert body == "Not measured: tests/reliability is not in this tree."
        elif key == "audit":  # two benches, each its own line
            assert "Checkpoints: not measured: bench/audit_checkpoints.py is not in this tree" in body
            assert "Reading the log back: not measured: bench/audit_throughput.py is not in this tree" in body
        else:
            first = body.splitlines()[0]
            assert re.fullmatch(r"Not measured: bench/\w+\.py is not in this tree\.", first), body
    assert not ctx.plots.exists() or not list(ctx.plots.iterdir())


BURST = {
    "burst": {
        "n": 20,
        "answered": 20,
        "p50_s": 0.62,
        "p99_s": 1.9,
        "floor_s": 1.7,
        "ratio_p99_to_floor": 1.12,
    },
    "pool": {"size_before": 2, "peak": 9, "size_after_idle": 1},
    "burst_cpu_s": {
        "wall_s": 1.0,
        "host_busy_s": 2.0,
        "broker_s": 0.4,
        "docker_daemon_s": 0.2,
        "tenant_sandboxes_s": 0.6,
        "spares_started_meanwhile_s": 0.0,
        "spares_already_warm_s": 0.0,
        "other_s": 0.8,
    },
}
SCALE = {
    "open_rate": 450.0,
    "open_fraction": 0.5,
    "concurrency": 4,
    "seconds": 5.0,
    "points": [
        {"tenants": t, "throughput": tp, "p50_ms": p50, "p99_ms": p99,
         "open_p50_ms": op50, "open_p99_ms": op99, "broker_cpu_ms_per_call": 0.6,
         "sandbox_cpu_ms_per_call": 1.5, "idle_cpu_ms_per_s": 2.0,
         "memory_per_idle_tenant_mib": mib, "broker_rss_mib": rss, "open_failed": 3 if t == 100 else 0}
        for t, tp, p50, p99, op50, op99, mib, rss in (
            (1, 900.0, 1.1, 3.0, 2.0, 8.0, 31.0, 80.0),
            (10, 1500.0, 1.5, 5.0, 2.5, 9.5, 30.5, 95.0),
            (100, 1400.0, 2.5, 11.0, 3.0, 14.0, 30.1, 160.0),
            (300, 1250.0, 4.0, 48.5, 6.0, 21.5, 30.0, 290.0),
        )
    ],
    "limits": {"DOCBROKER_MAX_SANDBOXES": 400, "pids": "64 per sandbox", "fds": 65536},
    "sweep": {"tenants": 300, "points": [
        {"rate": r, "calls": c, "failed": f, "p50_ms": p50, "p99_ms": p99, "major_faults_per_call": m}
        for r, c, f, p50, p99, m in ((150.0, 750, 0, 6.0, 21.5, 0.5), (30.0, 150, 0, 3.0, 9.0, 12.25),
                                     (60.0, 300, 1, 3.5, 12.0, 4.0))
    ]},
}  # fmt: skip


def test_burst_scale_and_memory_from_their_documented_json(tmp_path: Path) -> None:
    benches = tmp_path / "benches"
    fake_bench(benches, "burst.py", BURST)
    fake_bench(benches, "scale.py", SCALE)
    pods = {"pod_memory_mib": [41.0, 43.0, 45.0], "docker_memory_mib": 30.0, "first_call_s": [2.1]}
    fake_bench(benches, "kubernetes.py", pods)
    ctx = context(tmp_path, benches, env={"PATH": os.environ["PATH"], "DOCBROKER_TEST_KUBECONFIG": "/k"})
    parts, clean = make_report.run_sections(ctx, ["burst", "scale", "memory"])
    assert clean
    burst, scale, memory = (text(part) for _, part in parts)

    assert table_rows(burst, "`bench/burst.py`") == [["20/20", "0.62", "1.90", "1.70", "1.12"]]
    assert [row[-1] for row in table_rows(burst, "| target")] == ["PASS", "PASS", "PASS"]
    assert "Warm pool: 2 before the burst, 9 at its peak, 1 after idling." in burst
    assert "| p99 ÷ CPU floor of starting them | 1.12 | ≤ 1.2 | PASS |" in burst
    assert json.loads((ctx.work / "burst.args").read_text())[0] == "--breakdown"
    cpu = {row[0]: row[1:] for row in table_rows(burst, "| part")}
    assert cpu["the broker process"] == ["0.40", "20.00"]  # CPU s, then ms per first call
    assert cpu["everything else on the host (other work)"] == ["0.80", "40.00"]
    assert "The first calls' own CPU (broker, Docker, sandboxes): 1.20 CPU-s, 60.00 ms each." in burst

    rows = table_rows(scale, "`bench/scale.py`")
    assert [row[0] for row in rows] == ["1", "10", "100", "300"]
    assert [row[2] for row in rows] == ["1.00", "1.67", "1.56", "1.39"]  # ÷ 1 tenant, same run
    # The verdict is the open loop's p99 (21.5 ms at 300 fails), not the saturation p99 (48.5).
    assert [row[4] for row in rows] == ["3.00", "5.00", "11.00", "48.50"]
    assert [row[6] for row in rows] == ["8.00", "9.50", "14.00 (3 failed)", "21.50"]
    assert [row[7] for row in rows] == ["PASS", "PASS", "FAIL", "FAIL"]  # a failed call fails it
    assert [row[8:11] for row in rows] == [["0.60", "1.50", "2.00"]] * 4
    assert "calls offered at 450 calls/s (50 % of the saturation throughput at 1 tenant)" in scale
    assert "- `DOCBROKER_MAX_SANDBOXES`: 400" in scale
    args = json.loads((ctx.work / "scale.args").read_text())
    assert args[:4] == ["--tenants", "1,10,100,300", "--sweep", "25,50,100,150"]
    # The sweep at 300 tenants, by rate; 60 calls/s had a failed call: the best that meets is 30.
    swept = table_rows(scale, "The open loop again at 300 tenants")
    assert swept == [
        ["30", "0.10", "150", "0", "3.00", "9.00", "12.25", "PASS"],
        ["60", "0.20", "300", "1", "3.50", "12.00", "4.00", "FAIL"],
        ["150", "0.50", "750", "0", "6.00", "21.50", "0.50", "FAIL"],
    ]
    assert "the highest rate measured that meets it: **30 calls/s** (0.10 per tenant per second)" in scale

    assert "| Docker: per idle tenant, 300 tenants (`scale.py`) | 30.0 |" in memory
    assert "| Kubernetes: per idle tenant Pod, median of 3 | 43.0 |" in memory
    assert "| Pod ÷ Docker sandbox (same run) | 1.43 |" in memory
    assert "not measured: the first-call section did not run" in memory

    plots = [p for _, part in parts for p in part.plots]
    assert {p.name for p in plots} == {"burst.png", "scale-throughput-p99.png", "scale-p99-by-rate.png",
                                       "scale-memory.png", "memory-per-tenant.png"}  # fmt: skip
    for plot in plots:
        assert_png(plot)


def test_scale_json_without_an_open_loop_gets_no_verdict(tmp_path: Path) -> None:
    """A scale.py JSON of the shape before the open loop: its saturation p99 is queueing, so it
    is never judged against the target."""
    benches = tmp_path / "benches"
    points: list[dict[str, Any]] = SCALE["points"]  # type: ignore[assignment]
    new = ("open_", "broker_cpu", "sandbox_cpu", "idle_cpu")
    old = {"points": [{k: v for k, v in p.items() if not k.startswith(new)} for p in points], "limits": {}}
    fake_bench(benches, "scale.py", old)
    parts, clean = make_report.run_sections(context(tmp_path, benches), ["scale"])
    assert clean
    rows = table_rows(text(parts[0][1]), "`bench/scale.py`")
    assert [row[7] for row in rows] == ["not measured"] * 4
    assert "*Open loop*: not measured (scale.py's JSON has no open loop)." in text(parts[0][1])


def test_a_failing_malformed_or_hanging_bench_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    benches = tmp_path / "benches"
    benches.mkdir()
    (benches / "policy_decision.py").write_text(
        "import sys\nprint('policy_decision: could not run: no policies', file=sys.stderr)\nsys.exit(2)\n"
    )
    fake_bench(benches, "approval_roundtrip.py", {"steps": {"propose": {"sqlite": {}}}})
    fake_bench(benches, "scale.py", {"points": []})
    fake_bench(benches, "broker_overhead.py", [1, 2, 3])
    pid_file = tmp_path / "hanging.pid"
    (benches / "burst.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    ctx = context(tmp_path, benches, timeout=3.0)
    parts, clean = make_report.run_sections(ctx, ["overhead", "burst", "scale", "approval", "policy"])
    assert clean
    overhead, burst, scale, approval, policy = (text(part) for _, part in parts)
    malformed = "JSON is not of the expected shape ("
    assert overhead.startswith(f"Not measured: bench/broker_overhead.py's {malformed}")
    assert burst == "Not measured: burst did not finish in 3 s and was stopped."
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped, and reaped
    assert scale.startswith(f"Not measured: bench/scale.py's {malformed}ValueError: no points)")
    assert approval.startswith(f"Not measured: bench/approval_roundtrip.py's {malformed}")
    assert policy == (
        "Not measured: bench/policy_decision.py wrote no results (exit 2): "
        "policy_decision: could not run: no policies."
    )


RELIABILITY = {
    "run": "docker-2-replicas",
    "tenants": 16,
    "clients": 3,
    "requests": 5321,
    "saves_ok": 610,
    "result_unknown": 4,
    "duration_s": 183.2,
    "faults": [
        {"name": "sandbox killed mid-call", "entered": True},
        {"name": "audit fs full", "entered": True},
    ],
    "checks": [
        {"name": "every ok save has its file with the approved sha256", "passed": True, "count": 610},
        {"name": "no approval consumed twice", "passed": False, "count": 1},
    ],
}


def test_reliability_accounting_read_from_an_earlier_run(tmp_path: Path) -> None:
    runs = tmp_path / "reliability"
    runs.mkdir()
    (runs / "docker.json").write_text(json.dumps(RELIABILITY))
    ctx = context(tmp_path, tmp_path, options={"reliability": runs})
    parts, clean = make_report.run_sections(ctx, ["reliability"])
    assert clean
    body = text(parts[0][1])
    assert "Run `docker-2-replicas`: 16 tenants x 3 clients, 5,321 requests in 183 s" in body
    assert "610 saves answered ok, 4 `result_unknown`. **FAILED**: no approval consumed twice." in body
    assert table_rows(body, "| fault") == [["sandbox killed mid-call", "yes"], ["audit fs full", "yes"]]
    assert ["no approval consumed twice", "**no**", "1"] in table_rows(body, "| accounting check")
    assert "### Lab cluster: 2 broker Pods\n\nNot measured: lab.json is absent." in body
    assert_png(parts[0][1].plots[0])


def test_quick_mode_does_not_run_the_reliability_tests(tmp_path: Path) -> None:
    (tmp_path / "tests" / "reliability").mkdir(parents=True)
    parts, _ = make_report.run_sections(context(tmp_path, tmp_path, quick=True), ["reliability"])
    assert text(parts[0][1]).startswith("Not measured: --quick does not run the reliability tests")


@pytest.mark.parametrize("only", ["nonsense", "policy,nonsense", ","])
def test_an_unknown_section_is_one_line_and_exit_2(tmp_path: Path, only: str) -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "make_report.py"), "--only", only, "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    assert "unknown section(s)" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "REPORT.md").exists()


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_first_call_and_memory_sections_from_a_real_cold_start(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Without the lab CI starts for other tests: the Pod half is its fake's (above), not minutes here.
    env = {k: v for k, v in os.environ.items() if k != "DOCBROKER_TEST_KUBECONFIG"}
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "make_report.py"), "--quick", "--only", "cold,memory",
         "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=580,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    report = (out / "REPORT.md").read_text()
    assert "[1/2] cold: done" in run.stderr, run.stderr[-2000:]
    rows = table_rows(report, "`bench/cold_start.py`")
    assert [row[0] for row in rows] == [
        "through the broker, warm pool",
        "through the broker, no pool (container start)",
        "DockerBackend, a pooled sandbox",
        "DockerBackend, a new container",
        "naive `docker run -i`, MCP over stdio",
    ]
    for row in rows:  # each path measured, and its ratio to the pooled start of the same run
        assert int(row[1]) >= 2 and float(row[2].replace(",", "")) > 0 and float(row[4]) > 0
    assert re.search(r"Idle sandbox memory \(`docker stats`\): [\d.]+ MiB", report)
    memory = table_rows(report, "Memory of an idle tenant's sandbox")
    assert re.fullmatch(r"[\d.]+", dict(memory)["Docker: one idle sandbox (`cold_start.py`)"])
    plots = linked_plots(report, out)
    assert {p.name for p in plots} == {"first-call.png", "memory-per-tenant.png"}
    for plot in plots:
        assert_png(plot)
