"""`docbroker audit verify`, `prove` and `verify-proof`: the verdicts and proofs printed, the
reasons on stderr, the documented exit codes (0 intact or valid, 1 broken, 2 usage).

The checking and proving are broker/audit/evidence.py and broker/audit/proofs.py; they return
reports and proofs, this module says them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from broker.audit.checkpoint import KeyFileError, Keyring, load_public_key
from broker.audit.evidence import cannot_read, verify_logs
from broker.audit.proofs import ProofError, prove_consistency, prove_inclusion, read_proof, verify_proof
from broker.files import UnsafeFileError, printable

EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2


def load_keys(key_specs: list[str], command: str) -> Keyring | None:
    """The public keys given on a command line; None (the reason said on stderr) if one is bad."""
    try:
        return Keyring([load_public_key(spec) for spec in key_specs])
    except KeyFileError as exc:
        sys.stderr.write(f"docbroker audit {command}: {exc}\n")
        return None


def main_verify(
    files: list[str], key_specs: list[str], witness_files: list[str], replica: str | None, as_json: bool
) -> int:
    """`docbroker audit verify`: one verdict line per file (or one JSON document); exit 0/1/2."""
    keys = load_keys(key_specs, "verify")
    if keys is None:
        return EXIT_USAGE
    try:
        report = verify_logs([Path(f) for f in files], keys, [Path(w) for w in witness_files], replica)
    except (OSError, UnsafeFileError) as exc:
        sys.stderr.write(f"docbroker audit verify: a witness file: {cannot_read(exc)}\n")
        return EXIT_USAGE
    if as_json:
        document = {
            "ok": report.ok,
            "signatures_checked": bool(keys),
            "files": [asdict(f) for f in report.files],
            "witnesses": [asdict(w) for w in report.witnesses],
        }
        sys.stdout.write(json.dumps(document, sort_keys=True) + "\n")
    else:
        for verdict in report.files:
            line = verdict.summary()
            if not verdict.ok and verdict.problem and verdict.problem.startswith("cannot read"):
                line = f"audit log: {verdict.problem} ({printable(verdict.path)})"
            sys.stdout.write(line + "\n")
        for witness in report.witnesses:
            sys.stdout.write(witness.summary() + "\n")
        if not keys:
            sys.stdout.write("signatures NOT checked: give the replicas' public keys with --key\n")
    return EXIT_OK if report.ok else EXIT_BROKEN


def main_prove(
    files: list[str], seq: int | None, checkpoint: int | None, old: int | None, new: int | None
) -> int:
    paths = [Path(f) for f in files]
    try:
        if seq is not None:
            proof = prove_inclusion(paths, seq, checkpoint)
        elif old is not None:
            proof = prove_consistency(paths, old, new)
        else:
            sys.stderr.write("docbroker audit prove: give --seq N (inclusion) or --from N (consistency)\n")
            return EXIT_USAGE
    except ProofError as exc:
        sys.stderr.write(f"docbroker audit prove: {exc}\n")
        return EXIT_BROKEN
    except UnsafeFileError as exc:
        sys.stderr.write(f"docbroker audit prove: cannot read a log file: {exc}\n")
        return EXIT_BROKEN
    except OSError as exc:
        sys.stderr.write(f"docbroker audit prove: cannot read a log file: {exc.strerror or 'error'}\n")
        return EXIT_BROKEN
    sys.stdout.write(json.dumps(proof, sort_keys=True) + "\n")
    return EXIT_OK


def main_verify_proof(proof_file: str, key_specs: list[str]) -> int:
    keys = load_keys(key_specs, "verify-proof")
    if keys is None:
        return EXIT_USAGE
    try:
        proof = read_proof(proof_file, sys.stdin.buffer)
    except ProofError as exc:
        sys.stderr.write(f"docbroker audit verify-proof: cannot read the proof: {exc}\n")
        return EXIT_USAGE
    ok, verdict = verify_proof(proof, keys)
    sys.stdout.write(f"proof {'OK' if ok else 'BROKEN'}: {verdict}\n")
    return EXIT_OK if ok else EXIT_BROKEN
