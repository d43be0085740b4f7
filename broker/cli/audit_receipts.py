"""`docbroker audit receipt` and `verify-receipt`: the command lines over broker/audit/receipts.py
(making one, plain values) and receipt_check.py (checking one); exit 0 / 1 / 2 as `verify-proof`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from broker.audit.proofs import ProofError, read_proof
from broker.audit.receipt_check import check_receipt
from broker.audit.receipts import ApprovalFacts, make_receipt
from broker.cli.audit_evidence import EXIT_BROKEN, EXIT_OK, EXIT_USAGE, load_keys
from broker.files import UnsafeFileError, open_regular_stream, printable


def main_receipt(facts: ApprovalFacts | None, files: list[str], output: str | None) -> int:
    """`docbroker audit receipt`: the receipt as one JSON document (stdout, or `output`)."""
    if facts is None:
        sys.stderr.write("docbroker audit receipt: no such approval for that tenant\n")
        return EXIT_BROKEN
    try:
        receipt = make_receipt(facts, [Path(f) for f in files])
    except ProofError as exc:
        sys.stderr.write(f"docbroker audit receipt: {exc}\n")
        return EXIT_BROKEN
    except (UnsafeFileError, OSError) as exc:
        reason = exc.reason if isinstance(exc, UnsafeFileError) else (exc.strerror or "error")
        sys.stderr.write(f"docbroker audit receipt: cannot read a log file: {reason}\n")
        return EXIT_BROKEN
    text = json.dumps(receipt, sort_keys=True, indent=1) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        Path(output).write_text(text, encoding="ascii")
    return EXIT_OK


def main_verify_receipt(
    receipt_file: str, key_specs: list[str], report_path: str | None, as_json: bool
) -> int:
    """`docbroker audit verify-receipt`: the story (or one JSON document); exit 0/1/2."""
    keys = load_keys(key_specs, "verify-receipt")
    if keys is None:
        return EXIT_USAGE
    try:
        receipt = read_proof(receipt_file, sys.stdin.buffer)
    except ProofError as exc:
        sys.stderr.write(f"docbroker audit verify-receipt: cannot read the receipt: {exc}\n")
        return EXIT_USAGE
    report = None
    if report_path is not None:
        try:
            with open_regular_stream(report_path) as stream:
                report = stream.read()
        except (UnsafeFileError, OSError) as exc:
            reason = exc.reason if isinstance(exc, UnsafeFileError) else (exc.strerror or "error")
            sys.stderr.write(f"docbroker audit verify-receipt: cannot read the report: {reason}\n")
            return EXIT_USAGE
    name = Path(report_path).name if report_path is not None else None
    verdict = check_receipt(receipt, keys, report, name)
    if as_json:
        document = {"ok": verdict.ok, "problem": verdict.problem, "story": verdict.story,
                    "report_checked": verdict.report_checked}  # fmt: skip
        sys.stdout.write(json.dumps(document, sort_keys=True) + "\n")
    elif verdict.ok:
        sys.stdout.write("receipt OK\n" + "".join(line + "\n" for line in verdict.story))
        if report is None:
            sys.stdout.write("the report itself NOT checked: give it with --report\n")
    else:
        sys.stdout.write(f"receipt BROKEN: {printable(verdict.problem or '')}\n")
    return EXIT_OK if verdict.ok else EXIT_BROKEN
