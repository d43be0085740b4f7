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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from server.config import ConfigError, secret_from_fd
from server.listen import parse_host_port, tcp_listener, why

QUARANTINE = ".quarantine"  # on the PVC, beside the reports: no report name starts with a dot


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

    files = ReportFiles(config.dropbox, config.reports, config.reports / QUARANTINE)
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
