"""Real PostgreSQL for tests: the run's shared throw-away cluster, or one of a test's own.

`./dev test` starts a cluster with `.ci/postgres.sh` and exports DOCBROKER_TEST_DATABASE_URL;
without it the tests that need a database FAIL (never skip): a missing database must not
turn into a green run. Each test gets a schema of its own (its search path), dropped after.
A test that stops the server starts a cluster of its own (`ThrowAwayCluster`), so the shared
one never goes down under other tests.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = "DOCBROKER_TEST_DATABASE_URL"


def database_url() -> str:
    url = os.environ.get(ENV)
    if not url:
        pytest.fail(
            f"{ENV} is not set: these tests need PostgreSQL. `./dev test` starts one; by hand: "
            "bash .ci/postgres.sh start /tmp/pg && set -a && . /tmp/pg/env && set +a",
            pytrace=False,
        )
    return url


def with_search_path(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


@contextlib.contextmanager
def fresh_schema(url: str | None = None) -> Iterator[str]:
    """A URL whose sessions work in a new, empty schema (dropped at the end)."""
    base = url or database_url()
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_search_path(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


class ThrowAwayCluster:
    """A PostgreSQL server of the test's own (`.ci/postgres.sh`), to stop and start at will."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="docbroker-pg-"))
        shutil.rmtree(self.dir)  # postgres.sh makes it, with the owner and modes it needs
        run = subprocess.run(
            ["bash", str(ROOT / ".ci" / "postgres.sh"), "start", str(self.dir)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if run.returncode != 0:
            pytest.fail(f"could not start a throw-away PostgreSQL:\n{run.stderr[-2000:]}", pytrace=False)
        env = dict(line.split("=", 1) for line in (self.dir / "env").read_text().splitlines() if "=" in line)
        self.url = env["DOCBROKER_TEST_DATABASE_URL"]
        self._bin = Path(env["DOCBROKER_TEST_PG_BIN"])
        self._data = env["DOCBROKER_TEST_PG_DATA"]

    def _pg_ctl(self, *args: str) -> None:
        user = os.environ.get("DOCBROKER_PG_USER", "docbroker")
        subprocess.run(
            ["runuser", "-u", user, "--", str(self._bin / "pg_ctl"), "-D", self._data, "-w", *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def stop_server(self) -> None:
        self._pg_ctl("-m", "immediate", "stop")

    def start_server(self) -> None:
        socket_dir = self.dir / "socket"
        self._pg_ctl(
            "-l",
            str(self.dir / "postgres.log"),
            "-o",
            f"-k {socket_dir} -h '' -c fsync=off -c max_connections=200",
            "start",
        )

    def remove(self) -> None:
        subprocess.run(
            ["bash", str(ROOT / ".ci" / "postgres.sh"), "stop", str(self.dir)],
            capture_output=True,
            timeout=60,
        )
