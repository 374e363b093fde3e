"""A streaming safetensors writer that checksums the file as it writes it.

safetensors' own `save_file` gives no checksum, so the file would have to be read back to hash
it (a second full pass). Here every tensor's bytes are fed to the checksum (xxh3-128, about
27 GB/s, so ~10 ms for a 264 MB checkpoint) just before they go to the file. The output is a
standard safetensors file: an 8-byte little-endian header length, a JSON header padded to 8
bytes, then the raw tensors.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from octlm.hashing import CHECKSUM_ALGO, new_checksum

DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(
    path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> str:
    """Write `tensors` (CPU or not) and `metadata` to `path`; return its "ALGO:HEX" checksum."""
    names = sorted(tensors)  # a fixed order: the same tensors always give the same bytes
    blobs, header, offset = [], {}, 0
    for name in names:
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in DTYPES:
            raise TypeError(f"tensor {name} has dtype {t.dtype}, which safetensors cannot hold")
        raw = t.reshape(-1).view(torch.uint8).numpy()  # no copy for a contiguous CPU tensor
        header[name] = {
            "dtype": DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + raw.nbytes],
        }
        blobs.append(raw)
        offset += raw.nbytes
    header["__metadata__"] = metadata
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    digest = new_checksum(CHECKSUM_ALGO)
    with open(path, "wb") as f:
        for chunk in (struct.pack("<Q", len(head)) + head, *blobs):
            digest.update(chunk)
            f.write(chunk)
    return f"{CHECKSUM_ALGO}:{digest.hexdigest()}"
