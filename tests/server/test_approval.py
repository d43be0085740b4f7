"""server/approval.py: approval tokens v1 (DESIGN §3), verified against the written formula."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest

from server.approval import ApprovalVerifier, Expected, content_sha256, mint_token

NOW = 1_900_000_000
CONTENT = "# Summary\nAll good.\n"
JTI = "0123456789abcdef0123456789abcdef"


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def verifier(kit: Any, clock: Clock) -> ApprovalVerifier:
    return ApprovalVerifier(kit.secret, clock=clock)


def expected(kit: Any, filename: str = "summary.md", content: str = CONTENT) -> Expected:
    return Expected(tenant=kit.tenant, tool="save_report", filename=filename, sha256=content_sha256(content))


def token(kit: Any, *, secret: str | None = None, **fields: Any) -> str:
    return kit.sign({**kit.payload("summary.md", CONTENT, now=NOW), **fields}, secret or kit.secret)


def test_mint_token_is_byte_exact_to_the_design(kit: Any) -> None:
    minted = mint_token(
        secret=kit.secret,
        tenant=kit.tenant,
        tool="save_report",
        filename="summary.md",
        sha256=content_sha256(CONTENT),
        expires=NOW + 60,
        jti=JTI,
    )
    assert minted == kit.sign(kit.payload("summary.md", CONTENT, now=NOW, expires=NOW + 60, jti=JTI))
    encoded, _, mac = minted.rpartition(".")
    assert json.loads(base64.urlsafe_b64decode(encoded)) == {
        "v": 1,
        "scope": "acme",
        "tool": "save_report",
        "filename": "summary.md",
        "sha256": content_sha256(CONTENT),
        "expires": NOW + 60,
        "jti": JTI,
    }
    assert len(mac) == 64


def test_content_sha256_is_of_the_utf8_bytes() -> None:
    text = "é\U0001f600\r\n"
    assert content_sha256(text) == hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_valid_token_is_accepted(kit: Any, verifier: ApprovalVerifier) -> None:
    assert verifier.verify(token(kit), expected(kit))


def test_token_minted_by_mint_token_is_accepted(kit: Any, verifier: ApprovalVerifier) -> None:
    minted = mint_token(
        secret=kit.secret,
        tenant=kit.tenant,
        tool="save_report",
        filename="summary.md",
        sha256=content_sha256(CONTENT),
        expires=NOW + 300,
        jti=JTI,
    )
    assert verifier.verify(minted, expected(kit))


@pytest.mark.parametrize(
    "field, value",
    [
        ("scope", "other"),
        ("scope", "acme "),
        ("tool", "read_document"),
        ("tool", "SAVE_REPORT"),
        ("filename", "other.md"),
        ("sha256", content_sha256(CONTENT + " ")),
        ("sha256", content_sha256(CONTENT).upper()),
    ],
)
def test_token_for_another_call_is_rejected(
    kit: Any, verifier: ApprovalVerifier, field: str, value: str
) -> None:
    assert not verifier.verify(token(kit, **{field: value}), expected(kit))


def test_call_differing_from_the_token_is_rejected(kit: Any, verifier: ApprovalVerifier) -> None:
    tok = token(kit)
    assert not verifier.verify(tok, expected(kit, filename="other.md"))
    assert not verifier.verify(tok, expected(kit, content=CONTENT + "!"))
    assert not verifier.verify(tok, Expected("globex", "save_report", "summary.md", content_sha256(CONTENT)))
    assert verifier.verify(tok, expected(kit))  # none of the failures above consumed it


def test_token_of_another_tenant_fails_twice_over(kit: Any, verifier: ApprovalVerifier) -> None:
    other_secret = "globex-approval-secret-" + "f" * 32
    assert not verifier.verify(token(kit, secret=other_secret), expected(kit))
    assert not verifier.verify(token(kit, secret=other_secret, scope="globex"), expected(kit))


def test_tampered_mac_is_rejected(kit: Any, verifier: ApprovalVerifier) -> None:
    encoded, _, mac = token(kit).rpartition(".")
    flipped = mac[:-1] + ("0" if mac[-1] != "0" else "1")
    for bad in (flipped, mac.upper(), mac[:-1], mac + "0", "", "x" * 64):
        assert not verifier.verify(f"{encoded}.{bad}", expected(kit))


def test_tampered_payload_is_rejected(kit: Any, verifier: ApprovalVerifier) -> None:
    good = token(kit)
    _, _, mac = good.rpartition(".")
    # Re-encode a payload with one field changed, keeping the original MAC.
    forged_payload = kit.payload("summary.md", CONTENT, now=NOW, expires=NOW + 300)
    forged = base64.urlsafe_b64encode(
        json.dumps(forged_payload, sort_keys=True, separators=(",", ":")).encode()
    )
    assert not verifier.verify(f"{forged.decode()}.{mac}", expected(kit))


@pytest.mark.parametrize(
    "garbage",
    ["", ".", "no-dot", "abc.def", "é.é", "a" * 2048, ".".join(["x"] * 5)],
)
def test_malformed_tokens_are_rejected(kit: Any, verifier: ApprovalVerifier, garbage: str) -> None:
    assert not verifier.verify(garbage, expected(kit))


@pytest.mark.parametrize("expires", [str(NOW + 60), float(NOW + 60), True, None, [NOW + 60]])
def test_expires_must_be_an_int(kit: Any, verifier: ApprovalVerifier, expires: Any) -> None:
    assert not verifier.verify(token(kit, expires=expires), expected(kit))


@pytest.mark.parametrize("delta", [0, -1, -3600])
def test_expired_token_is_rejected(kit: Any, verifier: ApprovalVerifier, delta: int) -> None:
    assert not verifier.verify(token(kit, expires=NOW + delta), expected(kit))


def test_token_expiring_more_than_300s_ahead_is_rejected(kit: Any, verifier: ApprovalVerifier) -> None:
    assert not verifier.verify(token(kit, expires=NOW + 301), expected(kit))
    assert not verifier.verify(token(kit, expires=NOW + 10**9), expected(kit))
    assert verifier.verify(token(kit, expires=NOW + 300), expected(kit))


def test_expiry_is_judged_at_verification_time(kit: Any, verifier: ApprovalVerifier, clock: Clock) -> None:
    tok = token(kit, expires=NOW + 60)
    clock.now = NOW + 61
    assert not verifier.verify(tok, expected(kit))


@pytest.mark.parametrize(
    "jti",
    [JTI[:-1], JTI + "0", JTI.upper(), "g" * 32, " " + JTI[1:], "", 12345, None, True, [JTI]],
)
def test_bad_jti_is_rejected(kit: Any, verifier: ApprovalVerifier, jti: Any) -> None:
    assert not verifier.verify(token(kit, jti=jti), expected(kit))


def test_replayed_token_is_rejected(kit: Any, verifier: ApprovalVerifier) -> None:
    tok = token(kit, jti=JTI)
    assert verifier.verify(tok, expected(kit))
    assert not verifier.verify(tok, expected(kit))


def test_replayed_jti_is_rejected_even_for_another_call(kit: Any, verifier: ApprovalVerifier) -> None:
    assert verifier.verify(token(kit, jti=JTI), expected(kit))
    other = kit.mint("other.md", "other", now=NOW, jti=JTI)
    assert not verifier.verify(other, expected(kit, filename="other.md", content="other"))


def test_jti_is_remembered_only_while_its_token_is_unexpired(
    kit: Any, verifier: ApprovalVerifier, clock: Clock
) -> None:
    assert verifier.verify(token(kit, jti=JTI, expires=NOW + 10), expected(kit))
    clock.now = NOW + 11
    assert verifier.verify(kit.mint("summary.md", CONTENT, now=clock.now, jti=JTI), expected(kit))


def test_full_memory_refuses_rather_than_forgets(kit: Any, clock: Clock) -> None:
    verifier = ApprovalVerifier(kit.secret, clock=clock, max_remembered=2)
    assert verifier.verify(token(kit, expires=NOW + 10), expected(kit))
    assert verifier.verify(token(kit, expires=NOW + 100), expected(kit))
    assert not verifier.verify(token(kit), expected(kit))  # two live jtis: no room
    clock.now = NOW + 11  # the first expired: its slot is freed
    assert verifier.verify(kit.mint("summary.md", CONTENT, now=clock.now), expected(kit))


@pytest.mark.parametrize(
    "change",
    [
        {"extra": "x"},
        {"approved_by": "alice"},
    ],
)
def test_payload_with_extra_keys_is_rejected(
    kit: Any, verifier: ApprovalVerifier, change: dict[str, Any]
) -> None:
    assert not verifier.verify(kit.sign(kit.payload("summary.md", CONTENT, now=NOW, **change)), expected(kit))


@pytest.mark.parametrize("missing", ["v", "scope", "tool", "filename", "sha256", "expires", "jti"])
def test_payload_with_missing_keys_is_rejected(kit: Any, verifier: ApprovalVerifier, missing: str) -> None:
    payload = kit.payload("summary.md", CONTENT, now=NOW)
    del payload[missing]
    assert not verifier.verify(kit.sign(payload), expected(kit))


@pytest.mark.parametrize("version", [2, 0, True, 1.0, "1", None])
def test_other_versions_are_rejected(kit: Any, verifier: ApprovalVerifier, version: Any) -> None:
    assert not verifier.verify(
        kit.sign(kit.payload("summary.md", CONTENT, now=NOW, v=version)), expected(kit)
    )


@pytest.mark.parametrize("payload", [[1, 2], "text", 7, None])
def test_payload_that_is_not_an_object_is_rejected(
    kit: Any, verifier: ApprovalVerifier, payload: Any
) -> None:
    assert not verifier.verify(kit.sign(payload), expected(kit))


@pytest.mark.parametrize("field", ["scope", "tool", "filename", "sha256"])
def test_non_string_claims_are_rejected(kit: Any, verifier: ApprovalVerifier, field: str) -> None:
    assert not verifier.verify(
        kit.sign({**kit.payload("summary.md", CONTENT, now=NOW), field: 1}), expected(kit)
    )


@pytest.mark.parametrize("secret", ["", "short", "x" * 31, "é" * 40])
def test_weak_or_non_ascii_secret_is_refused(secret: str) -> None:
    with pytest.raises(ValueError):
        ApprovalVerifier(secret)


def test_secret_of_32_characters_is_enough(kit: Any, clock: Clock) -> None:
    secret = "x" * 32
    verifier = ApprovalVerifier(secret, clock=clock)
    assert verifier.verify(token(kit, secret=secret), expected(kit))
    assert not verifier.verify(token(kit), expected(kit))  # signed with another secret
