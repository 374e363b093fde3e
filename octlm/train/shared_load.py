"""The run folder every rank shares: each must see rank 0's, and the checkpoint a resume starts
from is the same one on every rank, under FSDP read from disk by rank 0 alone.

Rank 0 writes a fresh token into the folder and sends it to the others; a rank that reads
another token (or none) is looking at another folder, e.g. a node where --out is not on the
shared file system, and would silently start afresh: it stops the run in one line instead.

Rank 0 picks the newest intact checkpoint (falling back past damaged ones) and tells the others
its name and checksum, so no rank can start from another step than its peers because it saw the
folder differently (a lagging network file system, a file damaged between two reads).

- DDP: every rank then reads that file itself; each needs every weight anyway, and a rank that
  cannot read it fails in one line that names the rank and the file.
- FSDP: only rank 0 reads it. The others receive its metadata and its small tensors (generator
  states, step counts) over the wire, and a shape-only `meta` placeholder for each weight and
  AdamW moment, which `distributed.load_full_state` fills by scattering rank 0's tensor shard by
  shard. So only rank 0 holds the whole state, the others one whole tensor at a time at most.

Nothing here changes what a rank ends up holding, only how it gets there: the bits a resumed run
computes are the same as when every rank read the file (tests/e2e/test_distributed.py).
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path
from typing import Any, NamedTuple

import torch

from octlm.errors import OctlmError, RankError
from octlm.fsutil import atomic_write_bytes
from octlm.train import checkpoint as ckpt
from octlm.train.distributed import DistInfo, agree, broadcast_json, broadcast_tensor


class Found(NamedTuple):
    """A checkpoint that passed its checks, as `load_newest_valid` found it."""

    path: Path
    checksum: str
    meta: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    notes: list[str]
    """One line for each newer listed file that was skipped (damaged)."""


def load_newest_valid(run_dir: Path) -> Found | None:
    """The newest listed checkpoint that passes its checks, with a note for each one skipped;
    None when nothing is listed. Raises when every listed file is damaged."""
    entries = ckpt.read_latest(run_dir)
    notes = []
    for entry in reversed(entries):
        path = run_dir / ckpt.CKPT_DIR / entry["file"]
        try:
            meta, tensors = ckpt.load_checkpoint(path, entry["checksum"])
        except ckpt.CheckpointError as exc:
            notes.append(f"{exc.problem}: falling back to the previous checkpoint")
            continue
        return Found(path, entry["checksum"], meta, tensors, notes)
    if entries:
        raise ckpt.CheckpointError(
            f"none of the {len(entries)} checkpoints in {run_dir / ckpt.CKPT_DIR} is intact",
            "start a new run in another --out (or delete that folder)",
        )
    return None


TOKEN_NAME = ".world"
"""The token rank 0 leaves in the run folder for the others to find (a few bytes, rewritten by
each start)."""


def check_shared_folder(out: Path, info: DistInfo, device: torch.device) -> None:
    """Every rank sees rank 0's run folder, or every rank stops (collective)."""
    if not info.enabled:
        return
    token = secrets.token_hex(16) if info.is_main else None
    if info.is_main:
        atomic_write_bytes(out / TOKEN_NAME, token.encode())  # type: ignore[union-attr]
    token = broadcast_json(token, info, device)
    try:
        seen = (out / TOKEN_NAME).read_text()
    except OSError:
        seen = None
    blind = seen != token
    if agree(blind, info, device):
        if blind:
            raise RankError(
                f"rank {info.rank} (on {socket.gethostname()}) does not see the run folder "
                f"{out} that rank 0 writes",
                "put --out on storage every node mounts at the same path (NFS, Lustre, ...)",
            )
        raise OctlmError(  # printed by rank 0; the blind rank says which it is
            f"another rank does not see the run folder {out}",
            "put --out on storage every node mounts at the same path (NFS, Lustre, ...)",
        )


def load_agreed(run_dir: Path, info: DistInfo, device: torch.device, fsdp: bool) -> Found | None:
    """The newest intact checkpoint of `run_dir` (collective with several ranks); None when the
    folder lists none. Under FSDP the other ranks' weights and moments are placeholders."""
    if not info.enabled:
        return load_newest_valid(run_dir)
    found, problem = None, None
    if info.is_main:
        try:
            found = load_newest_valid(run_dir)
        except ckpt.CheckpointError as exc:  # every rank must hear it, or they wait forever
            problem = [exc.problem, exc.fix]
    header: Any = broadcast_json(
        _header(found, problem, fsdp) if info.is_main else None, info, device
    )
    if header["error"]:
        raise ckpt.CheckpointError(*header["error"])
    if header["file"] is None:
        return None
    path = run_dir / ckpt.CKPT_DIR / header["file"]
    failed: RankError | None = None
    if info.is_main:
        assert found is not None
        meta, tensors = found.meta, found.tensors
    elif fsdp:
        meta, tensors = header["meta"], _placeholders(header["large"])
    else:
        meta, tensors = {}, {}
        try:
            meta, tensors = ckpt.load_checkpoint(path, header["checksum"])
        except ckpt.CheckpointError as exc:
            failed = RankError(f"rank {info.rank}: {exc.problem}", exc.fix)
    if agree(failed is not None, info, device):
        raise failed or ckpt.CheckpointError(  # printed by rank 0; the rank itself says why
            f"another rank could not read {path}", "make the run folder readable on every node"
        )
    if fsdp:  # sorted names: every rank sends and receives in the same order
        for name, (dtype, shape) in sorted(header["small"].items()):
            held = tensors[name] if info.is_main else torch.empty(shape, dtype=_dtype(dtype))
            tensors[name] = broadcast_tensor(held, info, device)
    return Found(path, header["checksum"], meta, tensors, header["notes"])


def _header(found: Found | None, problem: list[str] | None, fsdp: bool) -> dict[str, Any]:
    """What rank 0 tells the others: the file chosen (or the error), and under FSDP what they
    need to rebuild the state without reading it."""
    header: dict[str, Any] = {"error": problem, "file": None}
    if found is None:
        return header
    header.update(file=found.path.name, checksum=found.checksum, notes=found.notes)
    if fsdp:
        specs = {
            k: [str(v.dtype).removeprefix("torch."), list(v.shape)]
            for k, v in found.tensors.items()
        }
        header["meta"] = found.meta
        header["large"] = {k: v for k, v in specs.items() if _sharded(k, found.tensors[k])}
        header["small"] = {k: v for k, v in specs.items() if k not in header["large"]}
    return header


def _sharded(name: str, tensor: torch.Tensor) -> bool:
    """Weights and moments: scattered by `load_full_state`. Not the 0-dim step counts (every
    rank keeps them whole) nor the generator states (broadcast)."""
    return name.startswith((ckpt.MODEL_PREFIX, ckpt.OPTIM_PREFIX)) and tensor.dim() > 0


def _placeholders(specs: dict[str, list]) -> dict[str, torch.Tensor]:
    return {
        k: torch.empty(shape, dtype=_dtype(dtype), device="meta")
        for k, (dtype, shape) in specs.items()
    }


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ckpt.CheckpointError(f"rank 0 sent an unknown tensor type {name!r}", "upgrade octlm")
    return dtype
