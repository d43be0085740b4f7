"""RFC 6962 §2.1 Merkle trees over the audit log's lines: tree heads, proofs and their checks.

    leaf hash  = sha256(0x00 || line)           line: its exact bytes, without the newline
    node hash  = sha256(0x01 || left || right)
    MTH({})    = sha256("")

The hashing is RFC 6962's exactly, so the published Certificate Transparency test vectors apply
and any RFC 6962 / RFC 9162 verifier can check our proofs.

- `Frontier`: the writer's view, the roots of the perfect subtrees that make up the tree so far
  (one per set bit of its size). Appending costs one leaf hash and, amortized, one node hash;
  the tree head is O(log n) node hashes. Nothing is ever rebuilt.
- `inclusion_ranges` / `consistency_ranges`: which subtrees a proof is made of (RFC 6962
  §2.1.1 PATH and §2.1.2 SUBPROOF), as leaf ranges; `RangeHasher` hashes them in one streaming
  pass over the leaves, so a proof over a large log needs O(log n) memory.
- `verify_inclusion` / `verify_consistency`: the checks of RFC 9162 §2.1.3.2 and §2.1.4.2.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Final

_sha256 = hashlib.sha256
EMPTY_ROOT: Final = hashlib.sha256(b"").digest()
_LEAF: Final = b"\x00"
_NODE: Final = b"\x01"


def leaf_hash(line: bytes) -> bytes:
    h = hashlib.sha256(_LEAF)
    h.update(line)  # no concatenation: the line is not copied
    return h.digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_NODE + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n ≥ 2): where RFC 6962 splits a tree of n leaves."""
    return 1 << ((n - 1).bit_length() - 1)


class Frontier:
    """The compact Merkle tree: `size` leaves as the roots of perfect subtrees, largest first."""

    __slots__ = ("nodes", "size")

    def __init__(self, size: int = 0, nodes: Sequence[bytes] = ()) -> None:
        if size < 0 or len(nodes) != size.bit_count():
            raise ValueError("frontier does not match its size")
        self.size = size
        self.nodes = list(nodes)

    def append(self, line: bytes) -> None:
        # leaf_hash and append_hash inlined: this runs for every line the broker writes.
        h = _sha256(_LEAF)
        h.update(line)
        node, size, nodes = h.digest(), self.size, self.nodes
        while size & 1:
            node = _sha256(_NODE + nodes.pop() + node).digest()
            size >>= 1
        nodes.append(node)
        self.size += 1

    def append_hash(self, node: bytes) -> None:
        # Each trailing set bit of the old size is a perfect subtree the new leaf completes.
        size, nodes = self.size, self.nodes
        while size & 1:
            node = node_hash(nodes.pop(), node)
            size >>= 1
        nodes.append(node)
        self.size += 1

    def root(self) -> bytes:
        if not self.nodes:
            return EMPTY_ROOT
        node = self.nodes[-1]
        for left in reversed(self.nodes[:-1]):
            node = node_hash(left, node)
        return node

    def copy(self) -> Frontier:
        return Frontier(self.size, self.nodes)


Range = tuple[int, int]  # leaves [start, end)


def inclusion_ranges(index: int, size: int) -> list[Range]:
    """The subtrees of PATH(index, D[0:size]) (RFC 6962 §2.1.1), nearest the leaf first."""
    if not 0 <= index < size:
        raise ValueError("leaf index outside the tree")
    out: list[Range] = []
    start, end = 0, size
    while end - start > 1:
        k = _split(end - start)
        if index - start < k:
            out.append((start + k, end))
            end = start + k
        else:
            out.append((start, start + k))
            start += k
    out.reverse()
    return out


def consistency_ranges(old: int, new: int) -> list[Range]:
    """The subtrees of PROOF(old, D[0:new]) (RFC 6962 §2.1.2), in the RFC's order."""
    if not 0 < old <= new:
        raise ValueError("consistency needs 0 < old size <= new size")
    out: list[Range] = []
    start, m, n, whole = 0, old, new, True
    while m != n:
        k = _split(n)
        if m <= k:
            out.append((start + k, start + n))
            n = k
        else:
            out.append((start, start + k))
            start, m, n, whole = start + k, m - k, n - k, False
    if not whole:
        out.append((start, start + n))
    out.reverse()
    return out


class RangeHasher:
    """MTH of each of a few disjoint leaf ranges, fed the leaf hashes in order, one at a time."""

    def __init__(self, ranges: Iterable[Range]) -> None:
        self._ranges = list(ranges)
        self._order = sorted(range(len(self._ranges)), key=lambda i: self._ranges[i][0])
        self._roots: list[bytes | None] = [None] * len(self._ranges)
        self._at = 0  # position in _order
        self._frontier = Frontier()
        self.count = 0  # leaves seen

    def add(self, h: bytes) -> None:
        index = self.count
        self.count += 1
        while self._at < len(self._order):
            which = self._order[self._at]
            start, end = self._ranges[which]
            if index < start:
                return
            if index < end:
                self._frontier.append_hash(h)
                if index == end - 1:
                    self._roots[which] = self._frontier.root()
                    self._frontier = Frontier()
                    self._at += 1
                return
            self._at += 1  # an empty range cannot happen; skip defensively

    def roots(self) -> list[bytes]:
        if any(r is None for r in self._roots):
            raise ValueError("the leaves ended before every range was complete")
        return [r for r in self._roots if r is not None]


def hash_ranges(hashes: Iterable[bytes], ranges: Sequence[Range]) -> list[bytes]:
    """The MTH of each range, in the ranges' order, from the leaf hashes streamed in order: the
    leaves past the last range are never read (a proof over a log of many gigabytes)."""
    hasher = RangeHasher(ranges)
    end = max((e for _, e in ranges), default=0)
    for h in hashes:
        if hasher.count >= end:
            break
        hasher.add(h)
    return hasher.roots()


def verify_inclusion(index: int, size: int, leaf: bytes, path: Sequence[bytes], root: bytes) -> bool:
    """RFC 9162 §2.1.3.2: is the leaf hash `leaf` at `index` of the tree of `size` with `root`?"""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes, path: Sequence[bytes]) -> bool:
    """RFC 9162 §2.1.4.2: does the tree of `new` leaves extend the tree of `old` leaves?"""
    if not 0 <= old <= new:
        return False
    if old == new:
        return not path and old_root == new_root
    if old == 0:
        return not path  # every tree extends the empty one
    if not path:
        return False
    nodes = list(path)
    if old & (old - 1) == 0:  # a perfect old tree is itself a node of the new one
        nodes.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = nodes[0]
    for c in nodes[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root
