"""The settings that say who a person is (issue 34 items 1 and 2): the person claims, the
sign-in's groups claim, and issuers that cannot hold the `#` a person's Cedar id ends with."""

from __future__ import annotations

import pytest

from broker.settings import Settings, SettingsError

BASE = {
    "DOCBROKER_AUTH_ISSUER": "https://issuer.example",
    "DOCBROKER_AUTH_AUDIENCE": "docbroker",
    "DOCBROKER_AUTH_JWKS_URL": "https://issuer.example/jwks.json",
}
SIGN_IN = {
    "DOCBROKER_PUBLIC_URL": "https://docs.example",
    "DOCBROKER_OIDC_ISSUER": "https://issuer.example",
    "DOCBROKER_OIDC_CLIENT_ID": "docbroker",
}


def test_a_person_is_sub_unless_named_and_groups_come_from_groups() -> None:
    settings = Settings.from_env(BASE | SIGN_IN)
    assert settings.auth.person_claim == "sub"
    assert settings.oidc is not None
    assert (settings.oidc.person_claim, settings.oidc.groups_claim) == ("sub", "groups")
    named = Settings.from_env(
        BASE | SIGN_IN | {"DOCBROKER_AUTH_PERSON_CLAIM": "oid", "DOCBROKER_OIDC_PERSON_CLAIM": "oid",
                          "DOCBROKER_OIDC_GROUPS_CLAIM": "realm_access.roles"}
    )  # fmt: skip
    assert named.auth.person_claim == "oid" and named.oidc is not None
    assert (named.oidc.person_claim, named.oidc.groups_claim) == ("oid", "realm_access.roles")


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"DOCBROKER_AUTH_ISSUER": "https://issuer.example/#x"}, "DOCBROKER_AUTH_ISSUER"),
        ({"DOCBROKER_OIDC_ISSUER": "https://issuer.example/#x"}, "DOCBROKER_OIDC_ISSUER"),
    ],
)
def test_an_issuer_with_a_fragment_is_refused(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError, match=variable) as refused:
        Settings.from_env(BASE | SIGN_IN | env)
    assert "#x" not in str(refused.value)  # the variable is named, never its value
