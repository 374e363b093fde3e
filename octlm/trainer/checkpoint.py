"""Checkpoints: the format (this module owns it), and one safetensors file per save, atomic.

Tensors (weights, AdamW moments, RNG byte states) are safetensors entries; everything else
(step, counters, param-group settings, Python/NumPy RNG states, fingerprints, config, build)
is JSON in the file's metadata, so loading can never run code. `checkpoints/latest.json` lists
the files newest last with their checksum ("xxh3_128:HEX"; lists written by octlm 0.1 give a
"sha256"), which is checked on load.

A run hands `pack` its state as a `RunState` (each part's `state_dict()` under a constant key)
and gets it back from `unpack`, in the v1 layout of octlm 0.1: every run folder since resumes.
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from octlm.config.train import default_values
from octlm.errors import OctlmError
from octlm.fsutil import atomic_write, atomic_write_bytes
from octlm.hashing import checksum_algo, checksum_matches
from octlm.trainer.stwriter import write_safetensors

FORMAT = "octlm-checkpoint"
FORMAT_VERSION = 1
CKPT_DIR = "checkpoints"
SNAPSHOT_DIR = "snapshots"
WEIGHTS_FILE = "model.safetensors"  # a folder's weights-only snapshot: an export's, a merge's
MERGE_RECORD = "merge.json"  # beside it in `octlm merge`'s folder, which is not a run to train
RL_RECORD = "rl.json"  # in an `octlm rl` run's folder: continued by `octlm rl --resume` only
LATEST = "latest.json"
KEEP_LAST = 2  # the previous file survives until a newer one is complete and listed
# bench/chaos.py's faults: seconds to pause after the temporary file and after the rename.
_SAVE_PAUSE = float(os.environ.get("OCTLM_CHAOS_SAVE_PAUSE", "0") or 0)


class CheckpointError(OctlmError):
    """A missing, corrupt or incompatible checkpoint."""


# -- the format: part keys, tensor prefixes, metadata -----------------------------------------
MODEL, OPTIMIZER, SCALER, TRAIN_STATE, SAMPLER, RNG = ("model", "optimizer", "scaler", "train_state", "sampler", "rng")  # noqa: E501  # fmt: skip
MODEL_PREFIX, OPTIM_PREFIX = "model.", "optim."
SNAPSHOT_FORMAT = "octlm-snapshot"


class RunIdentity(TypedDict):
    """What a run is, beside its state: checked on resume, copied into snapshots and the log
    header. Both `RunState` and `CheckpointMeta` hold these keys."""

    fingerprints: dict[str, str]
    trajectory: dict[str, Any]
    config: dict[str, Any]
    model_config: dict[str, Any]
    data_dir: str
    build: dict[str, Any]
    world: int
    init_from: dict[str, Any] | None


# The order `pack` writes them in a file's metadata: reordering the fields changes its bytes.
IDENTITY_KEYS = tuple(RunIdentity.__annotations__)
OPTIONAL_KEYS = ("init_from",)  # written only when set: other runs' files keep the v1 layout


def rng_prefix(rank: int) -> str:
    """Rank 0's generator tensors are `rng.*` (as a single process writes them), rank r's
    `rng{r}.*`; their JSON parts are `rng` and `rng_ranks[r - 1]`."""
    return "rng." if rank == 0 else f"rng{rank}."


class RunState(RunIdentity):
    """A run's whole state as its parts give it (`part.state_dict()`), tensors included."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    """The full (unsharded), index-keyed `torch.optim` state dict."""
    scaler: dict[str, Any] | None
    train_state: dict[str, Any]
    sampler: dict[str, Any]
    rng: list[dict[str, Any]]
    """Every rank's generators, in rank order."""


class CheckpointMeta(RunIdentity, total=False):
    """The JSON metadata of a v1 checkpoint file (`format*` are added when it is written):
    RunState's keys with the tensors taken out, rank 0's generators under `rng`. Files written
    before `world` existed lack it, and `init_from` is there only when set."""

    train_state: dict[str, Any]
    sampler: dict[str, Any]
    optimizer: dict[str, Any]
    """{"param_groups": [...], "scalars": {index: {key: non-tensor value}}}"""
    scaler: dict[str, Any] | None
    rng: dict[str, Any]
    rng_ranks: list[dict[str, Any]]
    format: str
    format_version: int


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint (or snapshot) file says about its run, parsed once (`parse_info`) for
    every reader, the defaults of files written before a key existed applied. The metadata as
    written stays private to this module's readers (`run_state`, `snapshot_header`)."""

    path: Path
    step: int
    world: int
    model_config: dict[str, Any] | None
    config: dict[str, Any] | None
    """The run's settings (None in a snapshot); keys added since the file was written take
    their default, which is what such runs did (new settings join off their default)."""
    trajectory: dict[str, Any]
    fingerprints: dict[str, str]
    data_dir: str | None
    init_from: dict[str, Any] | None
    merged_from: tuple[Path, ...]
    """The files `octlm merge` averaged into it, oldest first; () when it is not a merge."""
    _meta: dict[str, Any] = field(repr=False)

    def as_written(self) -> dict[str, Any]:
        """A copy of the metadata as written: `octlm.load`'s `meta`, which users index by key."""
        return copy.deepcopy(self._meta)

    def run_state(self, tensors: dict[str, torch.Tensor]) -> RunState:
        """The run state the file holds, with its `tensors` (`unpack`)."""
        return unpack(self._meta, tensors)  # type: ignore[arg-type]

    def snapshot_header(self) -> dict[str, Any]:
        """The metadata of a weights-only snapshot of the file's model (`snapshot_header`)."""
        return snapshot_header(self._meta)


def parse_info(path: Path, meta: dict[str, Any]) -> CheckpointInfo:
    """The typed view of the metadata `meta` read from `path` (checked by `load_checkpoint`)."""
    saved, shape = meta.get("config"), meta.get("model_config")
    try:
        return CheckpointInfo(
            path=path,
            step=int((meta.get(TRAIN_STATE) or {}).get("step", 0)),
            world=int(meta.get("world", 1)),  # written before multi-process runs: one
            model_config=shape if isinstance(shape, dict) else None,
            config={**default_values(), **saved} if isinstance(saved, dict) else None,
            trajectory=dict(meta.get("trajectory") or {}),
            fingerprints=dict(meta.get("fingerprints") or {}),
            data_dir=meta.get("data_dir"),
            init_from=meta.get("init_from"),
            merged_from=tuple(Path(part["file"]) for part in meta.get("merged_from") or []),
            _meta=meta,
        )
    except (AttributeError, KeyError, TypeError, ValueError):  # hand-made or damaged values
        raise CheckpointError(f"{path} has corrupt octlm metadata", "use another file") from None


def flatten(tree: dict[str, Any], prefix: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Split nested state into (JSON part, tensors): a tensor at path a/b becomes the entry
    `{prefix}a.b` (detached, contiguous), everything else stays in the JSON part under its
    path; dicts that held only tensors are left out of the JSON part."""
    json_part: dict[str, Any] = {}
    tensors: dict[str, torch.Tensor] = {}
    for key, value in tree.items():
        if isinstance(value, torch.Tensor):
            tensors[f"{prefix}{key}"] = value.detach().contiguous()
        elif isinstance(value, dict):
            sub_json, sub_tensors = flatten(value, f"{prefix}{key}.")
            tensors.update(sub_tensors)
            if sub_json:
                json_part[str(key)] = sub_json
        else:
            json_part[str(key)] = value
    return json_part, tensors


def unflatten(
    json_part: dict[str, Any], tensors: dict[str, torch.Tensor], prefix: str, depth: int = 1
) -> dict[str, Any]:
    """The inverse of `flatten` for trees `depth` levels deep (names below that level may hold
    dots of their own, as parameter names do)."""
    tree: dict[str, Any] = {}
    for name, tensor in split_tensors(tensors, prefix).items():
        *path, leaf = name.split(".", depth - 1)
        node = tree
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = tensor
    _merge(tree, json_part)
    return tree


def _merge(into: dict[str, Any], json_part: dict[str, Any]) -> None:
    for key, value in json_part.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def optimizer_to_flat(
    optimizer: torch.optim.Optimizer | dict[str, Any],
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(JSON part, `optim.*` tensors) of an optimizer or of its index-keyed state dict: the
    per-parameter tensors are entries `optim.{index}.{key}`, the non-tensor values "scalars"."""
    sd = optimizer if isinstance(optimizer, dict) else optimizer.state_dict()
    scalars, tensors = flatten(sd["state"], OPTIM_PREFIX)
    groups = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in g.items()}
        for g in sd["param_groups"]
    ]
    return {"param_groups": groups, "scalars": scalars}, tensors


def optimizer_from_flat(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The index-keyed state dict from `optimizer_to_flat`'s parts (tensors without `optim.`)."""
    state = unflatten(meta["scalars"], tensors, "", depth=2)
    groups = [
        {k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]
    ]
    return {"state": {int(i): s for i, s in state.items()}, "param_groups": groups}


def pack(state: RunState) -> tuple[CheckpointMeta, dict[str, torch.Tensor]]:
    """(metadata, tensors) of a run's state in the v1 layout. The tensors are the live ones
    (weights, AdamW moments): `host_copy` them before anything may step on."""
    tensors = {f"{MODEL_PREFIX}{k}": v.detach().contiguous() for k, v in state[MODEL].items()}
    optim_meta, optim_tensors = optimizer_to_flat(state[OPTIMIZER])
    tensors.update(optim_tensors)
    rng_json = []
    for rank, generators in enumerate(state[RNG]):
        part, rng_tensors = flatten(generators, rng_prefix(rank))
        rng_json.append(part)
        tensors.update(rng_tensors)
    meta: CheckpointMeta = {
        TRAIN_STATE: state[TRAIN_STATE],
        SAMPLER: state[SAMPLER],
        OPTIMIZER: optim_meta,
        SCALER: state[SCALER],
        RNG: rng_json[0],
        **{k: state[k] for k in IDENTITY_KEYS if k not in OPTIONAL_KEYS or state[k] is not None},
        "rng_ranks": rng_json[1:],
    }
    return meta, tensors


def unpack(meta: CheckpointMeta, tensors: dict[str, torch.Tensor]) -> RunState:
    """The run state a checkpoint holds (the inverse of `pack`)."""
    world = meta.get("world", 1)
    rng_json = [meta[RNG], *meta.get("rng_ranks", [])]
    return {
        MODEL: split_tensors(tensors, MODEL_PREFIX),
        OPTIMIZER: optimizer_from_flat(meta[OPTIMIZER], optimizer_tensors(tensors)),
        SCALER: meta[SCALER],
        TRAIN_STATE: meta[TRAIN_STATE],
        SAMPLER: meta[SAMPLER],
        RNG: [unflatten(rng_json[r], tensors, rng_prefix(r)) for r in range(world)],
        **{key: meta.get(key, 1 if key == "world" else None) for key in IDENTITY_KEYS},
    }  # type: ignore[return-value]


def host_copy(
    meta: CheckpointMeta, tensors: dict[str, torch.Tensor]
) -> tuple[CheckpointMeta, dict[str, torch.Tensor]]:
    """A private copy that later steps cannot change: host tensors, and metadata that shares no
    object with the run (also fails here, not in a writer thread, if it is not JSON)."""
    host = {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}
    return json.loads(json.dumps(meta)), host


def snapshot_header(meta: dict[str, Any]) -> dict[str, Any]:
    """The metadata of a weights-only snapshot (or export) of a checkpoint's model."""
    return {
        "format": SNAPSHOT_FORMAT,
        "format_version": FORMAT_VERSION,
        TRAIN_STATE: meta.get(TRAIN_STATE),
        "model_config": meta.get("model_config"),
        "fingerprints": meta.get("fingerprints"),
        "data_dir": meta.get("data_dir"),
    }


def model_weights(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's weights in a checkpoint's tensors; a snapshot or export stores them bare."""
    return split_tensors(tensors, MODEL_PREFIX) or tensors


def optimizer_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The optimizer's tensors (AdamW moments and step counts) in a checkpoint's tensors."""
    return split_tensors(tensors, OPTIM_PREFIX)


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
        if (target / WEIGHTS_FILE).is_file():
            return target / WEIGHTS_FILE, None
        raise CheckpointError(f"{target} holds no checkpoint", "train it first, or name a file")
    raise CheckpointError(f"{target} does not exist", "name a run folder or a checkpoint file")


def load_checkpoint(
    path: Path, checksum: str | None
) -> tuple[CheckpointInfo, dict[str, torch.Tensor]]:
    """(what it says, tensors) of a checkpoint or snapshot, after checking its checksum
    ("ALGO:HEX", as latest.json lists it; None: no check) and format version."""
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
    if meta.get("format") not in (FORMAT, SNAPSHOT_FORMAT):
        raise CheckpointError(f"{path} is not an octlm checkpoint", "name an octlm checkpoint")
    version = meta.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format version {meta.get('format_version')}, newer than this octlm's "
            f"{FORMAT_VERSION}",
            "upgrade octlm",
        )
    return parse_info(path, meta), tensors


def split_tensors(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    n = len(prefix)
    return {k[n:]: v for k, v in tensors.items() if k.startswith(prefix)}
