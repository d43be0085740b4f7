"""`docbroker doctor`: check the host before serving — keys, policies, audit, sandbox engine.

Prints one line per check (OK / WARN / FAIL) and exits 1 when anything fails. It reports
facts (daemon mode, whether limits are enforced) and never prints a key or a token.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from typing import Any, TextIO

from broker.settings import RuntimeKind, Settings

OK, WARN, FAIL = "OK", "WARN", "FAIL"


class _Report:
    def __init__(self, out: TextIO, rows: list[dict[str, str]] | None) -> None:
        self._out = out
        self._rows = rows
        self.failed = False

    def line(self, level: str, what: str, detail: str) -> None:
        self.failed |= level == FAIL
        if self._rows is not None:  # `doctor --json`: collected, printed as one document
            self._rows.append({"level": level, "check": what, "detail": detail})
        else:
            self._out.write(f"{level:<5} {what:<22} {detail}\n")

    def check(self, what: str, fn: Callable[[], tuple[str, str]]) -> None:
        try:
            level, detail = fn()
        except Exception as exc:  # a doctor reports every failure instead of stopping at the first
            level, detail = FAIL, f"{type(exc).__name__}: {exc}"
        self.line(level, what, detail)


def run_doctor(settings: Settings, out: TextIO, rows: list[dict[str, str]] | None = None) -> int:
    """Print a line per check as it ends (or, given `rows`, append each there instead)."""
    report = _Report(out, rows)
    report.check("master key", lambda: _master_key(settings))
    report.check("policies", lambda: _policies(settings))
    report.check("data dir", lambda: _data_dir(settings))
    report.check("identity keys", lambda: asyncio.run(_keys(settings)))
    if settings.runtime.kind is RuntimeKind.KUBERNETES:
        from broker.runtime.kubernetes.doctor import cluster_checks

        for what, check in cluster_checks(settings.runtime.kubernetes):
            report.check(what, check)
    else:
        facts: dict[str, Any] = {}
        report.check("sandbox runtime", lambda: asyncio.run(_runtime(settings, facts)))
        if settings.runtime.kind is RuntimeKind.DOCKER:
            report.check("sandbox image", lambda: _image(facts))
    return 1 if report.failed else 0


def _master_key(settings: Settings) -> tuple[str, str]:
    from broker.master_key import load_master_key

    path = settings.master_key_file
    if not path.exists():
        return WARN, "missing: `docbroker serve` or `docbroker tenant add` creates one"
    key = load_master_key(path)  # refuses a link, a FIFO, an open mode: the mode is 0600 or less
    return OK, f"{len(key)} bytes, mode {stat.S_IMODE(path.lstat().st_mode):o}"


def _policies(settings: Settings) -> tuple[str, str]:
    from broker.policy import Policies, PolicyEngine

    policies = Policies.load(settings.policies_dir)
    engine = PolicyEngine.load(settings.policies_dir, policies)  # the set `serve` would put in force
    if not policies.by_tenant:
        return WARN, "no tenants: add one with `docbroker tenant add NAME`"
    return OK, f"{len(policies.by_tenant)} tenant(s), {len(engine.policy_ids)} policies, set {engine.hash}"


def _data_dir(settings: Settings) -> tuple[str, str]:
    path = settings.data_dir
    if not path.exists():
        return WARN, "does not exist yet (created on first use)"
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return FAIL, f"mode {mode:o}: other users could reach tenants' files (chmod 700)"
    if not os.access(path, os.W_OK):
        return FAIL, "not writable by this user"
    return OK, f"mode {mode:o}"


async def _keys(settings: Settings) -> tuple[str, str]:
    from broker.auth import key_source

    source = key_source(settings.auth)
    ready = await source.ready()
    mode = "dev HS256 (not for production)" if settings.auth.dev_mode else "public keys"
    return (OK if ready else FAIL), f"{mode}; {'usable keys loaded' if ready else 'no usable keys'}"


async def _runtime(settings: Settings, described: dict[str, Any]) -> tuple[str, str]:
    if settings.runtime.kind is RuntimeKind.LOCAL:
        return WARN, "local processes: INSECURE, no sandbox (development only)"
    from broker.runtime.docker import DockerBackend
    from broker.runtime.imagetrust import ImageTrust

    backend = await DockerBackend.connect(
        settings.runtime.docker, pool_dir=settings.pool_dir, trust=ImageTrust.from_settings(settings.supply)
    )
    try:
        facts = backend.describe()  # describes the pool; start() is never called, nothing is started
    finally:
        await backend.close()
    described.update(facts)
    limits = facts.get("limits_enforced", {})
    enforced = all(limits.values()) if isinstance(limits, dict) else bool(limits)
    pool = facts.get("pool", {})
    detail = (
        f"docker {facts.get('engine_version', '?')}, {facts['mode']}, image {facts.get('image')}, "
        f"limits {'enforced' if enforced else 'NOT enforced (memory/CPU/pids)'}, "
        f"warm pool {pool.get('size', 0)} ({pool.get('reason', pool.get('state', 'off'))})"
    )
    if facts["mode"] == "rootful":
        return WARN, detail + "; a rootless daemon is preferred"
    return (OK if enforced else WARN), detail


def _image(facts: dict[str, Any]) -> tuple[str, str]:
    """The image's digest, and whether a release key vouches for it: trust off is a WARN, said
    plainly, because nothing then stops a swapped image from serving every tenant."""
    if not facts:
        return FAIL, "not checked: the sandbox runtime check failed (see above)"
    trust = facts.get("image_trust", {})
    detail = f"{facts.get('image')} = {facts.get('image_digest')}"
    if trust.get("state") != "on":
        return WARN, f"{detail}; image trust OFF: {trust.get('reason', 'no release keys')}"
    return OK, f"{detail}; provenance verified ({trust.get('detail', 'release keys')})"
