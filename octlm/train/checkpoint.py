"""Checkpoints: one safetensors file per save, no pickle anywhere, written atomically.

Tensors (weights, AdamW moments, RNG byte states) are safetensors entries; everything else
(step, counters, param-group settings, Python/NumPy RNG states, fingerprints, config, build)
is JSON in the file's metadata, so loading can never run code. `checkpoints/latest.json` lists
the files newest last with their checksum ("xxh3_128:HEX"; lists written by octlm 0.1 give a
"sha256"), which is checked on load.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from octlm.errors import OctlmError
from octlm.fsutil import atomic_write, atomic_write_bytes
from octlm.hashing import checksum_algo, checksum_matches
from octlm.train.stwriter import write_safetensors

FORMAT = "octlm-checkpoint"
FORMAT_VERSION = 1
CKPT_DIR = "checkpoints"
SNAPSHOT_DIR = "snapshots"
LATEST = "latest.json"
KEEP_LAST = 2  # the previous file survives until a newer one is complete and listed
# Fault-injection point for bench/chaos.py: seconds to pause inside each save (after the
# temporary file is written, and again after the rename), so SIGKILLs land mid-save.
_SAVE_PAUSE = float(os.environ.get("OCTLM_CHAOS_SAVE_PAUSE", "0") or 0)


class CheckpointError(OctlmError):
    """A missing, corrupt or incompatible checkpoint."""


def build_info(device: torch.device) -> dict[str, Any]:
    """What PyTorch's bitwise promise depends on: release, platform, device, threads."""
    cuda = device.type == "cuda"
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu:{platform.machine()}",
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }


def optimizer_to_flat(
    optimizer: torch.optim.Optimizer | dict,
) -> tuple[dict, dict[str, torch.Tensor]]:
    """(JSON part, tensors) of an optimizer or of its index-keyed state_dict."""
    sd = optimizer if isinstance(optimizer, dict) else optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):  # the live tensor: copy it to keep it
                tensors[f"optim.{idx}.{key}"] = value.detach().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    groups = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in g.items()}
        for g in sd["param_groups"]
    ]
    return {"param_groups": groups, "scalars": scalars}, tensors


def optimizer_from_flat(meta: dict, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        idx, key = name.split(".", 1)  # "optim." was stripped by split_tensors
        state.setdefault(int(idx), {})[key] = value
    for idx, scalars in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(scalars)
    groups = [
        {k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]
    ]
    return {"state": state, "param_groups": groups}


def save_checkpoint(
    run_dir: Path,
    step: int,
    meta: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    keep_last: int = KEEP_LAST,
) -> Path:
    """Write `checkpoints/step_NNNNNN.safetensors` atomically, list it, drop the oldest."""
    folder = run_dir / CKPT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:06d}.safetensors"
    header = {**meta, "format": FORMAT, "format_version": FORMAT_VERSION}

    digest: dict[str, str] = {}

    def write(tmp: Path) -> None:
        digest["checksum"] = write_safetensors(tmp, tensors, {"octlm": json.dumps(header)})
        if _SAVE_PAUSE:
            time.sleep(_SAVE_PAUSE)

    atomic_write(path, write)
    if _SAVE_PAUSE:
        time.sleep(_SAVE_PAUSE)
    entries = [e for e in read_latest(run_dir) if e["file"] != path.name]
    entries.append({"file": path.name, "step": step, "checksum": digest["checksum"]})
    keep, drop = entries[-keep_last:], entries[:-keep_last]
    atomic_write_bytes(folder / LATEST, json.dumps({"checkpoints": keep}, indent=2).encode())
    for entry in drop:  # only after the new list is durable
        (folder / entry["file"]).unlink(missing_ok=True)
    return path


def save_snapshot(
    run_dir: Path, step: int, model_tensors: dict[str, torch.Tensor], meta: dict
) -> Path:
    folder = run_dir / SNAPSHOT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:06d}.safetensors"
    atomic_write(
        path, lambda tmp: save_file(model_tensors, str(tmp), metadata={"octlm": json.dumps(meta)})
    )
    return path


def read_latest(run_dir: Path) -> list[dict[str, Any]]:
    """The listed checkpoints, oldest first, each with "file", "step" and "checksum"."""
    path = run_dir / CKPT_DIR / LATEST
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text())["checkpoints"]
        for e in entries:
            if "checksum" not in e:  # a list written by octlm 0.1
                e["checksum"] = f"sha256:{e['sha256']}"
        return entries
    except (json.JSONDecodeError, KeyError, TypeError):
        raise CheckpointError(
            f"{path} is corrupt", f"delete it to start {run_dir} afresh"
        ) from None


def load_newest_valid(
    run_dir: Path,
) -> tuple[Path, dict[str, Any], dict[str, torch.Tensor], list[str]] | None:
    """The newest listed checkpoint that passes its checks, with a note for each one skipped;
    None when nothing is listed. Raises when every listed file is damaged."""
    entries = read_latest(run_dir)
    notes = []
    for entry in reversed(entries):
        path = run_dir / CKPT_DIR / entry["file"]
        try:
            meta, tensors = load_checkpoint(path, entry["checksum"])
        except CheckpointError as exc:
            notes.append(f"{exc.problem}: falling back to the previous checkpoint")
            continue
        return path, meta, tensors, notes
    if entries:
        raise CheckpointError(
            f"none of the {len(entries)} checkpoints in {run_dir / CKPT_DIR} is intact",
            "start a new run in another --out (or delete that folder)",
        )
    return None


def peek_newest_meta(run_dir: Path) -> dict[str, Any] | None:
    """The newest listed checkpoint's metadata (no tensors, no checks): to plan a resume."""
    for entry in reversed(read_latest(run_dir)):
        try:
            with safe_open(str(run_dir / CKPT_DIR / entry["file"]), framework="pt") as f:
                return json.loads((f.metadata() or {})["octlm"])
        except Exception:  # damaged: the real load will say so and fall back
            continue
    return None


def remove_stale_temps(run_dir: Path) -> None:
    """Temporary files left by a process killed mid-save: never listed, safe to delete."""
    for folder in (run_dir / CKPT_DIR, run_dir / SNAPSHOT_DIR):
        if folder.is_dir():
            for tmp in folder.glob(".*.tmp-*"):
                tmp.unlink(missing_ok=True)


def find_checkpoint(run_or_ckpt: str | Path) -> tuple[Path, str | None]:
    """(file, expected checksum or None) for a run folder (its newest checkpoint) or a file."""
    target = Path(run_or_ckpt)
    if target.is_file():
        if target.parent.name != CKPT_DIR:
            return target, None  # a snapshot or a copied file: no list vouches for it
        listed = {e["file"]: e["checksum"] for e in read_latest(target.parent.parent)}
        return target, listed.get(target.name)
    if target.is_dir():
        entries = read_latest(target)
        if entries:
            return target / CKPT_DIR / entries[-1]["file"], entries[-1]["checksum"]
        raise CheckpointError(f"{target} holds no checkpoint", "train it first, or name a file")
    raise CheckpointError(f"{target} does not exist", "name a run folder or a checkpoint file")


def load_checkpoint(
    path: Path, checksum: str | None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(metadata, tensors) of a checkpoint, after checking its checksum ("ALGO:HEX", as
    latest.json lists it; None: no check) and format version."""
    if not path.is_file():  # e.g. listed in latest.json but deleted: no raw FileNotFoundError
        raise CheckpointError(f"checkpoint {path} does not exist", "name an existing file")
    if checksum is not None and not checksum_matches(path, checksum):
        raise CheckpointError(
            f"checkpoint {path} fails its {checksum_algo(checksum)} checksum",
            "it is corrupt; delete it",
        )
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            raw = (f.metadata() or {}).get("octlm")
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except Exception as exc:  # safetensors raises its own error types for bad headers
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({exc})", "use another file"
        ) from None
    if raw is None:
        raise CheckpointError(f"{path} has no octlm metadata", "name an octlm checkpoint")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError:
        meta = None
    if not isinstance(meta, dict):  # hand-made or damaged metadata, not a raw exception
        raise CheckpointError(f"{path} has corrupt octlm metadata", "use another file")
    if meta.get("format") not in (FORMAT, "octlm-snapshot"):
        raise CheckpointError(f"{path} is not an octlm checkpoint", "name an octlm checkpoint")
    version = meta.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format version {meta.get('format_version')}, newer than this octlm's "
            f"{FORMAT_VERSION}",
            "upgrade octlm",
        )
    return meta, tensors


def split_tensors(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    n = len(prefix)
    return {k[n:]: v for k, v in tensors.items() if k.startswith(prefix)}
