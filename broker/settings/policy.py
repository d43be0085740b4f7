"""How the policy files in force are kept current (broker/policy/, docs/policy.md)."""

from __future__ import annotations

from dataclasses import dataclass

from broker.settings.reader import Reader


@dataclass(frozen=True)
class PolicySettings:
    reload_seconds: float = 2.0  # how often the policy files are checked for a change; 0: SIGHUP only


def policy_settings(r: Reader) -> PolicySettings:
    return PolicySettings(
        reload_seconds=r.number(
            "POLICY_RELOAD",
            2.0,
            low=0,
            high=3600,
            doc=(
                "seconds between checks of the policy files for a change (a changed set that loads "
                "replaces the one in force; one that does not is logged, counted and shown stale on "
                "`/readyz`); `0`: only on SIGHUP ([docs/policy.md](docs/policy.md))"
            ),
        )
    )
