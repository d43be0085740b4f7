"""`docbroker policy validate|test|explain`: the Cedar policy set (docs/policy.md).

The commands' logic lives with the policy (broker/policy/tool.py), which `serve` loads the same
way; this module only registers them.
"""

from __future__ import annotations

from broker.cli.base import Subparsers


def register(sub: Subparsers) -> None:
    from broker.policy.tool import add_policy_commands

    add_policy_commands(sub)
