"""The broker's import rule (docs/architecture.md): a module imports only units below its own.

Walks the AST of every module in broker/ (imports inside functions included) and fails on an
import of a unit of the same or a higher layer, and on a unit the table does not know (a new
package must be placed in the table, and in docs/architecture.md, before it is imported).
"""

from __future__ import annotations

import ast
from pathlib import Path

BROKER = Path(__file__).resolve().parents[2] / "broker"

# unit → layer; a unit may import units of a lower layer only (and itself).
LAYERS: dict[str, int] = {
    "server": 0,
    "broker.types": 0,
    "broker.settings": 0,
    "broker.threads": 0,
    "broker.metrics": 0,
    "broker.images": 0,
    "broker.files": 0,  # opening a file someone may have planted (keys, audit inputs)
    "broker.base64url": 0,  # unpadded base64url in its one canonical spelling
    "broker.protocol": 1,
    "broker.master_key": 1,  # the master key and every per-tenant key derived from it
    "broker.sealing": 1,  # one AES-GCM framing for values sealed through a client
    "broker.supply": 1,  # the image's signed provenance, SBOM and content digest (DESIGN §13)
    "broker.audit": 2,
    "broker.tracing": 2,  # OpenTelemetry spans of /mcp requests, made from the gateway's record
    "broker.errors": 3,
    "broker.policy": 3,
    "broker.upstream": 3,
    "broker.http_edge": 3,
    "broker.auth": 4,
    "broker.runtime": 4,
    "broker.origin": 4,
    "broker.approvals": 5,
    "broker.tenants": 6,
    "broker.keeper": 6,  # the reports keeper in a tenant's Pod (python -m broker.keeper)
    "broker.gateway": 6,
    "broker.web": 6,
    "broker.serving": 6,
    "broker.schema_wait": 7,  # start-up against a schema not migrated yet: alive, Not Ready
    "broker.app": 7,
    "broker.doctor": 7,
    "broker.cli": 8,
    "broker.testing": 9,  # the broker launcher of tests and bench: nothing in broker/ imports it
    "broker.__main__": 9,
    "broker": 9,
}
# Inside the gateway, the request's own order: nothing imports a stage after it.
GATEWAY_ORDER = ["record", "responder", "gate", "replies", "pinning", "relay", "handler"]


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "server":
        return "server"
    if parts[0] != "broker":
        return None
    return "broker" if len(parts) == 1 else f"broker.{parts[1]}"


def _imports(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def _modules() -> list[tuple[str, Path]]:
    modules = []
    for path in sorted(BROKER.rglob("*.py")):
        name = ".".join(path.relative_to(BROKER.parent).with_suffix("").parts).removesuffix(".__init__")
        modules.append((name, path))
    return modules


def test_every_unit_is_placed() -> None:
    unplaced = {_unit(name) for name, _ in _modules()} - LAYERS.keys()
    assert not unplaced, f"place in LAYERS and docs/architecture.md: {sorted(u or '' for u in unplaced)}"


def test_no_module_imports_its_own_layer_or_above() -> None:
    upward: list[str] = []
    for name, path in _modules():
        own = _unit(name)
        assert own is not None
        for imported in _imports(path):
            unit = _unit(imported)
            if unit is None or unit == own:
                continue
            if unit not in LAYERS or LAYERS[unit] >= LAYERS[own]:
                upward.append(f"{name} imports {imported}")
    assert not upward, "\n".join(sorted(set(upward)))


def test_gateway_stages_import_only_earlier_stages() -> None:
    backward: list[str] = []
    for name, path in _modules():
        parts = name.split(".")
        if parts[:2] != ["broker", "gateway"] or len(parts) < 3 or parts[2] not in GATEWAY_ORDER:
            continue
        rank = GATEWAY_ORDER.index(parts[2])
        for imported in _imports(path):
            bits = imported.split(".")
            if bits[:2] == ["broker", "gateway"] and len(bits) > 2 and bits[2] in GATEWAY_ORDER:
                if GATEWAY_ORDER.index(bits[2]) > rank:
                    backward.append(f"{name} imports {imported}")
    assert not backward, "\n".join(sorted(set(backward)))


def test_the_rule_sees_an_upward_import(tmp_path: Path) -> None:
    # The walk itself: an import inside a function is found like one at the top.
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from broker.gateway.handler import McpGateway\n", encoding="utf-8")
    assert "broker.gateway.handler" in _imports(module)


def test_only_the_command_lines_parse_arguments() -> None:
    # The CLI parses and prints; the domain takes plain values (docs/architecture.md). A program
    # of its own (`python -m broker.keeper` in a tenant's Pod) parses in its __main__.
    parsers = [
        name
        for name, path in _modules()
        if _unit(name) not in ("broker.cli", "broker.testing")
        and not name.endswith(".__main__")
        and "argparse" in _imports(path)
    ]
    assert not parsers, f"argparse outside broker/cli/: {parsers}"
