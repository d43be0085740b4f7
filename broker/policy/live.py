"""The policy set in force, replaced when its files change or on SIGHUP (DESIGN §14).

Every replica watches its own policies folder: the files' names, sizes, inodes and mtimes
every `reload_seconds` (0: only on SIGHUP). A changed folder is loaded in full — schema,
*.cedar, default.toml and tenants/ compiled — off the event loop, and only a set that loads
and validates replaces the one in force, in one assignment: a request is decided wholly by
the set it met, and none waits for a reload. A set that does not load leaves the good one in
force and the state `stale` (logged in one line, counted, shown on /readyz) until the files
load again.

What reloads: every decision (the Cedar policies and the TOML tool lists). What does not: the
TOML limits, the approvals settings and which tenants exist, read at start-up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from broker.policy.cedar import SCHEMA_FILE, Call, Decision, PolicyEngine
from broker.policy.tenants import Policies, PolicyError

log = logging.getLogger("docbroker.policy")

Fingerprint = tuple[tuple[str, int, int, int], ...]


def fingerprint(folder: Path) -> Fingerprint:
    """What identifies the folder's policy files as they are now (a missing file included)."""
    paths = [folder / SCHEMA_FILE, folder / "default.toml", *folder.glob("*.cedar")]
    paths += list((folder / "tenants").glob("*.toml"))
    seen: list[tuple[str, int, int, int]] = []
    for path in sorted(paths):
        try:
            st = path.stat()
        except OSError:
            seen.append((str(path), -1, -1, -1))
            continue
        seen.append((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(seen)


class LivePolicy:
    """Decides with the set in force; `watch` keeps it current."""

    def __init__(
        self,
        folder: Path,
        engine: PolicyEngine,
        *,
        on_reload: Callable[[str], None] = lambda result: None,
    ) -> None:
        self._folder = folder
        self.current = engine
        self.stale = False  # the files on disk do not load: the set in force is an older one
        self._seen = fingerprint(folder)
        self._on_reload = on_reload  # counts "ok" / "failed"
        self._wake = asyncio.Event()

    @property
    def hash(self) -> str:
        return self.current.hash

    def decide(self, call: Call, *, check_request: bool = False) -> Decision:
        return self.current.decide(call, check_request=check_request)

    def _load(self) -> PolicyEngine:
        return PolicyEngine.load(self._folder, Policies.load(self._folder))

    async def reload(self) -> bool:
        """Load the folder now; True when a new set is in force."""
        seen = fingerprint(self._folder)
        try:
            engine = await asyncio.to_thread(self._load)
        except PolicyError as exc:
            self._seen, self.stale = seen, True
            self._on_reload("failed")
            # The error names a file and a policy id, never a request value.
            log.error("policy set not replaced: %s", exc, extra={"policy_set": self.current.hash})
            return False
        self._seen, self.stale = seen, False
        self._on_reload("ok")
        if engine.hash != self.current.hash:
            self.current = engine
            log.info(
                "policy set replaced", extra={"policy_set": engine.hash, "policies": len(engine.policy_ids)}
            )
            return True
        return False

    def reload_soon(self) -> None:
        """SIGHUP: reload at once, whatever the files look like."""
        self._seen = ()
        self._wake.set()

    async def watch(self, interval: float) -> None:
        """Reload whenever the files change (polled every `interval` s; 0: only when woken)."""
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), interval if interval > 0 else None)
            except TimeoutError:
                pass
            self._wake.clear()
            if fingerprint(self._folder) != self._seen:
                await self.reload()
