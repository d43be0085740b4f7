"""The per-tenant credentials of the pod network (DESIGN §10): derived, distinct, one-way."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from broker.master_key import keeper_key, sandbox_key, tenant_secret


def test_keys_are_the_contracts_derivations() -> None:
    master = secrets.token_bytes(32)
    expect_sandbox = hmac.new(master, b"docbroker/sandbox/v1/acme", hashlib.sha256).hexdigest()
    expect_keeper = hmac.new(master, b"docbroker/keeper/v1/acme", hashlib.sha256).hexdigest()
    assert sandbox_key(master, "acme") == expect_sandbox
    assert keeper_key(master, "acme") == expect_keeper


def test_each_tenant_and_each_use_has_its_own_key() -> None:
    master = secrets.token_bytes(32)
    keys = {
        f(master, tenant) for f in (sandbox_key, keeper_key, tenant_secret) for tenant in ("acme", "globex")
    }
    assert len(keys) == 6
    assert sandbox_key(secrets.token_bytes(32), "acme") != sandbox_key(master, "acme")
