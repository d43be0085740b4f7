"""The operators' bearer file (`broker/auth/ops.py`): what it accepts, what stops the broker.

The request side (who reads /metrics and /readyz's details) is tested on a real broker in
tests/broker/test_ops_surface.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.auth.ops import OpsTokenError, OpsTokens
from broker.testing import make_broker
from tests.broker.support import serve_once

TOKEN = "a" * 31 + "Z"
OLD = "o" * 40


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def bearer(token: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {token}".encode())]


def test_every_line_is_a_token_so_one_can_rotate(tmp_path: Path) -> None:
    tokens = OpsTokens.load(write(tmp_path / "ops.token", f"{TOKEN}\n\n{OLD}\n"))
    assert tokens.allowed(bearer(TOKEN)) and tokens.allowed(bearer(OLD))
    assert tokens.allowed([(b"authorization", f"bearer  {TOKEN}".encode())])  # scheme in any case
    assert not tokens.allowed(bearer(TOKEN[:-1]))
    assert not tokens.allowed(bearer(TOKEN + "x"))
    assert not tokens.allowed([])
    assert not tokens.allowed(bearer(TOKEN) + bearer(TOKEN))  # two headers: which one counts?


def test_no_file_no_operator() -> None:
    assert not OpsTokens.load(None).allowed(bearer(TOKEN))
    assert not OpsTokens.load(None).allowed(bearer(""))


@pytest.mark.parametrize(
    ("content", "mode", "problem"),
    [
        (TOKEN, 0o640, "readable by group"),
        ("short-token\n", 0o600, "32+"),
        (f"{TOKEN} {TOKEN}\n", 0o600, "without spaces"),
        ("\n\n", 0o600, "one token per line"),
        ("é" * 40, 0o600, "ASCII"),
    ],
)
def test_a_file_that_cannot_be_used_is_refused_naming_the_file_only(
    tmp_path: Path, content: str, mode: int, problem: str
) -> None:
    path = write(tmp_path / "ops.token", content, mode)
    with pytest.raises(OpsTokenError, match=problem) as caught:
        OpsTokens.load(path)
    assert TOKEN not in str(caught.value) and "short-token" not in str(caught.value)


def test_a_link_is_refused(tmp_path: Path) -> None:
    target = write(tmp_path / "real.token", TOKEN)
    os.symlink(target, tmp_path / "ops.token")
    with pytest.raises(OpsTokenError, match="symbolic link"):
        OpsTokens.load(tmp_path / "ops.token")


def test_the_broker_does_not_start_on_an_unusable_file_and_says_so_in_one_line(tmp_path: Path) -> None:
    broker = make_broker(tmp_path)
    write(Path(broker.env["DOCBROKER_OPS_TOKEN_FILE"]), "too-short-to-guess-nothing\n")
    done = serve_once(broker)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "too-short" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("docbroker: cannot start: ops token file ops.token")
