"""Typed reads of `DOCBROKER_*` variables, each with what it means.

Every read names its variable and says what the setting means (`doc`): the reference in
docs/operations.md is made from those reads (`docbroker reference`), so a setting's meaning
lives beside the field it fills. Errors name the variable, never its value.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PREFIX = "DOCBROKER_"
MIB = 1024 * 1024

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# A DNS label's characters, up to 32: a deployment's instance, a namespace, a RuntimeClass.
INSTANCE_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?")
_TENANT_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class SettingsError(ValueError):
    """A `DOCBROKER_*` variable is missing or invalid. The message names it, never its value."""


@dataclass(frozen=True)
class SettingRead:
    """One variable as the settings read it: its type, default, bounds and meaning (the reference)."""

    name: str
    kind: str
    default: object = None
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    doc: str = ""


class Reader:
    """Typed access to `DOCBROKER_*` variables; every error names the variable only.

    `reads`, when given, receives each variable read once, with its type, default and meaning."""

    def __init__(self, env: Mapping[str, str], reads: list[SettingRead] | None = None) -> None:
        self._env = env
        self._reads = reads

    def _note(self, read: SettingRead) -> None:
        if self._reads is not None and all(r.name != read.name for r in self._reads):
            self._reads.append(read)

    def _raw(self, name: str) -> str | None:
        value = self._env.get(PREFIX + name, "").strip()
        return value or None

    def optional(self, name: str, *, doc: str) -> str | None:
        self._note(SettingRead(PREFIX + name, "text", doc=doc))
        return self._raw(name)

    def libpq(self) -> dict[str, str]:
        """The libpq variables that decide where and how a PostgreSQL connection goes."""
        names = ("PGHOST", "PGHOSTADDR", "PGSSLMODE", "PGSERVICE")
        return {name: self._env[name] for name in names if self._env.get(name, "").strip()}

    def text(self, name: str, default: str, *, doc: str) -> str:
        self._note(SettingRead(PREFIX + name, "text", default, doc=doc))
        return self._raw(name) or default

    def required(self, name: str, *, doc: str) -> str:
        self._note(SettingRead(PREFIX + name, "text (required)", doc=doc))
        value = self._raw(name)
        if value is None:
            raise SettingsError(f"{PREFIX}{name} is required")
        return value

    def path(self, name: str, *, doc: str) -> Path | None:
        self._note(SettingRead(PREFIX + name, "path", doc=doc))
        value = self._raw(name)
        return Path(value).absolute() if value else None

    def folder(self, name: str, default: Path | str, *, doc: str) -> Path:
        """A path with a default (often in the data dir), made absolute."""
        return Path(self.text(name, str(default), doc=doc)).absolute()

    def paths(self, name: str, *, doc: str) -> tuple[Path, ...]:
        """A comma-separated list of paths; empty when unset. Set to nothing (or commas only),
        it is refused: a list someone set and left empty (`KEYS=` from an unset shell variable)
        must not read as "none wanted" when it turns a check off."""
        self._note(SettingRead(PREFIX + name, "list of paths", doc=doc))
        if PREFIX + name not in self._env:
            return ()
        items = [x.strip() for x in self._env[PREFIX + name].split(",")]
        if not any(items):
            raise SettingsError(f"{PREFIX}{name} is set but names no file: name one, or unset it")
        return tuple(Path(item).absolute() for item in items if item)

    def integer(self, name: str, default: int, *, low: int, high: int, doc: str) -> int:
        self._note(SettingRead(PREFIX + name, "integer", default, low, high, doc=doc))
        raw = self._raw(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError(f"{PREFIX}{name} must be an integer") from None
        if not low <= value <= high:
            raise SettingsError(f"{PREFIX}{name} must be between {low} and {high}")
        return value

    def number(self, name: str, default: float, *, low: float, high: float, doc: str) -> float:
        self._note(SettingRead(PREFIX + name, "number", default, low, high, doc=doc))
        raw = self._raw(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{PREFIX}{name} must be a number") from None
        if not low <= value <= high:
            raise SettingsError(f"{PREFIX}{name} must be between {low} and {high}")
        return value

    def flag(self, name: str, default: bool, *, doc: str) -> bool:
        self._note(SettingRead(PREFIX + name, "flag", default, doc=doc))
        raw = self._raw(name)
        if raw is None:
            return default
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{PREFIX}{name} must be true or false")

    def choice(self, name: str, default: str, choices: tuple[str, ...], *, doc: str) -> str:
        self._note(SettingRead(PREFIX + name, "choice", default, choices=choices, doc=doc))
        value = self._raw(name) or default
        if value not in choices:
            raise SettingsError(f"{PREFIX}{name} must be one of {', '.join(choices)}")
        return value

    def listed(
        self, name: str, default: tuple[str, ...], allowed: tuple[str, ...], *, what: str, doc: str
    ) -> tuple[str, ...]:
        """A comma-separated list of `what`, drawn from `allowed`; `default` when unset."""
        self._note(SettingRead(PREFIX + name, f"list of {what}", ",".join(default), doc=doc))
        raw = self._raw(name)
        if raw is None:
            return default
        items = tuple(a.strip() for a in raw.split(",") if a.strip())
        if not items or any(a not in allowed for a in items):
            raise SettingsError(f"{PREFIX}{name} may list only {', '.join(allowed)}")
        return items

    def origins(self, name: str, default: str, *, doc: str) -> tuple[str, ...]:
        """`default` and a comma-separated list of origins (`scheme://host[:port]`), normalised."""
        self._note(SettingRead(PREFIX + name, "list of origins", default, doc=doc))
        raw = self._raw(name)
        origins = [default]  # the broker's own page is served from there: always allowed
        if raw is None:
            return (default,)
        for item in (x.strip() for x in raw.split(",")):
            origin = origin_of(item) if item else None
            # An origin has no path, query or fragment: one that does is a URL pasted by mistake.
            url_only = urllib.parse.urlsplit(item).path not in ("", "/") or "?" in item or "#" in item
            if origin is None or url_only:
                raise SettingsError(f"{PREFIX}{name} must list origins (https://host[:port]), by commas")
            origins.append(origin)
        return tuple(dict.fromkeys(origins))

    def networks(self, name: str, *, doc: str) -> tuple[IPNetwork, ...]:
        """A comma-separated list of IP addresses and networks (`10.0.0.0/8`, `2001:db8::/32`)."""
        self._note(SettingRead(PREFIX + name, "list of networks", "", doc=doc))
        raw = self._raw(name)
        if raw is None:
            return ()
        found: list[IPNetwork] = []
        for item in (x.strip() for x in raw.split(",")):
            try:
                network = ipaddress.ip_network(item)  # strict: host bits set is a typo, not a range
            except ValueError:
                raise SettingsError(f"{PREFIX}{name} must list IP addresses or networks, by commas") from None
            if network.prefixlen == 0:
                # Everyone a proxy: every client could name any address, and have a fresh budget each.
                raise SettingsError(f"{PREFIX}{name} must not trust every address")
            found.append(network)
        return tuple(dict.fromkeys(found))

    def tenant_map(self, name: str, *, doc: str) -> tuple[tuple[str, str], ...]:
        """`claim-value=tenant` pairs, by commas (a value may hold `=`: the tenant is after the last)."""
        raw = self.optional(name, doc=doc)
        if raw is None:
            return ()
        pairs = []
        for item in (x.strip() for x in raw.split(",")):
            value, _, tenant = item.rpartition("=")
            if not value or not _TENANT_LABEL.fullmatch(tenant):
                raise SettingsError(f"{PREFIX}{name} must list claim-value=tenant pairs, by commas")
            pairs.append((value, tenant))
        return tuple(pairs)


def origin_of(url: str) -> str | None:
    """The origin of an http(s) URL as a browser serialises it in `Origin` (RFC 6454): the
    scheme and host in lower case, the port only when it is not the scheme's default."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "")
    if scheme not in ("http", "https") or not host or "@" in parts.netloc:
        return None
    if ":" in host:
        host = f"[{host}]"
    default = 80 if scheme == "http" else 443
    return f"{scheme}://{host}" if port in (None, default) else f"{scheme}://{host}:{port}"


def loopback(url: str) -> bool:
    """A broker on this machine only (dev, tests): browsers treat it as a secure context."""
    return urllib.parse.urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")
