"""Fingerprints: sha256 over canonical bytes, so equal content gives equal hex everywhere.

Used for the tokenizer file, shards, the dataset manifest, configs and model weights. The
per-tensor digests of `--hash-tensors` are xxh3-64 (`tensor_digests`): 16 hex characters a
tensor, to tell which tensor two runs disagree on, not to prove a file intact. A
checkpoint file's integrity checksum is xxh3-128 instead (`file_checksum`): it only has to
catch damage, not tampering, and it runs at memory speed (27 GB/s here against sha256's 1.9),
so checking a file on load or hashing it while it is written costs almost nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import xxhash

_CHUNK = 1 << 20
CHECKSUM_ALGO = "xxh3_128"  # checksums are written as "ALGO:HEX"
_ALGOS = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the same object always gives the same bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode("ascii")).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def new_checksum(algo: str = CHECKSUM_ALGO) -> Any:
    """An incremental hasher (`update`, `hexdigest`) for a checksum algorithm octlm knows."""
    if algo not in _ALGOS:
        raise ValueError(f"unknown checksum algorithm {algo!r} (known: {', '.join(_ALGOS)})")
    return _ALGOS[algo]()


def checksum_algo(checksum: str) -> str:
    """The algorithm of an "ALGO:HEX" checksum; a bare hex string is a sha256 (octlm <= 0.1)."""
    return checksum.split(":", 1)[0] if ":" in checksum else "sha256"


def file_checksum(path: str | Path, algo: str = CHECKSUM_ALGO) -> str:
    """ "ALGO:HEX" of a file's bytes."""
    digest = new_checksum(algo)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return f"{algo}:{digest.hexdigest()}"


def checksum_matches(path: str | Path, checksum: str) -> bool:
    algo = checksum_algo(checksum)
    want = checksum.split(":", 1)[-1]
    return file_checksum(path, algo) == f"{algo}:{want}"


def _tensor_bytes(name: str, tensor: Any) -> tuple[bytes, bytes]:
    """The header (name, dtype, shape) and raw bytes a tensor is hashed over, on any device."""
    import torch  # local: hashing is also used by code that never touches torch

    t = tensor.detach().to("cpu").contiguous()
    head = f"{name}|{t.dtype}|{tuple(t.shape)}|".encode()
    return head, t.reshape(-1).view(torch.uint8).numpy().tobytes()


def weights_sha256(state_dict: dict[str, Any]) -> str:
    """sha256 over every tensor in name order: name, dtype, shape, then the raw bytes.

    Two models hash equal exactly when every weight is bitwise equal, on any device.
    """
    import torch  # local, as in _tensor_bytes

    digest = hashlib.sha256()
    for name in sorted(state_dict):
        if isinstance(state_dict[name], torch.Tensor):
            for part in _tensor_bytes(name, state_dict[name]):
                digest.update(part)
    return digest.hexdigest()


def tensor_digests(named: Iterable[tuple[str, Any]]) -> dict[str, str]:
    """{name: xxh3-64 hex of name, dtype, shape and bytes} in the order given (16 characters
    each): equal exactly when the tensors are bitwise equal, up to a 2**-64 chance."""
    digests = {}
    for name, tensor in named:
        digest = xxhash.xxh3_64()
        for part in _tensor_bytes(name, tensor):
            digest.update(part)
        digests[name] = digest.hexdigest()
    return digests
