"""broker.audit.merkle against the published RFC 6962 known-answer tests, and its proofs' checks.

Vectors from google/certificate-transparency, src/merkletree/merkle_tree_test.cc (the
"KNOWN ANSWER TESTS": kInputs, kSHA256Roots, kSHA256Paths, kSHA256Proofs). That file numbers
leaves from 1; the indexes below are 0-based (RFC 9162), i.e. one less.
"""

from __future__ import annotations

import itertools

import pytest

from broker.audit.merkle import (
    EMPTY_ROOT,
    Frontier,
    RangeHasher,
    consistency_ranges,
    hash_ranges,
    inclusion_ranges,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)

INPUTS = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]


def root_of(hashes: list[bytes]) -> bytes:
    """MTH over leaf hashes, by the frontier the log itself keeps."""
    frontier = Frontier()
    for h in hashes:
        frontier.append_hash(h)
    return frontier.root()


EMPTY_TREE = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
ROOTS = [  # after 1, 2, ..., 8 leaves
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
PATHS = [  # (index, tree size, audit path)
    (0, 1, []),
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (
        1,
        5,
        [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]
PROOFS = [  # (old size, new size, consistency proof)
    (1, 1, []),
    (
        1,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        6,
        8,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (
        2,
        5,
        [
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]
LEAVES = [leaf_hash(x) for x in INPUTS]


def unhex(path: list[str]) -> list[bytes]:
    return [bytes.fromhex(h) for h in path]


def test_empty_tree_head() -> None:
    assert EMPTY_ROOT.hex() == EMPTY_TREE == Frontier().root().hex()


def test_incremental_roots_match_the_published_ones() -> None:
    frontier = Frontier()
    for n, line in enumerate(INPUTS, 1):
        frontier.append(line)
        assert frontier.size == n and len(frontier.nodes) == n.bit_count()
        assert frontier.root().hex() == ROOTS[n - 1]


def test_frontier_resumes_from_its_nodes() -> None:
    first = Frontier()
    for line in INPUTS[:5]:
        first.append(line)
    resumed = Frontier(first.size, list(first.nodes))
    for line in INPUTS[5:]:
        resumed.append(line)
    assert resumed.root().hex() == ROOTS[7]
    with pytest.raises(ValueError):
        Frontier(5, first.nodes[:1])


@pytest.mark.parametrize(("index", "size", "path"), PATHS)
def test_inclusion_paths_match_the_published_ones(index: int, size: int, path: list[str]) -> None:
    ranges = inclusion_ranges(index, size)
    assert hash_ranges(LEAVES, ranges) == unhex(path)
    root = bytes.fromhex(ROOTS[size - 1])
    assert verify_inclusion(index, size, LEAVES[index], unhex(path), root)


@pytest.mark.parametrize(("old", "new", "proof"), PROOFS)
def test_consistency_proofs_match_the_published_ones(old: int, new: int, proof: list[str]) -> None:
    assert hash_ranges(LEAVES, consistency_ranges(old, new)) == unhex(proof)
    assert verify_consistency(
        old, new, bytes.fromhex(ROOTS[old - 1]), bytes.fromhex(ROOTS[new - 1]), unhex(proof)
    )


def test_streaming_range_hasher_agrees_with_the_in_memory_one() -> None:
    hashes = [leaf_hash(bytes([i])) for i in range(70)]
    for old, new in [(1, 70), (7, 70), (32, 70), (33, 64), (69, 70)]:
        hasher = RangeHasher(consistency_ranges(old, new))
        for h in hashes[:new]:
            hasher.add(h)
        assert hasher.roots() == [root_of(hashes[s:e]) for s, e in consistency_ranges(old, new)]
        assert hash_ranges(hashes, consistency_ranges(old, new)) == hasher.roots()


def test_every_proof_of_a_small_tree_verifies_and_no_wrong_one_does() -> None:
    hashes = [leaf_hash(bytes([i])) for i in range(20)]
    roots = [root_of(hashes[:n]) for n in range(21)]
    for size in range(1, 21):
        for index in range(size):
            path = hash_ranges(hashes, inclusion_ranges(index, size))
            assert verify_inclusion(index, size, hashes[index], path, roots[size])
            other = (index + 1) % size
            if other != index:
                assert not verify_inclusion(other, size, hashes[index], path, roots[size])
            assert not verify_inclusion(index, size, hashes[index], path, roots[size - 1])
    for old, new in itertools.combinations_with_replacement(range(1, 21), 2):
        proof = hash_ranges(hashes, consistency_ranges(old, new))
        assert verify_consistency(old, new, roots[old], roots[new], proof)
        if old != new:
            assert not verify_consistency(
                old, new, roots[old - 1] if old > 1 else b"x" * 32, roots[new], proof
            )
            bad = [bytes(32), *proof[1:]]
            assert not verify_consistency(old, new, roots[old], roots[new], bad)


def test_tampered_inclusion_path_is_refused() -> None:
    index, size, path = PATHS[2]
    forged = unhex(path)
    forged[1] = bytes(32)
    assert not verify_inclusion(index, size, LEAVES[index], forged, bytes.fromhex(ROOTS[size - 1]))
    assert not verify_inclusion(
        index, size, leaf_hash(b"forged"), unhex(path), bytes.fromhex(ROOTS[size - 1])
    )
    assert not verify_inclusion(8, 8, LEAVES[0], unhex(path), bytes.fromhex(ROOTS[7]))
