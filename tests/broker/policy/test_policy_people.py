"""The Cedar principal is a person: their id at their issuer (issue 34 item 1).

Two people whose providers gave them one id are two entities, so a policy naming one of them
holds for that one only; and a policy naming a user without the issuer would match nobody (a
forbid that silently never holds), so loading it is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.policy import APPROVE, Call, PolicyError
from broker.types import OAuthScope, Principal
from tests.broker.policy.test_policy_engine import folder_with, load

IDP, OTHER = "https://idp.example", "https://other.example"
APPROVER = frozenset({OAuthScope.REPORTS_APPROVE})


def no_dave(named: str) -> str:
    return (
        f'@id("acme.no_dave") forbid (principal == Docbroker::User::"{named}", '
        'action == Docbroker::Action::"approve", resource);\n'
    )


def test_one_id_at_two_issuers_is_two_entities(tmp_path: Path) -> None:
    engine = load(folder_with(tmp_path, {"people.cedar": no_dave(f"acme/dave#{IDP}")}))
    dave = Principal("acme", "dave", APPROVER, issuer=IDP)
    namesake = Principal("acme", "dave", APPROVER, issuer=OTHER)
    assert dave.entity_id != namesake.entity_id
    refused = engine.decide(Call(dave, APPROVE, content_bytes=10))
    assert not refused.allowed and refused.policy_ids == ("acme.no_dave",)
    assert engine.decide(Call(namesake, APPROVE, content_bytes=10)).allowed


@pytest.mark.parametrize(
    "text",
    [
        no_dave("acme/dave"),
        '@id("acme.no_dave2") forbid (principal, action, resource) '
        'when { principal == Docbroker::User::"acme/dave" };\n',
    ],
)
def test_a_user_named_without_the_issuer_refuses_the_load(tmp_path: Path, text: str) -> None:
    with pytest.raises(PolicyError, match="without its issuer"):
        load(folder_with(tmp_path, {"people.cedar": text}))


def test_a_policy_table_names_the_person_with_their_issuer(tmp_path: Path) -> None:
    from tests.broker.policy.test_policy_cli import docbroker

    (tmp_path / "no-dave.cedar").write_text(no_dave(f"acme/dave#{IDP}").replace('"acme/', '"demo/'))
    (tmp_path / "t.test.toml").write_text(
        'with = ["no-dave.cedar"]\n[defaults]\ntool = "approve"\nscopes = ["reports:approve"]\n'
        f'[[case]]\nname = "dave"\nsubject = "dave"\nissuer = "{IDP}"\nexpect = "deny"\n'
        f'[[case]]\nname = "another dave"\nsubject = "dave"\nissuer = "{OTHER}"\nexpect = "allow"\n'
    )
    done = docbroker("test", str(tmp_path / "t.test.toml"))
    assert done.returncode == 0 and "2 passed, 0 failed" in done.stdout, done.stdout + done.stderr
