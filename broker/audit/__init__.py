"""The broker's audit log (DESIGN §6): name-only JSON Lines events in a sha256 hash chain, with
signed RFC 6962 checkpoints over it.

- schema.py: allowed keys and a validator per key; `AuditEvent`, `SystemEvent`
- processors.py: the structlog pipeline (filter keys, validate, header, JSON)
- chain.py: seq/prev bookkeeping, and the Merkle frontier when signing
- sink.py: the file (O_APPEND, 0600, flock, tail recovery, size rotation, reading back)
- log.py: `AuditLog` (emit, check, fsync policy, fail closed, checkpoints, rotation, gaps)
- merkle.py: RFC 6962 tree heads, inclusion and consistency proofs and their checks
- checkpoint.py: the Ed25519 audit key, signed records, public keys for verifiers
- notary.py: the writer's checkpoint state, rebuilt from disk on open
- witness.py: copies of lines elsewhere (the witness file, stdout)
- verify.py: `verify_file`, the chain of one file
- nesting.py: how deep a JSON line nests, checked before it is parsed
- evidence.py: `docbroker audit verify` over files, keys and witnesses
- witness_reader.py: a witness file read for `verify`, streamed in step with the log
- proofs.py: `docbroker audit prove` / `verify-proof`
- testing.py: `capture_audit()` and `MemorySink` for other packages' tests
"""

from broker.audit.errors import AuditError, AuditSinkError, UnknownEventError
from broker.audit.log import AuditLog, AuditStats
from broker.audit.schema import AuditEvent, AuditFn
from broker.audit.verify import VerifyReport, main_verify, verify_file

__all__ = [
    "AuditError",
    "AuditEvent",
    "AuditFn",
    "AuditLog",
    "AuditSinkError",
    "AuditStats",
    "UnknownEventError",
    "VerifyReport",
    "main_verify",
    "verify_file",
]
