"""The broker's and the sandbox's servers freeze their start-up heap before serving.

A full collection walks every tracked object; after start-up most of them (modules, classes,
the app) live as long as the process, and walking them cost ~35 ms of a held GIL on this host
each time: the warm calls' p99 (bench/scale.py). `BrokerServer` (broker/serving.py) and
`QuietServer` (server/quiet.py) freeze them once serving begins. Each runs here in its own
process, on a real socket, with an app that answers with `gc.get_freeze_count()`; uvicorn's own
server, run the same way, freezes nothing (the check can fail).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.server.test_bearer import free_port, stop, wait_serving

SCRIPT = """
import gc, json, sys
import uvicorn
from {module} import {name} as Server

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({{"type": "lifespan.startup.complete"}})
            else:
                await send({{"type": "lifespan.shutdown.complete"}})
                return
    body = json.dumps({{"frozen": gc.get_freeze_count()}}).encode()
    await send({{"type": "http.response.start", "status": 200, "headers": []}})
    await send({{"type": "http.response.body", "body": body}})

gc.unfreeze()
Server(uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")).run()
"""


def frozen_while_serving(module: str, name: str, tmp_path: Path) -> int:
    port, log = free_port(), tmp_path / f"{name}.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", SCRIPT.format(module=module, name=name), str(port)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_serving(proc, port, log)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
            return int(json.loads(answer.read())["frozen"])
    finally:
        stop(proc)


@pytest.mark.parametrize(
    ("module", "name"), [("broker.serving", "BrokerServer"), ("server.quiet", "QuietServer")]
)
def test_serving_begins_with_the_start_up_heap_frozen(module: str, name: str, tmp_path: Path) -> None:
    # uvicorn, starlette's pieces it imports and the app: thousands of objects at least
    assert frozen_while_serving(module, name, tmp_path) > 10_000


def test_uvicorns_own_server_freezes_nothing(tmp_path: Path) -> None:
    assert frozen_while_serving("uvicorn", "Server", tmp_path) == 0
