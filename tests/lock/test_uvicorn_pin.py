"""uvicorn is pinned exactly while we subclass its private protocol class (issue 27, item 1).

broker/http_edge.py (`EdgeProtocol`) and server/http_protocol.py (`OneWriteHttpToolsProtocol`)
subclass `uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`, which is no public API: they
override its parser callbacks and read and write its per-connection state. A uvicorn release can
rename any of it, and the edge's limits would then silently stop holding (a trailer landing in
the scope's headers again, a deadline that never fires). So: uvicorn is pinned to one version in
pyproject.toml and uv.lock, and this test reads our two modules' source for every attribute and
method of uvicorn's that they use and checks each one on a live HttpToolsProtocol that has read a
real request head. An upgrade that changes one fails here, naming it.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import inspect
import socket
import tomllib
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

ROOT = Path(__file__).resolve().parents[2]
SUBCLASSES = {
    ROOT / "server" / "http_protocol.py": ("OneWriteHttpToolsProtocol",),
    ROOT / "broker" / "http_edge.py": ("EdgeProtocol",),
}
# What http_edge.py reads of a request's cycle (through a local `cycle = self.cycle`)
CYCLE_ATTRIBUTES = ("response_started", "response_complete")


def _pinned_uvicorn() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if d.split("=")[0].split(">")[0].split("<")[0].strip() == "uvicorn"]
    assert spec.startswith("uvicorn=="), f"uvicorn must be pinned exactly while we subclass it: {spec}"
    return str(spec).removeprefix("uvicorn==")


def test_uvicorn_is_pinned_exactly_and_installed_at_the_pin() -> None:
    pinned = _pinned_uvicorn()
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (locked,) = [p["version"] for p in lock["package"] if p["name"] == "uvicorn"]
    assert locked == pinned, f"uv.lock has uvicorn {locked}, pyproject.toml pins {pinned}: run ./dev lock"
    assert importlib.metadata.version("uvicorn") == pinned, "the venv's uvicorn is not the pinned one"


def _uses() -> tuple[set[str], set[str], dict[str, list[str]]]:
    """(self.X names, super().X names, our overrides' parameter names) not defined by our classes."""
    used: set[str] = set()
    supers: set[str] = set()
    own: set[str] = set()
    overrides: dict[str, list[str]] = {}
    for path, classes in SUBCLASSES.items():
        tree = ast.parse(path.read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in classes):
            for item in cls.body:
                if isinstance(item, ast.FunctionDef):
                    own.add(item.name)
                    overrides[item.name] = [a.arg for a in item.args.args]
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    own.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    own.update(t.id for t in item.targets if isinstance(t, ast.Name))
            for node in ast.walk(cls):
                if not isinstance(node, ast.Attribute):
                    continue
                if isinstance(node.value, ast.Name) and node.value.id == "self":
                    used.add(node.attr)
                elif isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "super":
                    supers.add(node.attr)
    return used - own, supers, {k: v for k, v in overrides.items() if hasattr(HttpToolsProtocol, k)}


def test_our_subclasses_use_only_what_uvicorns_protocol_has() -> None:
    attributes, supers, overrides = _uses()
    # the test reads the real code: these must be among what it found, or the AST walk is broken
    assert len(attributes) >= 5 and len(supers) >= 5, (attributes, supers)
    version = uvicorn.__version__

    for name in sorted(supers):
        method = HttpToolsProtocol.__dict__.get(name)
        assert callable(method), (
            f"uvicorn {version}: HttpToolsProtocol.{name} is gone (we call super().{name})"
        )
    for name, params in sorted(overrides.items()):
        theirs = list(inspect.signature(getattr(HttpToolsProtocol, name)).parameters)
        assert theirs == params, (
            f"uvicorn {version}: HttpToolsProtocol.{name}{tuple(theirs)}, ours {tuple(params)}"
        )

    live = asyncio.run(_a_protocol_that_read_a_head())
    for name in sorted(attributes):
        assert name in live, f"uvicorn {version}: HttpToolsProtocol has no attribute {name!r}, which we use"
    cycle = live["cycle"]
    assert isinstance(cycle, RequestResponseCycle), f"uvicorn {version}: 'cycle' is no RequestResponseCycle"
    for name in CYCLE_ATTRIBUTES:
        assert hasattr(cycle, name), f"uvicorn {version}: RequestResponseCycle has no attribute {name!r}"
    # The trailer defence (http_edge.py, on_headers_complete) swaps `self.headers` for a sink,
    # relying on on_header appending to it and on it being the very list the scope holds.
    assert live["scope_headers_are_self_headers"], f"uvicorn {version}: scope['headers'] is not self.headers"
    assert "self.headers.append" in inspect.getsource(HttpToolsProtocol.on_header), (
        f"uvicorn {version}: HttpToolsProtocol.on_header no longer appends to self.headers"
    )


async def _a_protocol_that_read_a_head() -> dict[str, Any]:
    """uvicorn's own protocol on a real socket, after the head of a request whose body is due."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()

    loop = asyncio.get_running_loop()
    config = uvicorn.Config(app, http="httptools", lifespan="off", log_level="critical")
    config.load()
    state = ServerState()
    protocol = HttpToolsProtocol(config, state, {}, _loop=loop)
    ours, theirs = socket.socketpair()
    try:
        transport, _ = await loop.connect_accepted_socket(lambda: protocol, ours)
        protocol.data_received(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n")
        live: dict[str, Any] = {name: getattr(protocol, name) for name in dir(protocol)}
        live["scope_headers_are_self_headers"] = protocol.scope["headers"] is protocol.headers
        transport.close()
        for task in list(state.tasks):
            task.cancel()
        await asyncio.gather(*state.tasks, return_exceptions=True)
        return live
    finally:
        theirs.close()


def test_the_server_methods_we_override_are_uvicorns() -> None:
    """broker/serving.py (`BrokerServer.shutdown`, which wraps `self.lifespan.shutdown`) and
    server/quiet.py (`QuietServer.main_loop`, `on_tick`, `handle_exit`) override uvicorn.Server's
    private loop and shutdown: a release that renames or reshapes one fails here, by name."""
    expected = {
        "main_loop": ["self"],
        "on_tick": ["self", "counter"],
        "handle_exit": ["self", "sig", "frame"],
        "shutdown": ["self", "sockets"],
    }
    # Read from uvicorn's own source, not the live class: other code in a test run (a test
    # client's helper) may have patched a method with a wrapper of its own by now.
    import uvicorn.server

    tree = ast.parse(Path(inspect.getfile(uvicorn.server)).read_text())
    (server,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Server"]
    methods = {f.name: f for f in server.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    for name, params in expected.items():
        assert name in methods, f"uvicorn.Server has no {name!r}, which we override"
        assert [a.arg for a in methods[name].args.args] == params, f"uvicorn.Server.{name} changed"
    shutdown = ast.get_source_segment(Path(inspect.getfile(uvicorn.server)).read_text(), methods["shutdown"])
    assert shutdown is not None and "self.lifespan.shutdown()" in shutdown, (
        "uvicorn.Server.shutdown no longer calls the app's shutdown"
    )
