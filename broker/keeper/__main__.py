"""`python -m broker.keeper --http HOST:PORT`: serve one tenant's reports keeper.

Configuration from the environment the Pod spec sets (never from a request): KEEPER_DROPBOX,
KEEPER_REPORTS, KEEPER_KEY_FILE. Every problem is one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from broker.types import DROPBOX_MODE
from server.config import ConfigError, secret_from_fd
from server.listen import parse_host_port, tcp_listener, why

# Beside the drop-box, in the same volume: a quarantine is a rename, and a rename cannot cross
# filesystems (into the reports PVC it would fail with EXDEV). The server mounts only the
# drop-box folder itself (a subPath), so it cannot reach this one.
QUARANTINE = "quarantine"
# The container's postStart hook makes the drop-box while this process starts: wait for it.
DROPBOX_WAIT_SECONDS = 10.0


def wait_for_dropbox(env: Mapping[str, str] = os.environ) -> None:
    """Until KEEPER_DROPBOX exists with its mode (or the wait ends: from_env then says what is
    wrong). The kubelet starts the server only once the hook is done, so the wait is short."""
    path = env.get("KEEPER_DROPBOX", "").strip()
    deadline = time.monotonic() + DROPBOX_WAIT_SECONDS
    seen: float | None = None  # when it first existed: the hook's chmod follows its mkdir
    said = False
    while path and time.monotonic() < deadline:
        try:
            if stat.S_IMODE(os.lstat(path).st_mode) == DROPBOX_MODE:
                return
            seen = seen or time.monotonic()
            if time.monotonic() - seen > 0.5:
                return
        except OSError:
            pass
        if not said:  # once: the Pod's log (and a test) can tell a wait from a hang
            sys.stderr.write("docbroker keeper: waiting for KEEPER_DROPBOX (made by the start hook)\n")
            sys.stderr.flush()
            said = True
        time.sleep(0.01)


@dataclass(frozen=True)
class KeeperConfig:
    dropbox: Path
    reports: Path
    key: str

    def __repr__(self) -> str:
        return f"KeeperConfig(dropbox={str(self.dropbox)!r}, reports={str(self.reports)!r}, key=<hidden>)"

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> KeeperConfig:
        folders = {}
        for name in ("KEEPER_DROPBOX", "KEEPER_REPORTS"):
            value = env.get(name, "").strip()
            if not value:
                raise ConfigError(f"{name} is not set")
            try:
                is_dir = stat.S_ISDIR(os.lstat(value).st_mode)
            except OSError:
                is_dir = False
            if not is_dir:
                raise ConfigError(f"{name} must be a folder (not a symlink)")
            folders[name] = Path(value)
        dropbox = folders["KEEPER_DROPBOX"]
        made = os.stat(dropbox)
        if made.st_dev != os.stat(dropbox.parent).st_dev:
            raise ConfigError(
                "KEEPER_DROPBOX must be a folder inside the drop-box volume, not its mount point "
                "(the quarantine goes beside it, on the same filesystem)"
            )
        if made.st_uid != os.geteuid() or stat.S_IMODE(made.st_mode) != DROPBOX_MODE:
            raise ConfigError(
                "KEEPER_DROPBOX must be the keeper's own folder with mode 1733 (the server may "
                "create files there, never list it or remove what is not its own)"
            )
        key_file = env.get("KEEPER_KEY_FILE", "").strip()
        if not key_file:
            raise ConfigError("KEEPER_KEY_FILE is not set")
        try:
            fd = os.open(key_file, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise ConfigError(f"KEEPER_KEY_FILE cannot be opened ({exc.strerror})") from None
        try:
            key = secret_from_fd(fd, "KEEPER_KEY_FILE")
        finally:
            os.close(fd)
        return cls(dropbox=folders["KEEPER_DROPBOX"], reports=folders["KEEPER_REPORTS"], key=key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.keeper", description="docbroker reports keeper")
    parser.add_argument("--http", metavar="HOST:PORT", required=True, help="serve on TCP")
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    listen = parse_host_port(args.http)
    if listen is None:
        sys.stderr.write("docbroker keeper: --http takes HOST:PORT\n")
        return 2
    wait_for_dropbox()
    try:
        config = KeeperConfig.from_env()
    except ConfigError as exc:
        sys.stderr.write(f"docbroker keeper: configuration error: {exc}\n")
        return 2
    try:
        sock = tcp_listener(*listen)
    except OSError as exc:
        sys.stderr.write(f"docbroker keeper: cannot listen on {args.http}: {why(exc)}\n")
        return 1

    import uvicorn

    from broker.approvals.reports import ReportFiles
    from broker.keeper.app import keeper_app

    files = ReportFiles(config.dropbox, config.reports, config.dropbox.parent / QUARANTINE)
    app = keeper_app(files, key=config.key)
    serving = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,  # paths only, but nothing a reader needs: the broker audits
            lifespan="off",
            server_header=False,
            date_header=False,
        )
    )
    serving.run(sockets=[sock])
    if not serving.started:
        sys.stderr.write("docbroker keeper: the HTTP server did not start\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
