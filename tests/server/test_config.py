"""server/config.py and start-up: a wrongly provisioned sandbox fails fast, clearly, quietly.

The start-up cases run the real `python -m server` as a subprocess: a non-zero exit, a
stderr message naming the variable, no traceback, nothing on stdout.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from server.config import ConfigError, ServerConfig

Breakage = Callable[[Path, Path, dict[str, str]], None]


def _unset(name: str) -> Breakage:
    def apply(root: Path, secret: Path, env: dict[str, str]) -> None:
        env.pop(name)

    return apply


def _set(name: str, value: str) -> Breakage:
    def apply(root: Path, secret: Path, env: dict[str, str]) -> None:
        env[name] = value

    return apply


def _rmdir(folder: str) -> Breakage:
    def apply(root: Path, secret: Path, env: dict[str, str]) -> None:
        (root / folder).rmdir()

    return apply


def _symlink(folder: str) -> Breakage:
    def apply(root: Path, secret: Path, env: dict[str, str]) -> None:
        real = root.parent / f"real-{folder}"
        (root / folder).rename(real)
        (root / folder).symlink_to(real)

    return apply


def _root_is(kind: str) -> Breakage:
    def apply(root: Path, secret: Path, env: dict[str, str]) -> None:
        target = root.parent / "not-a-dir"
        if kind == "file":
            target.write_text("x")
        env["DOCS_ROOT"] = str(target)

    return apply


def _secret_text(text: str | bytes) -> Breakage:
    def apply(root: Path, secret: Path, env: dict[str, str]) -> None:
        secret.write_bytes(text if isinstance(text, bytes) else text.encode())

    return apply


def _secret_is_dir(root: Path, secret: Path, env: dict[str, str]) -> None:
    secret.unlink()
    secret.mkdir()


def _secret_missing(root: Path, secret: Path, env: dict[str, str]) -> None:
    secret.unlink()


# (case id, breakage, the variable the message must name)
CASES: list[tuple[str, Breakage, str]] = [
    ("root-unset", _unset("DOCS_ROOT"), "DOCS_ROOT"),
    ("root-empty", _set("DOCS_ROOT", ""), "DOCS_ROOT"),
    ("root-missing", _root_is("missing"), "DOCS_ROOT"),
    ("root-is-file", _root_is("file"), "DOCS_ROOT"),
    ("sources-missing", _rmdir("sources"), "DOCS_ROOT"),
    ("reports-missing", _rmdir("reports"), "DOCS_ROOT"),
    ("sources-symlink", _symlink("sources"), "DOCS_ROOT"),
    ("reports-symlink", _symlink("reports"), "DOCS_ROOT"),
    ("scope-unset", _unset("DOCS_SCOPE"), "DOCS_SCOPE"),
    ("scope-empty", _set("DOCS_SCOPE", "  "), "DOCS_SCOPE"),
    ("scope-uppercase", _set("DOCS_SCOPE", "Acme"), "DOCS_SCOPE"),
    ("scope-underscore", _set("DOCS_SCOPE", "acme_corp"), "DOCS_SCOPE"),
    ("scope-leading-dash", _set("DOCS_SCOPE", "-acme"), "DOCS_SCOPE"),
    ("scope-trailing-dash", _set("DOCS_SCOPE", "acme-"), "DOCS_SCOPE"),
    ("scope-dot", _set("DOCS_SCOPE", "acme.corp"), "DOCS_SCOPE"),
    ("scope-64-chars", _set("DOCS_SCOPE", "a" * 64), "DOCS_SCOPE"),
    ("scope-slash", _set("DOCS_SCOPE", "../acme"), "DOCS_SCOPE"),
    ("secret-unset", _unset("DOCS_SECRET_FILE"), "DOCS_SECRET_FILE"),
    ("secret-missing", _secret_missing, "DOCS_SECRET_FILE"),
    ("secret-is-dir", _secret_is_dir, "DOCS_SECRET_FILE"),
    ("secret-empty", _secret_text(""), "DOCS_SECRET_FILE"),
    ("secret-31-chars", _secret_text("k" * 31 + "\n"), "DOCS_SECRET_FILE"),
    ("secret-padded-31", _secret_text("   " + "k" * 31 + "  \n"), "DOCS_SECRET_FILE"),
    ("secret-not-ascii", _secret_text("é" * 40), "DOCS_SECRET_FILE"),
    ("secret-too-large", _secret_text(b"k" * 5000), "DOCS_SECRET_FILE"),
]


@pytest.fixture
def tenant(kit: Any, tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    root, secret_file = kit.make_tenant(tmp_path)
    return root, secret_file, kit.env(root, secret_file)


# --- ServerConfig.from_env -----------------------------------------------------------------------


def test_valid_configuration(kit: Any, tenant: tuple[Path, Path, dict[str, str]]) -> None:
    root, _, env = tenant
    config = ServerConfig.from_env(env)
    assert (config.docs_root, config.tenant, config.secret) == (root, "acme", kit.secret)


def test_secret_of_exactly_32_characters_is_enough(tenant: tuple[Path, Path, dict[str, str]]) -> None:
    _, secret_file, env = tenant
    secret_file.write_text("k" * 32 + "\n")
    assert ServerConfig.from_env(env).secret == "k" * 32


@pytest.mark.parametrize("scope", ["a", "acme", "tenant-42", "0", "a" * 63, "a-b-c"])
def test_dns_label_scopes_are_accepted(tenant: tuple[Path, Path, dict[str, str]], scope: str) -> None:
    _, _, env = tenant
    assert ServerConfig.from_env({**env, "DOCS_SCOPE": scope}).tenant == scope


def test_repr_hides_the_secret(kit: Any, tenant: tuple[Path, Path, dict[str, str]]) -> None:
    config = ServerConfig.from_env(tenant[2])
    assert kit.secret not in repr(config) and kit.secret not in str(config)


@pytest.mark.parametrize(("case", "breakage", "variable"), CASES, ids=[c[0] for c in CASES])
def test_from_env_names_the_variable(
    tenant: tuple[Path, Path, dict[str, str]], case: str, breakage: Breakage, variable: str
) -> None:
    root, secret_file, env = tenant
    breakage(root, secret_file, env)
    with pytest.raises(ConfigError, match=variable):
        ServerConfig.from_env(env)


def test_configuration_is_not_read_from_anywhere_else(
    tenant: tuple[Path, Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """from_env reads only the mapping it is given: the process environment cannot leak in."""
    monkeypatch.setenv("DOCS_SCOPE", "intruder")
    assert ServerConfig.from_env(tenant[2]).tenant == "acme"
    with pytest.raises(ConfigError):
        ServerConfig.from_env({})


# --- python -m server --------------------------------------------------------------------------


# One process per kind of problem (each start costs ~0.4 s); from_env above covers every case.
START_UP_CASES = [
    c
    for c in CASES
    if c[0]
    in {
        "root-unset",
        "root-missing",
        "sources-missing",
        "reports-missing",
        "sources-symlink",
        "scope-unset",
        "scope-uppercase",
        "scope-64-chars",
        "secret-unset",
        "secret-missing",
        "secret-31-chars",
    }
]


@pytest.mark.parametrize(("case", "breakage", "variable"), START_UP_CASES, ids=[c[0] for c in START_UP_CASES])
def test_start_up_fails_fast(
    kit: Any, tenant: tuple[Path, Path, dict[str, str]], case: str, breakage: Breakage, variable: str
) -> None:
    root, secret_file, env = tenant
    breakage(root, secret_file, env)
    secret = secret_file.read_bytes() if secret_file.is_file() else b""
    proc = subprocess.run(
        [sys.executable, "-m", "server"],
        cwd=kit.repo,
        env=env,
        stdin=subprocess.DEVNULL,  # stdio mode: a server that did start would wait on stdin, not hang
        capture_output=True,
        timeout=30,
    )
    stderr = proc.stderr.decode()
    assert proc.returncode != 0
    assert proc.stdout == b""  # stdout is for protocol frames only
    assert "configuration error" in stderr and variable in stderr
    assert "Traceback" not in stderr
    if secret.strip():
        assert secret.strip().decode(errors="replace") not in stderr
