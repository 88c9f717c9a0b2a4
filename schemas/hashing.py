"""Stable 64-bit hashes of string arrays, vectorised over Arrow buffers.

Python's built-in hash() of a str changes between processes (PYTHONHASHSEED), so it cannot decide
shards or example choice on a cluster. This module computes FNV-1a (64-bit) over the UTF-8 bytes of
every string of an Arrow string array at once: one numpy pass per byte position, never a Python loop
per string. The result depends only on the bytes, so every worker of every runner agrees.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

# bytes of a string hashed by FNV-1a's per-byte steps (fnv1a_64); real datum_uids, image ids,
# query and document ids are far shorter (a long object-store path is a few hundred bytes)
FNV_BYTES = 4096
FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


def fnv1a_64(strings: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """FNV-1a 64-bit hash of each string of at most FNV_BYTES bytes.

    strings: Arrow string or large_string array of length n (nulls hash like "").
    Returns uint64[n]. fnv1a_64(pa.array(["a"]))[0] == 0xAF63DC4C8601EC8C.
    FNV-1a is one multiplication per byte in sequence, and this loop takes one numpy step per
    byte position, so a hostile id of millions of bytes would take as many steps. A string
    longer than FNV_BYTES hashes as
    FNV-1a of its first FNV_BYTES bytes, XORed with the 8-byte BLAKE2b digest (little-endian) of
    all its bytes and multiplied by the FNV prime once more: still a function of every byte,
    linear time, and no real id reaches it.
    """
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks() if strings.num_chunks else pa.array([], pa.string())
    if pa.types.is_large_string(strings.type):
        offset_type = np.int64
    elif pa.types.is_string(strings.type):
        offset_type = np.int32
    else:
        raise TypeError(f"expected a string array, got {strings.type}")
    n = len(strings)
    hashes = np.full(n, FNV_OFFSET, dtype=np.uint64)
    if n == 0:
        return hashes
    _, offsets_buf, data_buf = strings.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offset_type)[strings.offset: strings.offset + n + 1]
    if data_buf is None:
        return hashes
    data = np.frombuffer(data_buf, dtype=np.uint8)
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    if strings.null_count:
        lengths[~np.asarray(strings.is_valid())] = 0
    # Visit byte position j of all strings at once; strings shorter than j drop out. Sorting by
    # length lets each step work on a shrinking suffix instead of masking the whole array.
    order = np.argsort(lengths, kind="stable")
    sorted_lengths = lengths[order]
    sorted_starts = starts[order]
    sorted_hashes = hashes[order]
    max_len = min(int(sorted_lengths[-1]), FNV_BYTES)
    with np.errstate(over="ignore"):
        for j in range(max_len):
            first = int(np.searchsorted(sorted_lengths, j, side="right"))
            byte = data[sorted_starts[first:] + j].astype(np.uint64)
            sorted_hashes[first:] = (sorted_hashes[first:] ^ byte) * FNV_PRIME
        # the few longer strings: their whole bytes through BLAKE2b (C, linear time), mixed in
        for i in range(int(np.searchsorted(sorted_lengths, FNV_BYTES, side="right")), n):
            start = int(sorted_starts[i])
            rest = hashlib.blake2b(data[start: start + int(sorted_lengths[i])], digest_size=8).digest()
            sorted_hashes[i] = (sorted_hashes[i] ^ np.uint64(int.from_bytes(rest, "little"))) * FNV_PRIME
    hashes[order] = sorted_hashes
    return hashes


def shard_of(hashes: np.ndarray, num_shards: int) -> np.ndarray:
    """Shard index in [0, num_shards) of each hash (int64[n])."""
    return (hashes % np.uint64(num_shards)).astype(np.int64)


def uid_shards(uids: list[str], num_shards: int) -> np.ndarray:
    """int64 shard of each datum_uid: FNV-1a 64 of its UTF-8 bytes, mod num_shards."""
    if not uids:
        return np.zeros(0, dtype=np.int64)
    return shard_of(fnv1a_64(pa.array(uids, pa.string())), num_shards)


_MIX_SEEDS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03))


def _mixed(hashes: np.ndarray, seed: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of (hash + seed): every input bit moves every output bit."""
    with np.errstate(over="ignore"):
        z = hashes.astype(np.uint64) + seed
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def fingerprint_sums(hashes: np.ndarray) -> tuple[int, int]:
    """The two sums, mod 2^64, of a set of datum hashes (uint64[n], each datum once) mixed with
    two seeds. Sums of the parts of any split of the set add up (mod 2^64) to the sums of the
    whole, so shards of any runner combine them in any order; fingerprint() writes them out."""
    return tuple(int(_mixed(hashes, seed).sum(dtype=np.uint64)) for seed in _MIX_SEEDS)


def fingerprint(sums: tuple[int, int]) -> str:
    """32 hexadecimal digits of the two fingerprint_sums (any Python ints, reduced mod 2^64).
    Two sets of datums that differ have other fingerprints but with a chance of about 2^-128
    (the mixer is not cryptographic: it tells data apart, it does not defend against someone
    crafting ids to collide)."""
    return "".join(f"{value % (1 << 64):016x}" for value in sums)
