"""`docbroker doctor`: check the host before serving (broker/doctor.py does the checks)."""

from __future__ import annotations

import argparse
import sys

from broker.cli.base import Subparsers, json_flag, load_settings, print_json


def register(sub: Subparsers) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check the host: daemon, rootless, images, keys",
        description="One line per check: OK, WARN or FAIL. Exit 0 when nothing failed, 1 otherwise.",
    )
    json_flag(doctor)
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from broker.doctor import run_doctor

    settings = load_settings()
    if not args.json:
        return run_doctor(settings, out=sys.stdout)
    rows: list[dict[str, str]] = []
    code = run_doctor(settings, out=sys.stdout, rows=rows)
    print_json({"ok": code == 0, "checks": rows})
    return code
