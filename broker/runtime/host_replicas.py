"""What replicas on one host share about sandboxes, through a folder of the shared data dir.

    <data_dir>/run/.replicas/<replica>.lock   held (flock) by each live replica for its lifetime
    <data_dir>/run/.replicas/<tenant>.use     its mtime: the tenant's sandbox's last use, any replica
    <data_dir>/run/.replicas/<tenant>.create  held while a replica finds or starts the tenant's sandbox

Each lock file also holds the incarnation of the process holding it (random per start), so a
peer can tell a replica restarted under the same id from the one it was before; and the folder
has an id of its own (`folder.id`), so a process is named across hosts and data dirs by
`<folder>/<replica>/<incarnation>` (`owner`), and only one of this folder is judged dead here.

Liveness is a lock, not a heartbeat: the kernel drops a process's locks the moment it dies
(SIGKILL included), so "is replica R alive?" has an exact answer with no clock and no timeout
to tune. Last use is a file's mtime, touched by each replica at most once every `every`
seconds (one `utime` on the hot path now and then, never a database). The folder is the
broker's own (0o700) and is never mounted into a sandbox: a sandbox cannot keep itself alive
or fake another replica.

`SharedUse` is what the lifecycle asks about last use; `FolderUse` is the folder's. Replicas on
several hosts share no folder: the Kubernetes runtime keeps last use on the tenant's Pod itself
(`broker/runtime/kubernetes/lastuse.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from pathlib import Path

_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class ReplicaTaken(Exception):
    """Another live broker already runs with this replica id on this data dir."""


class Replicas:
    """This replica's presence on the host, and which of its peers are alive."""

    def __init__(self, folder: Path | None, replica_id: str) -> None:
        """`folder` None: a replica alone (no peers, nothing shared), as a bare runtime in tests."""
        self.folder = folder
        self.me = replica_id
        self.incarnation = secrets.token_hex(8)
        self._fd: int | None = None
        self._id: str | None = None

    def _path(self, name: str, suffix: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{name}{suffix}"

    async def join(self, wait: float = 3.0) -> None:
        """Hold this replica's lock for the process's lifetime. A peer's liveness probe holds
        it for an instant, hence the short retry; a live broker with the same id: ReplicaTaken."""
        if self.folder is None or self._fd is not None:
            return
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self._path(self.me, ".lock"), _OPEN_FLAGS, 0o600)
        if not await _lock_within(fd, wait, every=0.05):
            os.close(fd)
            raise ReplicaTaken("another broker with this DOCBROKER_REPLICA_ID runs on this data dir")
        os.ftruncate(fd, 0)
        os.pwrite(fd, self.incarnation.encode("ascii"), 0)
        self._fd = fd

    def leave(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None

    def alive(self, replica: str) -> bool:
        """Is `replica` a broker running now on this data dir? (This one always is.)"""
        if replica == self.me:
            return True
        if self.folder is None or not replica or "/" in replica:
            return False
        try:
            fd = os.open(self._path(replica, ".lock"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False  # never started here
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # also releases the probe's lock, if it got it
        return False

    @property
    def owner(self) -> str:
        """This process, named across hosts: `<folder id>/<replica>/<incarnation>`."""
        return f"{self._folder_id()}/{self.me}/{self.incarnation}"

    def owner_dead(self, owner: str) -> bool | None:
        """Has the process `owner` names stopped? None: not a process of this folder."""
        folder_id, _, rest = owner.partition("/")
        replica, _, incarnation = rest.partition("/")
        if self.folder is None or not folder_id or folder_id != self._folder_id():
            return None
        if replica == self.me:
            return incarnation != self.incarnation
        if not replica or "/" in replica:
            return None
        try:
            fd = os.open(self._path(replica, ".lock"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held; its holder writes its incarnation right after locking
                held_by = os.pread(fd, 64, 0).decode("ascii", "replace")
                return held_by != "" and held_by != incarnation
            return True  # nobody holds it: every incarnation of that replica has stopped
        finally:
            os.close(fd)

    def _folder_id(self) -> str:
        """The folder's own id, made by whichever replica first needs it ("" without a folder)."""
        if self.folder is None:
            return ""
        if self._id is None:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            path = self.folder / "folder.id"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                self._id = self._read_id(path)
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(8))
                self._id = self._read_id(path)
        return self._id

    @staticmethod
    def _read_id(path: Path) -> str:
        for _ in range(100):  # another replica created it an instant ago and is writing it
            text = path.read_text().strip()
            if text:
                return text
            time.sleep(0.01)
        return ""

    def peers_alive(self) -> bool:
        """Does any other replica run on this data dir now?"""
        if self.folder is None:
            return False
        try:
            names = os.listdir(self.folder)
        except OSError:
            return False
        peers = (n.removesuffix(".lock") for n in names if n.endswith(".lock"))
        return any(peer != self.me and self.alive(peer) for peer in peers)

    @contextlib.asynccontextmanager
    async def creating(self, tenant: str, timeout: float) -> AsyncIterator[None]:
        """Held while this replica finds or starts `tenant`'s sandbox: of replicas racing to
        create one, the others wait and then find the winner's (engines without names that
        conflict need it: the local runtime). Polled, so a cancelled caller never leaves a
        thread blocked in flock."""
        if self.folder is None:
            yield
            return
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self._path(tenant, ".create"), _OPEN_FLAGS, 0o600)
        try:
            if not await _lock_within(fd, timeout, every=0.01):
                raise TimeoutError("another replica holds the tenant's sandbox start")
            yield
        finally:
            os.close(fd)


async def _lock_within(fd: int, seconds: float, *, every: float) -> bool:
    """An exclusive flock on `fd`, tried every `every` s for `seconds`; False: still held.
    Polled, never a blocking flock: a cancelled caller leaves no thread behind."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(every)


class SharedUse(ABC):
    """When a tenant's sandbox was last used by any replica: each replica records its uses
    (`touch`, on the hot path: cheap, at most once every `every` seconds unless forced), and a
    reaper asks (`idle_for`) right before it stops a sandbox."""

    def __init__(self, every: float) -> None:
        self.every = every  # how stale this replica's own record may be: the reaper's margin

    @abstractmethod
    def touch(self, tenant: str, *, force: bool = False) -> None:
        """The tenant's sandbox is in use here now. Never blocks."""

    @abstractmethod
    async def idle_for(self, tenant: str) -> float | None:
        """Seconds since any replica last recorded a use; None if nothing is recorded."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Finish recording what `touch` has queued (before the engine's client closes)."""


class FolderUse(SharedUse):
    """Last use on one host: `<tenant>.use`'s mtime in the replicas' folder."""

    def __init__(self, replicas: Replicas, every: float) -> None:
        super().__init__(every)
        self._replicas = replicas
        self._touched: dict[str, float] = {}

    def touch(self, tenant: str, *, force: bool = False) -> None:
        folder = self._replicas.folder
        if folder is None:
            return
        now = time.monotonic()
        last = self._touched.get(tenant)
        if not force and last is not None and now - last < self.every:
            return
        self._touched[tenant] = now
        path = folder / f"{tenant}.use"
        try:
            os.utime(path)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                os.close(os.open(path, _OPEN_FLAGS, 0o600))
        except OSError:
            pass  # the folder is gone or full: the reaper then sees an older use, never a newer

    async def idle_for(self, tenant: str) -> float | None:
        """Seconds since any replica last touched the tenant's use; None if none ever did."""
        folder = self._replicas.folder
        if folder is None:
            return None
        try:
            mtime = os.stat(folder / f"{tenant}.use").st_mtime
        except OSError:
            return None
        return max(0.0, time.time() - mtime)
