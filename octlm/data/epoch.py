"""The epoch order: each of n blocks once per epoch, shuffled by a keyed bijection, in O(1) memory.

Global sample i (i = step * global_batch + j) reads block `permute(seed, i // n, i % n, n)`.
The permutation is a Feistel network over the next power of two at or above n, walked in cycles
until it lands below n, so no permutation is ever stored. Everything is integer arithmetic on
uint64 (keys from BLAKE2b, a splitmix64 round function): the same blocks on every platform and
numpy version, which `tests/data/test_epoch.py` pins.
"""

from __future__ import annotations

import hashlib

import numpy as np

ROUNDS = 8  # alternating rounds, 4 per half: Luby-Rackoff's bound is 4 in all
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_KEY_DOMAIN = b"octlm/epoch-order/v1"


def round_keys(seed: int, epoch: int, domain: str | None = None) -> np.ndarray:
    """The ROUNDS 64-bit Feistel keys of (seed, epoch): one BLAKE2b digest, so any seed size
    works and no other generator's stream is shared (the random order uses PCG64(seed, step)).
    `domain` keys another family of permutations (a mixture's, `octlm.data.mixture`)."""
    prefix = _KEY_DOMAIN if domain is None else domain.encode("ascii")
    message = prefix + f"/{seed}/{epoch}".encode("ascii")
    digest = hashlib.blake2b(message, digest_size=8 * ROUNDS).digest()
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


def _mix(v: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of v ^ key: uint64 array arithmetic wraps modulo 2**64."""
    z = v ^ key
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _feistel(x: np.ndarray, keys: np.ndarray, low_bits: int, high_bits: int) -> np.ndarray:
    """A bijection of [0, 2**(low_bits + high_bits)): each round xors one half with a keyed
    hash of the other, so sizes need not match (an odd bit count is fine) and each round is
    its own inverse."""
    low_mask, high_mask = np.uint64((1 << low_bits) - 1), np.uint64((1 << high_bits) - 1)
    shift = np.uint64(low_bits)
    low, high = x & low_mask, x >> shift
    for r, key in enumerate(keys):
        if r % 2 == 0:
            low = low ^ (_mix(high, key) & low_mask)
        else:
            high = high ^ (_mix(low, key) & high_mask)
    return (high << shift) | low


def permute(
    seed: int, epoch: int, positions: np.ndarray, n: int, domain: str | None = None
) -> np.ndarray:
    """The blocks (int64, each in [0, n)) at `positions` (each in [0, n)) of epoch `epoch`:
    a permutation of range(n) that depends only on (seed, epoch, n)."""
    if n < 1:
        raise ValueError(f"an epoch of {n} blocks")
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size and (positions.min() < 0 or positions.max() >= n):
        raise ValueError(f"positions outside [0, {n})")
    bits = (n - 1).bit_length()  # 2**bits >= n, and < 2n: a walk takes under 2 rounds on average
    low_bits = bits - bits // 2
    keys = round_keys(seed, epoch, domain)
    out = _feistel(positions.astype(np.uint64).reshape(-1), keys, low_bits, bits // 2)
    # Cycle walking: re-encrypt what fell outside [0, n). Each value's cycle passes through
    # its own start (< n), so the walk ends, and the map on [0, n) stays a bijection.
    outside = np.flatnonzero(out >= np.uint64(n))
    while outside.size:
        out[outside] = _feistel(out[outside], keys, low_bits, bits // 2)
        outside = outside[out[outside] >= np.uint64(n)]
    return out.astype(np.int64).reshape(positions.shape)


def sample_blocks(
    seed: int, first: int, count: int, n: int, domain: str | None = None
) -> np.ndarray:
    """The blocks of global samples first .. first + count - 1 (int64). A range may straddle
    epochs, even several when count > n: each epoch's share is permuted with its own keys."""
    if first < 0 or count < 0:
        raise ValueError(f"samples [{first}, {first + count}) start below 0")
    index = first + np.arange(count, dtype=np.int64)
    epochs, positions = index // n, index % n
    out = np.empty(count, dtype=np.int64)
    for epoch in range(first // n, (first + count - 1) // n + 1) if count else ():
        here = epochs == epoch
        out[here] = permute(seed, epoch, positions[here], n, domain)
    return out
