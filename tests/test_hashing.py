"""octlm.hashing: the weights fingerprint sees every bit, dtype, shape and name but not dict order,
device or memory layout; canonical JSON; file checksums ("ALGO:HEX") round-trip and catch damage.
"""

from __future__ import annotations

import hashlib
import os
import struct

import pytest
import torch
import xxhash

from octlm.hashing import (
    checksum_algo,
    checksum_matches,
    file_checksum,
    file_sha256,
    new_checksum,
    sha256_json,
    weights_sha256,
)


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "emb.weight": torch.randn(6, 4, generator=g),
        "norm.weight": torch.ones(4),
        "head.bias": torch.arange(3, dtype=torch.float32),
    }


# -- weights_sha256 --------------------------------------------------------------------------


def test_weights_hash_is_sha256_of_name_dtype_shape_and_bytes_in_name_order() -> None:
    # Known answer, built by hand: the fingerprint every run log and `octlm hash` prints.
    w = torch.tensor([1.0, -2.0], dtype=torch.float32)
    b = torch.tensor([[3]], dtype=torch.int64)
    expected = hashlib.sha256()
    expected.update(b"a.bias|torch.int64|(1, 1)|" + struct.pack("<q", 3))
    expected.update(b"z.weight|torch.float32|(2,)|" + struct.pack("<2f", 1.0, -2.0))
    assert weights_sha256({"z.weight": w, "a.bias": b}) == expected.hexdigest()


def test_weights_hash_changes_with_a_single_bit_flip() -> None:
    base = state()
    flipped = {k: v.clone() for k, v in base.items()}
    bits = flipped["emb.weight"].view(torch.int32)  # same storage: flip the lowest mantissa bit
    bits[3, 2] ^= 1
    assert not torch.equal(flipped["emb.weight"], base["emb.weight"])
    assert (flipped["emb.weight"] - base["emb.weight"]).abs().max() < 1e-6  # a 1-ulp change
    assert weights_sha256(flipped) != weights_sha256(base)


def test_weights_hash_tells_zero_from_negative_zero() -> None:
    # Equal as values (torch.equal says so), different as bits: the hash is over bits.
    pos, neg = torch.zeros(3), torch.tensor([0.0, -0.0, 0.0])
    assert torch.equal(pos, neg)
    assert weights_sha256({"w": pos}) != weights_sha256({"w": neg})


def test_weights_hash_depends_on_dtype() -> None:
    t32 = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float32)
    t64 = t32.to(torch.float64)
    assert torch.equal(t32.to(torch.float64), t64)  # the same values
    assert weights_sha256({"w": t32}) != weights_sha256({"w": t64})
    # The same bytes under another dtype name also differ: the dtype is hashed, not just bytes.
    as_int = t32.view(torch.int32)
    assert as_int.numpy().tobytes() == t32.numpy().tobytes()
    assert weights_sha256({"w": t32}) != weights_sha256({"w": as_int})


def test_weights_hash_depends_on_shape() -> None:
    flat = torch.arange(12, dtype=torch.float32)
    for shape in [(3, 4), (4, 3), (2, 6), (1, 12)]:
        reshaped = flat.reshape(shape)
        assert reshaped.numpy().tobytes() == flat.numpy().tobytes()  # the very same bytes
        assert weights_sha256({"w": reshaped}) != weights_sha256({"w": flat})
    assert weights_sha256({"w": flat.reshape(3, 4)}) != weights_sha256({"w": flat.reshape(4, 3)})


def test_weights_hash_depends_on_names() -> None:
    t = torch.randn(4, generator=torch.Generator().manual_seed(1))
    assert weights_sha256({"a": t}) != weights_sha256({"b": t})
    # Swapping the tensors between two names changes it too.
    u = t + 1
    assert weights_sha256({"a": t, "b": u}) != weights_sha256({"a": u, "b": t})


def test_weights_hash_ignores_dict_insertion_order() -> None:
    s = state()
    reversed_order = dict(reversed(list(s.items())))
    assert list(reversed_order) != list(s)
    assert weights_sha256(reversed_order) == weights_sha256(s)


def test_weights_hash_ignores_memory_layout() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 8, generator=g)
    for view in (x.t(), x[:, ::2], x[1:4, 2:7], x.t()[1:, :]):
        assert not view.is_contiguous()
        copy = view.clone(memory_format=torch.contiguous_format)
        assert copy.is_contiguous() and torch.equal(copy, view)
        assert weights_sha256({"w": view}) == weights_sha256({"w": copy})


def test_weights_hash_ignores_autograd_state() -> None:
    t = torch.randn(3, 3, generator=torch.Generator().manual_seed(3))
    param = torch.nn.Parameter(t.clone())
    assert weights_sha256({"w": param}) == weights_sha256({"w": t})
    model = torch.nn.Linear(3, 2)
    assert weights_sha256(model.state_dict()) == weights_sha256(
        {k: v.detach().clone() for k, v in model.named_parameters()}
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_weights_hash_is_the_same_on_cuda() -> None:
    s = state()
    assert weights_sha256({k: v.cuda() for k, v in s.items()}) == weights_sha256(s)


def test_weights_hash_skips_entries_that_are_not_tensors() -> None:
    s = state()
    mixed = {**s, "_metadata": {"version": 2}, "step": 7, "note": "hello", "none": None}
    assert weights_sha256(mixed) == weights_sha256(s)
    assert weights_sha256({"step": 7}) == weights_sha256({}) == hashlib.sha256().hexdigest()


# -- sha256_json -----------------------------------------------------------------------------


def test_sha256_json_is_independent_of_key_order() -> None:
    a = {"lr": 3e-4, "model": {"dim": 64, "layers": 2}, "tags": ["x", "y"]}
    b = {"tags": ["x", "y"], "model": {"layers": 2, "dim": 64}, "lr": 3e-4}
    assert sha256_json(a) == sha256_json(b)
    canonical = b'{"lr":0.0003,"model":{"dim":64,"layers":2},"tags":["x","y"]}'
    assert sha256_json(a) == hashlib.sha256(canonical).hexdigest()


def test_sha256_json_sees_values_and_list_order() -> None:
    a = {"lr": 3e-4, "tags": ["x", "y"]}
    assert sha256_json(a) != sha256_json({"lr": 3e-3, "tags": ["x", "y"]})
    assert sha256_json(a) != sha256_json({"lr": 3e-4, "tags": ["y", "x"]})
    assert sha256_json({"n": 1}) != sha256_json({"n": "1"})


# -- file checksums --------------------------------------------------------------------------


@pytest.fixture
def blob(tmp_path):
    """A file of 2.5 MiB of random bytes: more than one of the hasher's 1 MiB read chunks."""
    path = tmp_path / "blob.bin"
    data = os.urandom((5 << 20) // 2)
    path.write_bytes(data)
    return path, data


REFERENCE = {
    "xxh3_128": xxhash.xxh3_128_hexdigest,
    "sha256": lambda data: hashlib.sha256(data).hexdigest(),
}


@pytest.mark.parametrize("algo", REFERENCE)
def test_file_checksum_round_trips_and_a_flipped_byte_fails(blob, algo) -> None:
    path, data = blob
    checksum = file_checksum(path, algo)
    assert checksum == f"{algo}:{REFERENCE[algo](data)}"  # the whole file, across read chunks
    assert checksum_algo(checksum) == algo
    assert checksum_matches(path, checksum)
    damaged = bytearray(data)
    damaged[len(data) - 17] ^= 0x01  # one bit, in the last read chunk
    path.write_bytes(bytes(damaged))
    assert not checksum_matches(path, checksum)
    assert file_checksum(path, algo) != checksum
    path.write_bytes(data)  # undone: matches again
    assert checksum_matches(path, checksum)


def test_default_checksum_is_xxh3_128(blob) -> None:
    path, data = blob
    assert file_checksum(path) == f"xxh3_128:{xxhash.xxh3_128_hexdigest(data)}"


def test_a_bare_hex_checksum_is_a_sha256(blob) -> None:
    path, data = blob
    bare = hashlib.sha256(data).hexdigest()
    assert checksum_algo(bare) == "sha256"
    assert bare == file_sha256(path)
    assert checksum_matches(path, bare)  # the form octlm <= 0.1 wrote
    assert not checksum_matches(path, "0" * 64)


def test_a_checksum_under_the_wrong_algorithm_does_not_match(blob) -> None:
    path, _ = blob
    xxh_hex = file_checksum(path, "xxh3_128").split(":", 1)[1]
    sha_hex = file_sha256(path)
    assert not checksum_matches(path, f"sha256:{xxh_hex}")
    assert not checksum_matches(path, f"xxh3_128:{sha_hex}")


def test_new_checksum_is_incremental() -> None:
    for algo in ("xxh3_128", "sha256"):
        h = new_checksum(algo)
        h.update(b"hello, ")
        h.update(b"world")
        one_shot = new_checksum(algo)
        one_shot.update(b"hello, world")
        assert h.hexdigest() == one_shot.hexdigest()
    assert new_checksum("sha256").hexdigest() == hashlib.sha256().hexdigest()


@pytest.mark.parametrize("algo", ["md5", "SHA256", "xxh3", ""])
def test_new_checksum_rejects_an_unknown_algorithm(tmp_path, algo) -> None:
    with pytest.raises(ValueError, match="unknown checksum algorithm") as info:
        new_checksum(algo)
    assert "xxh3_128" in str(info.value) and "sha256" in str(info.value)  # names the known ones
    path = tmp_path / "f"
    path.write_bytes(b"data")
    with pytest.raises(ValueError, match="unknown checksum algorithm"):
        file_checksum(path, algo)
