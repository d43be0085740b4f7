"""Every audit emit names its outcome and its event by their enums (`Outcome`, `AuditEvent`),
never by a bare string: a typo in a string is a new outcome no query or alert knows, and the
enums are what the audit schema admits (issue 36, item 5). Read from the code's AST, the broker's
and the benchmarks' (which write logs of their own through the same `emit`)."""

from __future__ import annotations

import ast
from pathlib import Path

from broker.audit.schema import AuditEvent

ROOT = Path(__file__).resolve().parents[2]
EVENT_NAMES = {event.value for event in AuditEvent}


def _calls() -> list[tuple[str, ast.Call]]:
    found = []
    for path in sorted([*(ROOT / "broker").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node))
    return found


def _is_string(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def test_no_outcome_is_a_bare_string() -> None:
    bare = [where for where, call in _calls()
            for kw in call.keywords if kw.arg == "outcome" and _is_string(kw.value)]  # fmt: skip
    assert not bare, f"outcome=Outcome.X, not a string: {bare}"


# The callables an audit event goes through (a span named like an event is not one: tracing.py).
EMITTERS = {"emit", "audit", "_emit", "_audit", "on_event", "_on_event", "sandbox_event", "AuditEvent"}


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def test_no_audit_event_is_a_bare_string() -> None:
    bare = [where for where, call in _calls() if _callee(call) in EMITTERS
            for arg in call.args[:1] if _is_string(arg) and arg.value in EVENT_NAMES]  # fmt: skip
    assert not bare, f"AuditEvent.X, not its name as a string: {bare}"


def test_the_check_sees_a_bare_string() -> None:
    # The walk must be able to fail: a planted emit with both written as strings is found.
    call = ast.parse('emit("sandbox.started", outcome="ok")').body[0].value  # type: ignore[attr-defined]
    assert isinstance(call, ast.Call)
    assert _callee(call) in EMITTERS and _is_string(call.args[0])
    assert call.args[0].value in EVENT_NAMES  # type: ignore[attr-defined]
    assert any(kw.arg == "outcome" and _is_string(kw.value) for kw in call.keywords)
