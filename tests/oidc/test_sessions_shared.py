"""Sessions are shared by replicas through PostgreSQL (issue 26 item 1): signed in at one
replica, the approver is served by any; logged out at one, the cookie is dead at all."""

from __future__ import annotations

from pathlib import Path

from broker.testing.replicas import make_replicas
from tests.broker.pgtest import fresh_schema
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
                assert at_b.request("GET", "/v1/approvals").status_code == 200
                assert at_b.post("/approvals/logout", session["csrf"]).status_code == 200
                assert at_a.request("GET", "/v1/approvals").status_code == 401
                assert at_a.session()["signed_in"] is False
        finally:
            provider.stop()
