"""`serve` and every other command read one environment alike (issue 34 item 8).

A real broker (`serve`) runs with an environment whose folders and keys are all its own (not
the defaults: the policies folder holds a policy `./policies` does not, the data dir is the
test's, the store SQLite or PostgreSQL); each command is then run as an operator runs it, as
a process given that same environment, and what it reports is what `serve` uses: the policy
set (`policy validate|test|explain` — they read `./policies` before), the approvals store
(`db status`), the broker's URL (`approvals`, `client-config`), the audit signing key (`audit
key`), the tenants (`tenant list`), the namespace, instance and master key (`tenant
manifest`). The settings the commands read alone (`*_from_env`) equal `serve`'s Settings.

The broker's policy is one whose evaluation fails for big saves (issue 34 item 7): `serve`
and `policy explain` refuse it alike, naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.master_key import load_master_key
from broker.runtime.kubernetes.manifest import tenant_objects, to_yaml
from broker.settings import (
    Settings,
    docker_host_from_env,
    docker_image_from_env,
    image_supply_from_env,
    kubernetes_from_env,
    master_key_file_from_env,
    policies_dir_from_env,
    public_url_from_env,
    store_from_env,
)
from broker.testing import ROOT, Broker, make_broker
from tests.broker.cli.cli_helpers import cli, json_out, token_file
from tests.broker.policy.policy_support import broker_on, set_in_force
from tests.broker.support import APPROVER_SCOPE, WRITE_SCOPE, call_modern, open_http, rpc_reply

# Refuses saves over 5000 bytes; past 9223 bytes the product overflows: Cedar's evaluation of
# the policy fails, and a failing policy must refuse as the forbid would have.
BIG_SAVES = (
    '@id("ops.big_saves")\nforbid (principal, action == Docbroker::Action::"save_report", resource)\n'
    "when { context has content_bytes && context.content_bytes * 1000000000000000 > 5000000000000000000 };\n"
)
TABLE = (
    '[[case]]\nname = "a big save"\nscopes = ["docs:write"]\ntool = "save_report"\n'
    'document = "q3.md"\ncontent_bytes = 10000\nexpect = "deny"\npolicies = ["ops.big_saves"]\n'
)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    env = {"DOCBROKER_INSTANCE": "alike", "DOCBROKER_KUBE_NAMESPACE": "alike-tenants"}
    tmp = tmp_path_factory.mktemp(f"alike-{request.param}")
    with broker_on(tmp, request.param, {"big-saves.cedar": BIG_SAVES}, env) as b:
        yield b


def test_the_policy_commands_check_the_set_serve_loads(broker: Broker, tmp_path: Path) -> None:
    in_force = set_in_force(broker)
    validated = cli(broker.env, "policy", "validate")
    assert validated.returncode == 0 and validated.stdout.endswith(f", set {in_force}\n"), validated.stdout
    shipped = cli({**broker.env, "DOCBROKER_POLICIES_DIR": str(ROOT / "policies")}, "policy", "validate")
    assert shipped.returncode == 0 and in_force not in shipped.stdout  # another folder: another set
    table = tmp_path / "big.test.toml"
    table.write_text(TABLE)
    tested = cli(broker.env, "policy", "test", str(table))
    assert tested.returncode == 0 and f"1 passed, 0 failed (big.test.toml, set {in_force})" in tested.stdout
    explained = cli(broker.env, "policy", "explain", "--tenant", "acme", "--tool", "read_document",
                    "--scopes", "docs:read", "--document", "a.md")  # fmt: skip
    assert json_out(explained)["policy_set"] == in_force


def test_serve_and_policy_explain_refuse_a_policy_that_fails_to_evaluate_alike(broker: Broker) -> None:
    """10,000 bytes: the forbid's product overflows. Cedar alone would skip it and let the
    save wait for approval; `serve` refuses it as policy, naming the policy, and so does
    `policy explain` given serve's environment."""
    writer = broker.token("acme", "rita", WRITE_SCOPE)
    for content, erred in (("😀" * 1500, False), ("😀" * 2500, True)):  # 6,000 and 10,000 bytes
        with open_http(broker, writer) as http:
            answer = rpc_reply(call_modern(http, "save_report", {"filename": "big.md", "content": content}))
        assert "error" in answer, answer  # refused before any approval is asked
        denied = [
            e for e in broker.audit_events() if e["event"] == "policy.denied" and e.get("subject") == "rita"
        ]
        assert denied[-1]["policy_ids"] == ["ops.big_saves"] and denied[-1]["policy_hash"] == set_in_force(
            broker
        )
        explained = json_out(
            cli(broker.env, "policy", "explain", "--tenant", "acme", "--subject", "rita", "--scopes",
                "docs:write", "--tool", "save_report", "--document", "big.md",
                "--content-bytes", str(len(content.encode())))
        )  # fmt: skip
        assert explained["decision"] == "deny"
        assert explained["determined_by"] == [{"id": "ops.big_saves", "file": "big-saves.cedar"}]
        assert explained.get("evaluation_error", False) is erred


def test_the_store_url_keys_and_tenants_are_serves(broker: Broker, tmp_path: Path) -> None:
    settings = Settings.from_env(broker.env)  # what `serve` built
    status = json_out(cli(broker.env, "db", "status", "--json"))
    backend = "postgresql" if settings.database.url else "sqlite"
    assert (status["backend"], status["state"]) == (backend, "current")  # the store serve opened

    approver = token_file(tmp_path, broker.token("acme", "carol", APPROVER_SCOPE))
    listed = cli(broker.env, "approvals", "list", "--json", "--token-file", str(approver))  # no --url
    assert listed.returncode == 0, listed.stderr
    config = cli(broker.env, "client-config", "--tenant", "acme", "--client", "python")
    assert config.returncode == 0 and f"{settings.server.public_url}/mcp" in config.stdout

    hex_key = cli(broker.env, "audit", "key", "--format", "hex")
    assert hex_key.returncode == 0, hex_key.stderr
    public = hex_key.stdout.splitlines()[1]
    verified = cli(broker.env, "audit", "verify", str(settings.audit.path), "--key", public)
    assert verified.returncode == 0, verified.stdout + verified.stderr  # the key serve signs with

    tenants = json_out(cli(broker.env, "tenant", "list", "--json"))["tenants"]
    assert {t["tenant"] for t in tenants} >= {
        p.stem for p in (settings.policies_dir / "tenants").glob("*.toml")
    }
    manifest = cli(broker.env, "tenant", "manifest", "acme", "--secret")
    assert manifest.returncode == 0, manifest.stderr
    assert manifest.stdout == to_yaml(
        tenant_objects("acme", namespace="alike-tenants", instance="alike", sources_size="1Gi",
                       reports_size="1Gi", storage_class=None,
                       master_key=load_master_key(settings.master_key_file))
    )  # fmt: skip


def test_every_part_a_command_reads_alone_is_serves(tmp_path: Path) -> None:
    env = {
        **make_broker(tmp_path).env,
        "DOCBROKER_DATABASE_URL": "postgresql://docbroker@db.example/approvals?sslmode=verify-full",
        "DOCBROKER_PUBLIC_URL": "https://docs.example.com/",
        "DOCBROKER_MASTER_KEY_FILE": str(tmp_path / "keys" / "master.key"),
        "DOCBROKER_DOCKER_HOST": "unix:///run/user/1000/docker.sock",
        "DOCBROKER_DOCKER_IMAGE": "registry.example/docbroker-server:7",
        "DOCBROKER_IMAGE_RECORDS": str(tmp_path / "records"),
        "DOCBROKER_IMAGE_TRUST_KEYS": f"{tmp_path / 'a.pub'},{tmp_path / 'b.pub'}",
        "DOCBROKER_INSTANCE": "blue",
        "DOCBROKER_KUBE_NAMESPACE": "blue-tenants",
    }
    settings = Settings.from_env(env)
    store = store_from_env(env)
    assert (store.data_dir, store.database) == (settings.data_dir, settings.database)
    assert policies_dir_from_env(env) == settings.policies_dir
    assert public_url_from_env(env) == settings.server.public_url == "https://docs.example.com"
    assert master_key_file_from_env(env) == settings.master_key_file
    assert docker_host_from_env(env) == settings.runtime.docker.base_url
    assert docker_image_from_env(env) == settings.runtime.docker.image
    assert image_supply_from_env(env) == settings.supply
    kube, instance = kubernetes_from_env(env, by_digest=False)
    assert (kube, instance) == (settings.runtime.kubernetes, settings.runtime.instance)
