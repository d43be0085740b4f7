"""`docbroker approvals list|show|approve|deny`: out-of-band approvals, through the broker's
REST API (broker/web/api.py).

The CLI is one more client of `/v1/approvals`, so a decision here meets exactly the rules
and the audit a decision on the approvals page meets: the approver's token names the tenant
and the subject, `reports:approve` is required, another tenant's id is "not found", the
requester may not approve their own draft when the policy says so, and every request leaves
one audit event. The token is read from a file (`--token-file`, or `-` for stdin), never
from the command line, where other users of the host could read it; it is never printed.

`approve` shows what it approves: it fetches the record (which is what lets the broker count
this person's yes: a yes from someone the content was never shown to is `content_not_viewed`),
prints it, and asks on the terminal. Without a terminal (a script, a pipe) there is nobody to
ask, so it approves only with `--sha256 HASH`: the content's hash as `show` printed it to the
person who read it. A flag that only said "I read it" would be typed once into a script and
forgotten; a hash names the exact bytes that were read, and a different report cannot pass.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from broker.cli.base import (
    CliError,
    Subparsers,
    UsageError,
    json_flag,
    print_fields,
    print_json,
    print_table,
    progress,
)
from broker.settings import SettingsError

STATES = ("pending", "approved", "denied", "consumed", "expired", "all")
MAX_TOKEN_BYTES = 16 * 1024
STDIN = "-"  # --token-file - : the token comes on stdin
# The API's error codes, as a person reads them.
ERRORS = {
    "not_found": "no such approval for this token's tenant",
    "not_pending": "already decided",
    "already_decided": "your decision on it is already counted: it waits for other approvers",
    "expired": "expired",
    "approver_is_requester": "the requester may not approve their own report (policy)",
    "content_not_viewed": "the report's content must be shown to you before you approve it",
    "unauthorized": "the token was refused",
    "forbidden": "the token was refused (it needs the reports:approve scope)",
    "too_many_requests": "too many refused tokens from this address; retry later",
    "rate_limited": "the tenant's rate limit; retry later",
    "concurrency_limited": "the tenant's concurrency limit; retry later",
    "audit_unavailable": "the broker cannot write its audit log",
    "approvals_unavailable": "the broker cannot reach its approvals database",
    "not_written": "the report is not written (yet): a receipt is for a written report",
    "receipt_not_ready": "the receipt's last lines are not under a signed checkpoint yet",
}


def register(sub: Subparsers) -> None:
    approvals = sub.add_parser(
        "approvals",
        help="out-of-band approvals over the broker's REST API: list, show, approve, deny",
        description="Talks to a running broker (--url, default DOCBROKER_PUBLIC_URL or "
        "http://DOCBROKER_HOST:DOCBROKER_PORT) with an approver's token from --token-file.",
    )
    commands = approvals.add_subparsers(dest="approvals_command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="the tenant's approvals, newest first")
    listing.add_argument("--state", choices=STATES, default="pending")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (1..1000)")
    _client_args(listing)
    listing.set_defaults(func=cmd_list)

    show = commands.add_parser("show", help="one approval, with the report's content")
    show.add_argument("approval_id", metavar="ID")
    show.add_argument(
        "--receipt", action="store_true",
        help="print the written report's receipt (JSON) for `docbroker audit verify-receipt` instead",
    )  # fmt: skip
    _client_args(show)
    show.set_defaults(func=cmd_show)

    approve = commands.add_parser(
        "approve", help="show a pending report, then approve it (asks on a terminal; else needs --sha256)"
    )
    approve.add_argument("approval_id", metavar="ID")
    approve.add_argument(
        "--sha256", metavar="HASH", help="without a terminal: the SHA-256 of the content you read (`show`)"
    )
    _client_args(approve)
    approve.set_defaults(func=cmd_approve)

    deny = commands.add_parser("deny", help="deny a pending report")
    deny.add_argument("approval_id", metavar="ID")
    _client_args(deny)
    deny.set_defaults(func=cmd_decide, verb="deny")


def _client_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the broker's base URL")
    parser.add_argument(
        "--token-file", required=True, metavar="FILE", help="the approver's token: a file, or - for stdin"
    )
    json_flag(parser)


def read_token(path: str) -> str:
    """One token from a file (or - for stdin), bounded; never echoed anywhere."""
    from broker.files import UnsafeFileError, read_bounded

    if path == STDIN:
        raw = sys.stdin.buffer.read(MAX_TOKEN_BYTES + 1)
    else:
        try:  # a link may point at the token an identity tool keeps refreshed
            raw = read_bounded(path, MAX_TOKEN_BYTES, follow_links=True)
        except (OSError, UnsafeFileError):
            raise UsageError("--token-file cannot be read as a small regular file") from None
    token = raw.decode("ascii", errors="replace").strip()
    if not token or len(raw) > MAX_TOKEN_BYTES or any(c.isspace() or not c.isprintable() for c in token):
        raise UsageError("--token-file does not hold one token")
    return token


def _base_url(args: argparse.Namespace) -> str:
    from broker.settings import origin_of, public_url_from_env

    if args.url is not None:
        if origin_of(args.url) is None:
            raise UsageError("--url must be an http(s) URL")
        return str(args.url).rstrip("/")
    try:
        return public_url_from_env()
    except SettingsError as exc:
        raise UsageError(f"configuration error: {exc}") from None


def _token(args: argparse.Namespace) -> str:
    # Read once: `approve` calls twice, and stdin (`-`) can be read only once.
    if getattr(args, "token", None) is None:
        args.token = read_token(args.token_file)
    return str(args.token)


def _call(args: argparse.Namespace, method: str, path: str, params: dict[str, str] | None = None) -> Any:
    import httpx2

    headers = {"authorization": f"Bearer {_token(args)}", "accept": "application/json"}
    try:
        with (
            progress("asking the broker"),
            httpx2.Client(base_url=_base_url(args), headers=headers, timeout=30) as http,
        ):
            response = http.request(method, "/v1/approvals" + path, params=params)
    except httpx2.HTTPError as exc:  # the URL and the token stay out of the message
        raise CliError(f"cannot reach the broker ({type(exc).__name__})") from None
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200 or not isinstance(body, dict):
        code = body.get("error") if isinstance(body, dict) else None
        reason = ERRORS.get(str(code), f"the broker answered {response.status_code}")
        retry = response.headers.get("retry-after")
        raise CliError(reason + (f" (retry after {retry} s)" if retry and retry.isdigit() else ""))
    return body


def _check_id(approval_id: str) -> str:
    # The API's own form: 32 hex digits. Anything else would be a path the API answers 404 to.
    if len(approval_id) != 32 or any(c not in "0123456789abcdef" for c in approval_id):
        raise UsageError("not an approval id (32 hex digits)")
    return approval_id


def _when(seconds: object) -> str | None:
    import datetime

    if not isinstance(seconds, int | float):
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def cmd_list(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 1000:
        raise UsageError("--limit must be between 1 and 1000")
    found: list[dict[str, Any]] = []
    cursor = None
    while len(found) < args.limit:
        params = {"state": args.state, "limit": str(min(100, args.limit - len(found)))}
        if cursor:
            params["cursor"] = cursor
        page = _call(args, "GET", "", params)
        found.extend(page.get("approvals", []))
        cursor = page.get("next_cursor")
        if not cursor:
            break
    if args.json:
        print_json({"approvals": found, "more": bool(cursor)})
        return 0
    columns = ["approval_id", "state", "requester", "filename", "bytes", "created_at", "expires_at"]
    print_table(
        ["id", "state", "requester", "report", "bytes", "created", "expires"],
        [[_when(a.get(c)) if c.endswith("_at") else a.get(c) for c in columns] for a in found],
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    if args.receipt:  # the document itself: what verify-receipt reads, byte for byte as served
        print_json(_call(args, "GET", "/" + _check_id(args.approval_id) + "/receipt"))
        return 0
    record = _call(args, "GET", "/" + _check_id(args.approval_id))
    if args.json:
        print_json(record)
        return 0
    _print_record(record)
    return 0


def _print_record(record: dict[str, Any]) -> None:
    shown = dict(record)
    content = shown.pop("content", None)
    print_fields([(k, _when(v) if k.endswith("_at") else v) for k, v in shown.items()])
    if isinstance(content, str):
        from broker.audit.table import escape

        # The report's text, as the tenant's tool wrote it: escaped line by line, so what it
        # holds is shown, never obeyed by the terminal.
        sys.stdout.write("\n" + "".join(escape(line) + "\n" for line in content.splitlines()))
    sys.stdout.flush()


def cmd_approve(args: argparse.Namespace) -> int:
    approval_id = _check_id(args.approval_id)
    record = _call(args, "GET", "/" + approval_id)  # the broker records that it was shown
    if args.sha256 is not None:
        if args.sha256.lower() != record.get("sha256"):
            raise CliError("the report's SHA-256 is not the one given: nothing was approved")
        if not args.json:
            _print_record(record)
    elif sys.stdin.isatty() and args.token_file != STDIN:  # stdin holding the token asks nothing
        _print_record(record)
        sys.stderr.write(f"\nApprove exactly these {record.get('bytes')} bytes? [y/N] ")
        sys.stderr.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            raise CliError("not approved")
    else:
        raise UsageError(
            "no terminal to ask on: read the report (`approvals show`) and pass --sha256 with its SHA-256"
        )
    return _decided(args, _call(args, "POST", f"/{approval_id}/approve"))


def cmd_decide(args: argparse.Namespace) -> int:
    return _decided(args, _call(args, "POST", f"/{_check_id(args.approval_id)}/{args.verb}"))


def _decided(args: argparse.Namespace, record: dict[str, Any]) -> int:
    if args.json:
        print_json(record)
    else:
        print_fields([(k, _when(v) if k.endswith("_at") else v) for k, v in record.items()])
    return 0
