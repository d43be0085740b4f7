"""The reliability runs' accounting: <DIR>/docker.json and <DIR>/lab.json, written by
tests/reliability when DOCBROKER_RELIABILITY_OUT=DIR, read from an earlier run (--reliability DIR)
or from the runs started here (the lab's too when DOCBROKER_TEST_KUBECONFIG names a lab)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.reportgen import plots
from bench.reportgen.md import image, num, table
from bench.reportgen.runner import Context, NotMeasured, Part, parsed, read_json, run_child

RUNS = (("docker", "Docker: 2 replicas on PostgreSQL"), ("lab", "Lab cluster: 2 broker Pods"))


@dataclass(frozen=True)
class Fault:
    name: str
    entered: bool


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    count: int


@dataclass(frozen=True)
class Run:
    run: str
    tenants: int
    clients: int
    requests: int
    saves_ok: int
    result_unknown: int
    duration_s: float
    faults: list[Fault]
    checks: list[Check]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        return cls(
            run=str(data["run"]),
            tenants=int(data["tenants"]),
            clients=int(data["clients"]),
            requests=int(data["requests"]),
            saves_ok=int(data["saves_ok"]),
            result_unknown=int(data["result_unknown"]),
            duration_s=float(data["duration_s"]),
            faults=[Fault(str(f["name"]), bool(f["entered"])) for f in data["faults"]],
            checks=[Check(str(c["name"]), bool(c["passed"]), int(c["count"])) for c in data["checks"]],
        )

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks) and all(f.entered for f in self.faults)


def render(title: str, run: Run) -> list[str]:
    failed = [c.name for c in run.checks if not c.passed] + [f.name for f in run.faults if not f.entered]
    summary = (
        f"all {len(run.checks)} checks passed, every fault entered"
        if not failed
        else "**FAILED**: " + ", ".join(failed)
    )
    return [
        f"### {title}",
        "",
        f"Run `{run.run}`: {run.tenants} tenants x {run.clients} clients, {run.requests:,} requests in "
        f"{num(run.duration_s, 0)} s; {run.saves_ok:,} saves answered ok, {run.result_unknown:,} "
        f"`result_unknown`. {summary}.",
        "",
        *table(["fault", "entered"], [[f.name, "yes" if f.entered else "**no**"] for f in run.faults]),
        "",
        *table(
            ["accounting check", "passed", "offenders"],
            [[c.name, "yes" if c.passed else "**no**", f"{c.count:,}"] for c in run.checks],
        ),
    ]


def draw(ctx: Context, runs: dict[str, Run]) -> Path:
    names = list(runs)
    return plots.bars(
        ctx.plot_path("reliability.png"),
        "Reliability runs: requests and saves under faults",
        ["requests", "saves ok", "result_unknown"],
        {name: [runs[name].requests, runs[name].saves_ok, runs[name].result_unknown] for name in names},
        "count",
    )


def source(ctx: Context) -> tuple[Path, str]:
    """The folder holding the runs' JSON, and where it came from."""
    given = ctx.options.get("reliability")
    if given is not None:
        return Path(given), f"`{given}` (an earlier run)"
    if ctx.quick:
        raise NotMeasured(
            "--quick does not run the reliability tests (minutes each); "
            "pass --reliability DIR of an earlier run"
        )
    tests = ctx.repo / "tests" / "reliability"
    if not tests.is_dir():
        raise NotMeasured("tests/reliability is not in this tree")
    out = ctx.work / "reliability"
    out.mkdir(exist_ok=True)
    # The lab's run needs a lab cluster (DOCBROKER_TEST_KUBECONFIG); without one, Docker's alone.
    which = ["-m", "reliability"] if ctx.env.get("DOCBROKER_TEST_KUBECONFIG") else ["-k", "docker"]
    ctx.say(f"  running pytest tests/reliability {' '.join(which)}")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", str(tests), *which]
    code, last = run_child(ctx, "reliability", command, {**ctx.env, "DOCBROKER_RELIABILITY_OUT": str(out)})
    ctx.say(f"  pytest exited {code}")
    note = "this run" if code == 0 else f"this run; the tests FAILED (pytest exit {code}: {last})"
    return out, note


def section(ctx: Context) -> Part:
    folder, origin = source(ctx)
    lines = [f"Accounting from files and logs only, as the reliability tests assert it; from {origin}.", ""]
    runs: dict[str, Run] = {}
    for key, title in RUNS:
        try:
            data = read_json(folder / f"{key}.json", f"{key}.json")
            runs[key] = parsed(data, Run.from_json, f"{key}.json")
        except NotMeasured as exc:
            lines += [f"### {title}", "", f"Not measured: {exc.reason}.", ""]
        else:
            lines += [*render(title, runs[key]), ""]
    ctx.results["reliability"] = runs
    pngs = [draw(ctx, runs)] if runs else []
    lines += [image(p, p.stem) for p in pngs]
    return Part(lines, pngs)
