"""A `DOCBROKER_*` variable that no setting reads stops the start (issue 36 item 2).

A typo (`DOCBROKER_OIDC_ISSUR`) or a setting since removed used to be ignored in silence: the
broker started with sign-in off, or a limit at its default. Now `serve` — and every command,
reading its part the way `serve` does — refuses it in one line naming the closest setting,
never the value. The test harness's `DOCBROKER_TEST_*` are aside, and so is every variable
read elsewhere (`OTHER_VARIABLES`: scripts, the CLI's clients, the lab's Pod), each checked
to be read where it says.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker.settings import Settings, SettingsError, every_read, policies_dir_from_env
from broker.settings.known import OTHER_VARIABLES
from broker.testing import ROOT, make_broker
from tests.broker.cli.cli_helpers import cli, one_line_error

BASE = {
    "DOCBROKER_AUTH_ISSUER": "https://issuer.example",
    "DOCBROKER_AUTH_AUDIENCE": "docbroker",
    "DOCBROKER_AUTH_JWKS_URL": "https://issuer.example/jwks",
}
SECRET = "https://idp.example/secret-tenant-path"


@pytest.mark.parametrize(
    ("typo", "closest"),
    [
        ("DOCBROKER_OIDC_ISSUR", "DOCBROKER_OIDC_ISSUER"),
        ("DOCBROKER_MAX_SANDBOX", "DOCBROKER_MAX_SANDBOXES"),
        ("DOCBROKER_DATABASE_URI", "DOCBROKER_DATABASE_URL"),
        ("DOCBROKER_OIDC_MAX_OPEN_SIGNINS", None),  # a removed setting: nothing is close
        ("DOCBROKER_FROBNICATE", None),  # nothing is close
    ],
)
def test_a_variable_no_setting_reads_is_refused_naming_the_closest(typo: str, closest: str | None) -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env(BASE | {typo: SECRET})
    message = str(refused.value)
    assert "\n" not in message and typo in message and SECRET not in message
    if closest is not None:
        assert message.endswith(f"did you mean {closest}?")
    else:
        assert "did you mean" not in message


def test_the_harness_and_the_variables_read_elsewhere_are_aside() -> None:
    env = BASE | {"DOCBROKER_TEST_DATABASE_URL": "x", "DOCBROKER_TOKEN": "x", "DOCBROKER_VENV": "/v"}
    assert Settings.from_env(env).auth.issuer == "https://issuer.example"


def test_serve_refuses_a_typo_in_one_line_before_it_starts(tmp_path: Path) -> None:
    env = make_broker(tmp_path).env | {"DOCBROKER_OIDC_ISSUR": SECRET}
    line = one_line_error(cli(env, "serve", timeout=30), 2)
    assert line.endswith("DOCBROKER_OIDC_ISSUR is not a setting: did you mean DOCBROKER_OIDC_ISSUER?")
    assert SECRET not in line


def test_a_command_reading_its_part_refuses_it_as_serve_does(tmp_path: Path) -> None:
    # `policy validate` with a misspelt folder would otherwise check ./policies, not the set
    # the operator meant.
    env = {"DOCBROKER_POLICIES_DIRR": str(tmp_path)}
    with pytest.raises(SettingsError, match="did you mean DOCBROKER_POLICIES_DIR"):
        policies_dir_from_env(env)
    base = make_broker(tmp_path).env
    line = one_line_error(cli(base | env, "policy", "validate"), 2)
    assert "DOCBROKER_POLICIES_DIRR is not a setting" in line


def _named_in(places: tuple[str, ...]) -> set[str]:
    found: set[str] = set()
    for place in places:
        target = ROOT / place
        files = [target] if target.is_file() else [p for p in target.rglob("*") if p.is_file()]
        for path in files:
            if path.suffix in (".pyc", ".png"):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            found |= set(re.findall(r"\bDOCBROKER_[A-Z0-9_]*[A-Z0-9]\b(?![*_])", text))
    return found


def test_every_variable_the_deployment_and_scripts_set_is_known() -> None:
    # What starts a broker (deploy/, k8s/, .ci/, dev, bench/) and what the docs tell operators
    # to set: a name there that the check does not know would stop a start.
    known = {r.name for r in every_read()} | set(OTHER_VARIABLES)
    named = _named_in(("deploy", "k8s", ".ci", "dev", "bench", "docs", "README.md", "broker/cli"))
    named.discard("DOCBROKER_DATABASE_URL_FILE")  # k8s/base says there is none
    unknown = sorted(n for n in named if n not in known and not n.startswith("DOCBROKER_TEST_"))
    assert unknown == []


@pytest.mark.parametrize("name", sorted(OTHER_VARIABLES))
def test_each_variable_read_elsewhere_is_read_where_it_says(name: str) -> None:
    places = tuple(p.strip() for p in OTHER_VARIABLES[name].split(","))
    assert name in _named_in(places)
