"""The writer's side of checkpoints: where the lineage stands, and the records to write next.

The `Notary` keeps the lineage's log id, the number and hash of its last checkpoint and how many
lines came after it. The Merkle frontier itself lives with the chain (`Chain.tree`), which feeds
it each line as it settles. `resume` rebuilds all of it from what is on disk, newest line first:
the last checkpoint line carries the frontier it was taken over, so only the lines after it are
hashed again (at most `checkpoint_every`, or a checkpoint interval's worth).

Checkpoint lines are leaves like any other: a checkpoint over `size` lines is itself line
`size + 1` (the tree's leaf index `size`), so the next checkpoint covers it.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Iterable
from typing import Any

from broker.audit.chain import GENESIS
from broker.audit.checkpoint import CHECKPOINT_LABEL, FORMAT, GAP_LABEL, Signer, record_hash
from broker.audit.merkle import Frontier, leaf_hash
from broker.audit.nesting import too_deep
from broker.audit.processors import rfc3339_ms
from broker.audit.schema import SystemEvent

logger = logging.getLogger(__name__)
# A checkpoint line as the renderer writes it (compact JSON): a cheap test before a parse.
_CHECKPOINT_MARK = f'"event":"{SystemEvent.CHECKPOINT}"'.encode()


class HistoryError(ValueError):
    """The lines on disk do not describe one tree (a checkpoint's frontier disagrees with them)."""


class Notary:
    def __init__(self, signer: Signer, replica: str, clock: Callable[[], int]) -> None:
        self.signer = signer
        self.replica = replica
        self._clock = clock
        self.log_id = ""
        self.count = 0  # checkpoints of this lineage so far (the last one's `n`)
        self.last_hash = GENESIS  # its record_hash
        self.since = 0  # lines written after it

    def resume(self, newest_first: Iterable[bytes], seq: int) -> Frontier:
        """Read back to the last checkpoint; return the frontier over all `seq` lines so far."""
        # Leaf hashes, not lines: a log from before checkpoints is read back whole, and 32 bytes a
        # line is what the tree needs of it.
        after: list[bytes] = []
        found: dict[str, Any] | None = None
        for line in newest_first:
            if _CHECKPOINT_MARK in line and not too_deep(line):
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                if isinstance(record, dict) and record.get("event") == SystemEvent.CHECKPOINT:
                    found = record
                    after.append(leaf_hash(line))
                    break
            after.append(leaf_hash(line))
        after.reverse()
        if found is None:
            # No checkpoint anywhere (a log from before checkpoints): all its lines are leaves,
            # and the first checkpoint starts a new lineage over them.
            frontier = Frontier()
            self.log_id, self.count, self.last_hash = secrets.token_hex(16), 0, GENESIS
        else:
            body = found["checkpoint"]
            try:
                frontier = Frontier(body["size"], [bytes.fromhex(h) for h in found["frontier"]])
            except (KeyError, TypeError, ValueError):
                raise HistoryError("checkpoint line without a usable frontier") from None
            if frontier.root().hex() != body["root"]:
                raise HistoryError("checkpoint frontier does not match its root")
            self.log_id, self.count, self.last_hash = body["log"], body["n"], record_hash(body)
        for leaf in after:
            frontier.append_hash(leaf)
        if frontier.size != seq:
            raise HistoryError("tree size and sequence number disagree")
        self.since = len(after) - (found is not None)
        return frontier

    def checkpoint(self, tree: Frontier) -> dict[str, Any]:
        """The fields of the next checkpoint line over `tree` (the state moves on: see `resume`)."""
        n = self.count + 1
        body = {
            "v": FORMAT,
            "log": self.log_id,
            "replica": self.replica,
            "n": n,
            "size": tree.size,
            "root": tree.root().hex(),
            "prev": self.last_hash,
            "time": rfc3339_ms(self._clock()),
            "key": self.signer.key_id,
        }
        self.count, self.last_hash = n, record_hash(body)
        return {
            "checkpoint": body,
            "sig": self.signer.sign(CHECKPOINT_LABEL, body),
            "frontier": [node.hex() for node in tree.nodes],
        }

    def gap(self, tree_size: int, since_ns: int, refused: int, lost: int) -> dict[str, Any]:
        body = {
            "v": FORMAT,
            "log": self.log_id,
            "replica": self.replica,
            "size": tree_size,
            "from": rfc3339_ms(since_ns),
            "to": rfc3339_ms(self._clock()),
            "refused": refused,
            "lost": lost,
            "key": self.signer.key_id,
        }
        return {"gap": body, "sig": self.signer.sign(GAP_LABEL, body)}
