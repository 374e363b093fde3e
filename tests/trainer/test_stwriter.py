"""The streaming safetensors writer: a standard file, and the checksum of exactly its bytes."""

from __future__ import annotations

import json

import pytest
import torch
import xxhash
from safetensors import safe_open
from safetensors.torch import load

from octlm.hashing import file_checksum
from octlm.trainer.stwriter import write_safetensors


def sample() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "b.weight": torch.randn(5, 7, generator=g),
        "a.bf16": torch.randn(3, 3, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(2.5),
        "bytes": torch.arange(11, dtype=torch.uint8),
        "ids": torch.arange(6, dtype=torch.int64).view(2, 3),
        "empty": torch.zeros(0, 4),
        "strided": torch.arange(12.0).view(3, 4).t(),  # not contiguous
    }


def test_file_is_standard_safetensors_and_checksum_matches(tmp_path) -> None:
    tensors = sample()
    path = tmp_path / "x.safetensors"
    digest = write_safetensors(path, tensors, {"octlm": json.dumps({"k": 1})})
    assert digest == file_checksum(path)
    assert digest == "xxh3_128:" + xxhash.xxh3_128(path.read_bytes()).hexdigest()
    with safe_open(str(path), framework="pt") as f:
        assert json.loads(f.metadata()["octlm"]) == {"k": 1}
        assert set(f.keys()) == set(tensors)
        for name, t in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == t.dtype and torch.equal(got, t), name
    assert load(path.read_bytes()).keys() == tensors.keys()  # the reference parser agrees
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    assert (8 + header_len) % 8 == 0


def test_same_tensors_same_bytes(tmp_path) -> None:
    a = write_safetensors(tmp_path / "a", sample(), {})
    b = write_safetensors(tmp_path / "b", dict(reversed(list(sample().items()))), {})
    assert a == b  # order of the dict does not matter


def test_unsupported_dtype_is_refused(tmp_path) -> None:
    with pytest.raises(TypeError, match="complex"):
        write_safetensors(tmp_path / "c", {"z": torch.zeros(2, dtype=torch.complex64)}, {})
