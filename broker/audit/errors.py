"""The audit package's exception tree.

    AuditError
    ├── AuditSinkError      the log cannot be written (or opened): the caller must refuse the request
    └── UnknownEventError   a programming error: an event name outside the schema

Messages are fixed texts and `code` is a fixed token: no field value, path or line content is ever
carried, so an error can be logged or shown without leaking what the audit log protects.
"""

from __future__ import annotations


class AuditError(Exception):
    """Base of every error raised by `broker.audit`."""


class AuditSinkError(AuditError):
    """The audit log is unusable. Fail closed: no call may proceed unaudited.

    `code` says which step failed (for metrics and the reason code of the refusal):
    open_failed, tail_invalid, locked, write_failed, short_write, fsync_failed, unavailable, closed.
    """

    def __init__(self, code: str) -> None:
        super().__init__(f"audit log unavailable ({code})")
        self.code = code

    def startup_message(self) -> str:
        """The one line a broker that cannot open its log exits with (no path: names only)."""
        if self.code == "locked":
            # Two replicas on one chain would fork it: the second one refuses to start.
            return (
                "docbroker: cannot start: the audit log is held by another running broker; give each "
                "replica its own DOCBROKER_REPLICA_ID (its log: audit-<id>.jsonl) or DOCBROKER_AUDIT_LOG"
            )
        return f"docbroker: cannot open the audit log ({self.code}); refusing to start"


class UnknownEventError(AuditError, ValueError):
    """`emit` was called with an event name that the schema does not define."""

    def __init__(self) -> None:
        super().__init__("unknown audit event name")
