"""docs/kubernetes.md's database, roles and grants for PostgreSQL 15+, run as written: the
administrator's block as a role that is not a superuser (what a managed service gives), the
owner's block as `docbroker_owner`, `docbroker db upgrade` as the owner, a real broker as
`docbroker_app`. The brokers' role reads and writes rows and can create nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from broker.testing import ROOT, make_broker
from tests.broker.approvals.test_approvals_postgres import decide, save
from tests.broker.pgtest import ThrowAwayCluster
from tests.broker.support import unique

DOC = ROOT / "docs" / "kubernetes.md"


def sql_block(first_line: str) -> str:
    """The ```sql block of the docs whose first line starts with `first_line`."""
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"docs/kubernetes.md: one sql block starting {first_line!r}"
    return found[0]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowAwayCluster]:
    pg = ThrowAwayCluster()
    try:
        yield pg
    finally:
        pg.remove()


def url_as(cluster: ThrowAwayCluster, user: str, dbname: str) -> str:
    return f"postgresql://{user}@/{dbname}?{urlsplit(cluster.url).query}"  # its socket (and port)


def psql(cluster: ThrowAwayCluster, url: str, script: str) -> None:
    done = subprocess.run(
        [str(cluster._bin / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


# The first line of each block of "Database (PostgreSQL 15 or later)", in the order they run.
SQL_BLOCKS = ("-- as the server's administrator", "-- as docbroker_owner")


def documented_roles(cluster: ThrowAwayCluster) -> None:
    """The page's two blocks, as written: the administrator's as a role that is no superuser
    (what a managed service gives: it creates roles and databases), then the owner's."""
    with psycopg.connect(cluster.url, autocommit=True) as conn:  # the cluster's superuser
        conn.execute("CREATE ROLE admin LOGIN CREATEROLE CREATEDB")
    admin, owner = SQL_BLOCKS
    psql(cluster, url_as(cluster, "admin", "postgres"), sql_block(admin))
    psql(cluster, url_as(cluster, "docbroker_owner", "docbroker"), sql_block(owner))


def test_the_documented_roles_migrate_as_the_owner_and_serve_as_the_app_role(
    tmp_path: Path, cluster: ThrowAwayCluster
) -> None:
    documented_roles(cluster)
    owner, app = (
        url_as(cluster, "docbroker_owner", "docbroker"),
        url_as(cluster, "docbroker_app", "docbroker"),
    )
    broker = make_broker(tmp_path, env={"DOCBROKER_DATABASE_URL": app})
    upgraded = subprocess.run(
        [sys.executable, "-m", "broker", "db", "upgrade"],
        cwd=ROOT,
        env={**broker.env, "DOCBROKER_DATABASE_URL": owner},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert upgraded.returncode == 0, upgraded.stderr
    with psycopg.connect(app, autocommit=True) as conn:
        # the tables are in the schema `docbroker`, found through the role's search_path
        found = conn.execute("SELECT schemaname FROM pg_tables WHERE tablename = 'approvals'").fetchall()
        assert found == [("docbroker",)]
        for statement in (
            "CREATE TABLE docbroker.planted (a int)",
            "CREATE TABLE public.planted (a int)",  # PostgreSQL 15+: nobody may create in public
            "ALTER TABLE approvals ADD COLUMN planted int",
            "DROP TABLE approvals",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)

    broker.start()
    try:
        name = unique()
        waiting = save(broker, name, "written by the app role")
        assert waiting["status"] == "waiting_approval", waiting
        assert decide(broker, waiting["data"]["approval_id"]).status_code == 200
        assert save(broker, name, "written by the app role")["status"] == "ok"
    finally:
        broker.stop()
