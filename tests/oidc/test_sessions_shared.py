"""Sessions are shared by replicas through PostgreSQL (issue 26 item 1): signed in at one
replica, the approver is served by any; logged out at one, the cookie is dead at all. While
the database is down, sessions fail closed (503) and come back with it."""

from __future__ import annotations

from pathlib import Path

from broker.testing.replicas import make_replicas
from tests.broker.pgtest import ThrowAwayCluster, fresh_schema
from tests.broker.support import wait_for
from tests.oidc.support import SESSION_COOKIE, Browser, oidc_env, start_provider


def test_a_session_begun_at_one_replica_is_served_and_ended_by_another(tmp_path: Path) -> None:
    with fresh_schema() as url:
        replicas = make_replicas(tmp_path, 2, database_url=url)
        a, b = replicas
        provider = start_provider(tmp_path, [a.url, b.url])
        try:
            for replica in replicas:
                replica.env.update(oidc_env(provider, tmp_path / "oidc-client.secret"))
            with replicas:
                at_a = Browser(a)
                assert at_a.sign_in("ann").status_code == 303
                cookie = at_a.cookies[SESSION_COOKIE]
                at_b = Browser(b, cookies={SESSION_COOKIE: cookie})
                session = at_b.session()
                assert (session["signed_in"], session["subject"]) == (True, "ann")
                assert session["groups"] == ["acme-approvers", "docbroker-approvers"]  # kept in PostgreSQL
                assert at_b.request("GET", "/v1/approvals").status_code == 200
                assert at_b.post("/approvals/logout", session["csrf"]).status_code == 200
                assert at_a.request("GET", "/v1/approvals").status_code == 401
                assert at_a.session()["signed_in"] is False
        finally:
            provider.stop()


def test_while_the_database_is_down_sign_in_and_out_fail_closed_and_come_back(tmp_path: Path) -> None:
    cluster = ThrowAwayCluster()
    try:
        replicas = make_replicas(tmp_path, 1, database_url=cluster.url)
        (a,) = replicas
        provider = start_provider(tmp_path, [a.url])
        try:
            a.env.update(oidc_env(provider, tmp_path / "oidc-client.secret"))
            with replicas:
                ann = Browser(a)
                assert ann.sign_in("ann").status_code == 303
                csrf = ann.session()["csrf"]
                cluster.stop_server()
                # one clear 503 each, never a 500, and nobody is let in on a guess: a sign-in
                # begins (nothing of it is stored) but cannot complete into a session
                bob = Browser(a)
                finished = bob.request("GET", bob.authenticate(bob.start(), "bob"))
                assert finished.status_code == 503 and "sessions_unavailable" in finished.text
                assert "__Host-docbroker-session" not in bob.cookies
                assert ann.request("GET", "/approvals/session").status_code == 503
                assert ann.request("GET", "/v1/approvals").status_code == 503
                out = ann.post("/approvals/logout", csrf)
                assert (out.status_code, out.json()) == (503, {"error": "approvals_unavailable"})
                cluster.start_server()
                assert wait_for(lambda: ann.request("GET", "/v1/approvals").status_code == 200, timeout=30)
                assert ann.post("/approvals/logout", csrf).status_code == 200
                assert ann.request("GET", "/v1/approvals").status_code == 401
        finally:
            provider.stop()
    finally:
        cluster.remove()
