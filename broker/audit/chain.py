"""The hash chain that makes the audit log tamper-evident.

Each line carries `seq` (one more than the line before) and `prev`, the sha256 of the previous
line's exact bytes without its newline. Hashing bytes, not a re-serialisation, means a verifier
needs no canonical-JSON agreement with the writer: it hashes what is on disk.
"""

from __future__ import annotations

import hashlib
import json
from typing import Final

from broker.audit.merkle import Frontier
from broker.audit.nesting import too_deep

GENESIS: Final = "0" * 64  # `prev` of the first line of a log


def line_hash(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


class Chain:
    """Where the log's chain stands: the last written `seq` and the hash of the last line.

    The hash is taken when it is first needed (the next line's `prev`, or `settle`), not when
    the line is written: the write sits on a request's path, and the next line seldom does."""

    __slots__ = ("_head", "_pending", "seq", "tree")

    def __init__(self) -> None:
        self.seq = 0
        self._head = GENESIS
        self._pending: bytes | None = None  # the last line written, not yet hashed
        # The RFC 6962 tree over every line, when checkpoints are signed (broker.audit.notary).
        self.tree: Frontier | None = None

    @property
    def head(self) -> str:
        self.settle()
        return self._head

    def settle(self) -> None:
        """Hash the last line written, if that is still to do."""
        if self._pending is not None:
            self._head = line_hash(self._pending)
            if self.tree is not None:
                self.tree.append(self._pending)
            self._pending = None

    def resume(self, last_line: bytes | None) -> None:
        """Continue after `last_line` (an existing log's final line), or start afresh if None.

        Raises ValueError when the line is not an event with a usable `seq`: appending after it
        would make a chain no verifier accepts, so the caller must refuse to open the log.
        """
        self._pending = None
        if last_line is None:
            self.seq, self._head = 0, GENESIS
            return
        if too_deep(last_line):  # the parser would recurse per `[`: RecursionError, not ValueError
            raise ValueError("last line nests too deep")
        record = json.loads(last_line)
        seq = record.get("seq") if isinstance(record, dict) else None
        if type(seq) is not int or seq < 1:
            raise ValueError("last line has no valid seq")
        self.seq, self._head = seq, line_hash(last_line)

    def advance(self, line: bytes) -> None:
        """Record that `line` (without newline) is now the last line on disk."""
        self.seq += 1
        self._pending = line
