"""`docbroker audit ...`: verify, prove, verify-proof, key, keygen, query, export.

One `_add_*` function per subcommand, each adding its parser and setting `func`; `register`
adds them all. Heavy imports stay inside the command functions (start-up time of the CLI).
The commands' drivers (audit_evidence.py, audit_scan.py) keep their documented exit codes: 0
intact or found, 1 broken, 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from broker.cli.base import CliError, Subparsers, load_settings

AuditCommands = Subparsers


def register(sub: Subparsers) -> None:
    audit = sub.add_parser("audit", help="audit log tools").add_subparsers(
        dest="audit_command", required=True, metavar="COMMAND"
    )
    for add_audit_command in AUDIT_COMMANDS:
        add_audit_command(audit)


def cmd_audit_verify(args: argparse.Namespace) -> int:
    from broker.cli.audit_evidence import main_verify

    return main_verify(args.files, args.key, args.witness, args.replica, args.json)


def _add_audit_verify(audit: AuditCommands) -> None:
    verify = audit.add_parser(
        "verify",
        help="check audit logs: chain, signed checkpoints, witness copies; exit 0 intact, 1 broken, 2 usage",
    )
    verify.add_argument(
        "files", nargs="+", metavar="FILE", help="log files: rotated sets, several replicas, any order"
    )
    verify.add_argument(
        "--key", action="append", default=[], help="a replica's public key: PEM file, or hex (repeat)"
    )
    verify.add_argument(
        "--witness", action="append", default=[], help="a witness file of checkpoints (repeat)"
    )
    verify.add_argument("--replica", help="every checkpoint must be this replica's")
    verify.add_argument("--json", action="store_true", help="one JSON document instead of a line per file")
    verify.set_defaults(func=cmd_audit_verify)


def cmd_audit_prove(args: argparse.Namespace) -> int:
    from broker.cli.audit_evidence import main_prove

    return main_prove(args.files, args.seq, args.checkpoint, args.old, args.new)


def _add_audit_prove(audit: AuditCommands) -> None:
    prove = audit.add_parser(
        "prove", help="print an RFC 6962 proof (JSON): one event is in the log, or the log only grew"
    )
    prove.add_argument("files", nargs="+", metavar="FILE", help="one replica's log files, any order")
    which = prove.add_mutually_exclusive_group(required=True)
    which.add_argument("--seq", type=int, help="inclusion: the event with this seq")
    which.add_argument("--from", dest="old", type=int, metavar="N", help="consistency: from checkpoint N")
    prove.add_argument(
        "--checkpoint", type=int, metavar="N", help="inclusion under checkpoint N (default: the last)"
    )
    prove.add_argument(
        "--to", dest="new", type=int, metavar="M", help="consistency: to checkpoint M (default: the last)"
    )
    prove.set_defaults(func=cmd_audit_prove)


def cmd_audit_verify_proof(args: argparse.Namespace) -> int:
    from broker.cli.audit_evidence import main_verify_proof

    return main_verify_proof(args.proof, args.key)


def _add_audit_verify_proof(audit: AuditCommands) -> None:
    check = audit.add_parser(
        "verify-proof", help="check a proof from `audit prove`; exit 0 valid, 1 not, 2 usage"
    )
    check.add_argument("proof", help="the proof's JSON file, or - for stdin")
    check.add_argument(
        "--key", action="append", required=True, help="the replica's public key: PEM file, or hex"
    )
    check.set_defaults(func=cmd_audit_verify_proof)


def _key_file() -> Path:
    key_file = load_settings().audit.key_file
    assert key_file is not None  # from_env always names one
    return key_file


def _print_public(key_file: Path, fmt: str) -> int:
    """The key's public half, for `verify --key`: PEM, or its id and the raw key in hex."""
    from broker.audit.checkpoint import KeyFileError, load_signing_key, public_hex, public_pem

    try:
        signer = load_signing_key(key_file)
    except KeyFileError as exc:
        raise CliError(str(exc)) from None
    public = signer.private.public_key()
    if fmt == "pem":
        sys.stdout.write(public_pem(public))
    else:
        sys.stdout.write(f"{signer.key_id}\n{public_hex(public)}\n")
    return 0


def cmd_audit_key(args: argparse.Namespace) -> int:
    """Reads the key, never makes one: a backup or a rotation that ran it against a wrong path
    would hand the auditors a public key that signs nothing (issue 38)."""
    key_file = _key_file()
    if not key_file.exists() and not key_file.is_symlink():
        raise CliError(
            "no audit signing key at DOCBROKER_AUDIT_KEY_FILE: the broker makes one at its first start, "
            "or `docbroker audit keygen`"
        )
    return _print_public(key_file, args.format)


def cmd_audit_keygen(args: argparse.Namespace) -> int:
    """A new key, before the first start (to hand its public half over first); never over one."""
    from broker.audit.checkpoint import create_signing_key

    key_file = _key_file()
    if not create_signing_key(key_file):
        raise CliError(
            "an audit signing key is already at DOCBROKER_AUDIT_KEY_FILE: keygen never replaces one"
        )
    return _print_public(key_file, args.format)


def _format_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format", choices=["pem", "hex"], default="pem", help="hex: key id, then the raw key"
    )


def _add_audit_key(audit: AuditCommands) -> None:
    key = audit.add_parser(
        "key", help="print this replica's public audit key (for `verify --key`); exit 1 when there is none"
    )
    _format_flag(key)
    key.set_defaults(func=cmd_audit_key)
    keygen = audit.add_parser(
        "keygen", help="make this replica's audit signing key (never over one) and print its public key"
    )
    _format_flag(keygen)
    keygen.set_defaults(func=cmd_audit_keygen)


# `audit query` and `audit export`: the same filters over the same streaming scan (broker/cli/audit_scan.py).


def _add_audit_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="audit log files, any order")
    more = "repeat for several"
    parser.add_argument("--tenant", action="append", default=[], help=f"tenant name ({more})")
    parser.add_argument("--subject", action="append", default=[], help=f"subject, the token's sub ({more})")
    parser.add_argument("--event", action="append", default=[], help=f"event, e.g. policy.denied ({more})")
    parser.add_argument("--outcome", action="append", default=[], help=f"outcome, e.g. denied ({more})")
    parser.add_argument("--reason", action="append", default=[], help=f"reason code ({more})")
    parser.add_argument("--since", help="from: RFC 3339, a date (UTC), or an age: 15m, 12h, 7d")
    parser.add_argument("--until", help="before this time (same forms as --since)")
    parser.add_argument("--evidence", action="store_true", help="include the log's own audit.* lines")
    parser.add_argument("-f", "--follow", action="store_true", help="keep reading the newest file")


def cmd_audit_query(args: argparse.Namespace) -> int:
    from broker.cli.audit_scan import main_query

    return main_query(args)


def _add_audit_query(audit: AuditCommands) -> None:
    query = audit.add_parser("query", help="filter audit events; print a table or JSON lines (--json)")
    _add_audit_filters(query)
    query.add_argument("--json", action="store_true", help="print the matching lines as they are")
    query.set_defaults(func=cmd_audit_query)


def cmd_audit_export(args: argparse.Namespace) -> int:
    from broker.cli.audit_scan import main_export

    return main_export(args)


def _add_audit_export(audit: AuditCommands) -> None:
    export = audit.add_parser("export", help="export audit events for a SIEM (OCSF API Activity, JSON lines)")
    _add_audit_filters(export)
    export.add_argument("--format", choices=["ocsf"], required=True, help="OCSF 1.5.0 API Activity (6003)")
    export.set_defaults(func=cmd_audit_export)


AUDIT_COMMANDS: list[Callable[[AuditCommands], None]] = [
    _add_audit_verify,
    _add_audit_prove,
    _add_audit_verify_proof,
    _add_audit_key,
    _add_audit_query,
    _add_audit_export,
]
