"""The broker's audit log (DESIGN §6): name-only JSON Lines events in a sha256 hash chain.

- schema.py: allowed keys and a validator per key; `AuditEvent`
- processors.py: the structlog pipeline (filter keys, validate, header, JSON)
- chain.py: seq/prev bookkeeping
- sink.py: the file (O_APPEND, 0600, flock, tail recovery)
- log.py: `AuditLog` (emit, check, fsync policy, fail closed)
- verify.py: `verify_file` / `main_verify` for `docbroker audit verify`
- testing.py: `capture_audit()` and `MemorySink` for other packages' tests
"""

from broker.audit.errors import AuditError, AuditSinkError, UnknownEventError
from broker.audit.log import AuditLog, AuditStats
from broker.audit.schema import AuditEvent
from broker.audit.verify import VerifyReport, main_verify, verify_file

__all__ = [
    "AuditError",
    "AuditEvent",
    "AuditLog",
    "AuditSinkError",
    "AuditStats",
    "UnknownEventError",
    "VerifyReport",
    "main_verify",
    "verify_file",
]
