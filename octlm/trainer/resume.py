"""The checkpoint a resume starts from: found once, agreed by every rank, and the one source of
every decision a resume makes.

`build_run` calls `find_agreed` right after the ranks have checked that they share the run
folder, before anything is built. Its answer feeds, in order, the settings that must match the
checkpoint before any part is built (`settle`: defaults that changed after the run began, the
accumulation under another process count), `plan_init` (a resume takes the shape from the
checkpoint, not from the `--init-from` source, and checks a `--model` flag against it), and
finally `Run.load_state_dict`. So the plan and the state always come from the same file, even
when the newest one is damaged and an older one, written with other settings, is used instead
(tests/e2e/test_distributed.py,
`test_a_damaged_newest_checkpoint_of_another_world_resumes_with_the_older_ones_settings`).

Rank 0 picks the newest intact checkpoint (falling back past damaged ones, with a note each)
and tells the others its name and checksum, so no rank can start from another step than its
peers because it saw the folder differently (a lagging network file system, a file damaged
between two reads).

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

from pathlib import Path
from typing import Any, NamedTuple

import torch

from octlm.config.learning import fused_or_default
from octlm.config.run import reduction_or_default
from octlm.config.train import TrainConfig
from octlm.device import fast_bf16_products
from octlm.errors import RankError, ResumeError
from octlm.trainer import checkpoint as ckpt
from octlm.trainer.distributed import DistInfo, agree, broadcast_json, broadcast_tensor
from octlm.trainer.init_from import read_source
from octlm.trainer.source_identity import other_source, source_folder


class Found(NamedTuple):
    """A checkpoint that passed its checks, as `load_newest_valid` found it."""

    info: ckpt.CheckpointInfo
    checksum: str
    tensors: dict[str, torch.Tensor]
    notes: list[str]
    """One line for each newer listed file that was skipped (damaged)."""

    @property
    def path(self) -> Path:
        return self.info.path


def load_newest_valid(run_dir: Path) -> Found | None:
    """The newest listed checkpoint that passes its checks, with a note for each one skipped;
    None when nothing is listed. Raises when every listed file is damaged."""
    entries = ckpt.read_latest(run_dir)
    notes = []
    for entry in reversed(entries):
        path = run_dir / ckpt.CKPT_DIR / entry["file"]
        try:
            info, tensors = ckpt.load_checkpoint(path, entry["checksum"])
        except ckpt.CheckpointError as exc:
            notes.append(f"{exc.problem}: falling back to the previous checkpoint")
            continue
        return Found(info, entry["checksum"], tensors, notes)
    if entries:
        raise ckpt.CheckpointError(
            f"none of the {len(entries)} checkpoints in {run_dir / ckpt.CKPT_DIR} is intact",
            "start a new run in another --out (or delete that folder)",
        )
    return None


def find_agreed(run_dir: Path, info: DistInfo, device: torch.device, fsdp: bool) -> Found | None:
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
    read: tuple[ckpt.CheckpointInfo, dict[str, torch.Tensor]] | None = None
    if info.is_main:
        assert found is not None
        read = found.info, found.tensors
    elif fsdp:
        read = ckpt.parse_info(path, header["meta"]), _placeholders(header["large"])
    else:
        try:
            read = ckpt.load_checkpoint(path, header["checksum"])
        except ckpt.CheckpointError as exc:
            failed = RankError(f"rank {info.rank}: {exc.problem}", exc.fix)
    if agree(failed is not None, info, device):
        raise failed or ckpt.CheckpointError(  # printed by rank 0; the rank itself says why
            f"another rank could not read {path}", "make the run folder readable on every node"
        )
    assert read is not None
    checkpoint, tensors = read
    if fsdp:  # sorted names: every rank sends and receives in the same order
        for name, (dtype, shape) in sorted(header["small"].items()):
            held = tensors[name] if info.is_main else torch.empty(shape, dtype=_dtype(dtype))
            tensors[name] = broadcast_tensor(held, info, device)
    return Found(checkpoint, header["checksum"], tensors, header["notes"])


def settle(
    cfg: TrainConfig, resumed: ckpt.CheckpointInfo | None, info: DistInfo, device: torch.device
) -> tuple[TrainConfig, list[str]]:
    """`cfg` settled for the checkpoint it resumes (`resumed`; None for a new run), and the
    notes. Decided before any part is built, so every part sees the settings it runs with."""
    # Every rank's Muon must take the same products: bf16 only if each device is fast at it.
    fast_bf16 = cfg.optim.muon_ns_dtype == "fast" and not agree(
        not fast_bf16_products(device), info, device
    )
    cfg = settled_ns_dtype(settled_defaults(cfg, resumed), resumed, fast_bf16)
    return elastic_config(settled_init_from(cfg, resumed), info.world, resumed)


def settled_defaults(cfg: TrainConfig, resumed: ckpt.CheckpointInfo | None) -> TrainConfig:
    """Settings left unset whose default changed after runs existed: a resume takes the
    checkpoint's value, so an older run folder resumes on the numbers it started with; a new
    run takes today's default."""
    if cfg.optim.fused is None:
        saved = resumed.trajectory.get("fused") if resumed is not None else None
        cfg = cfg.replace(fused=fused_or_default(saved))
    if cfg.hardware.reduction is None:
        saved = resumed.trajectory.get("reduction", "collective") if resumed else None
        cfg = cfg.replace(reduction=reduction_or_default(saved))
    return cfg


def settled_init_from(cfg: TrainConfig, resumed: ckpt.CheckpointInfo | None) -> TrainConfig:
    """A resume's --init-from as the run recorded it when it names the same source, however
    typed (a path relative to another working folder, or the source copied elsewhere), so the
    fingerprint compares the run and not the spelling; another source is refused in one line
    with both sides in full (unless --allow-config-change takes it)."""
    typed, record = cfg.run.init_from, resumed.init_from if resumed is not None else None
    if typed is None or not record or "file" not in record or cfg.run.allow_config_change:
        return cfg
    file = record["file"]
    other = other_source(typed, record.get("path"), file, record.get("weights_sha256"), _sha256)
    if other is not None:
        raise ResumeError(
            f"the run in {cfg.run.out} started from --init-from {other}",
            f"resume with --init-from {source_folder(file)}, or start a new run in another --out",
        )
    return cfg.replace(init_from=record.get("path", typed))


def _sha256(source: str) -> str:
    return read_source(source).record["weights_sha256"]


def settled_ns_dtype(
    cfg: TrainConfig, resumed: ckpt.CheckpointInfo | None, fast_bf16: bool
) -> TrainConfig:
    """--muon-ns-dtype fast as the dtype it means here: bf16 where the devices multiply it
    fast, else fp32. A resume takes the checkpoint's, so a run continues on the products it
    started with on any machine (an older run's "auto" is absent there: the fingerprint check
    then refuses the change)."""
    if cfg.optim.muon_ns_dtype != "fast":
        return cfg
    saved = resumed.trajectory.get("muon_ns_dtype") if resumed is not None else None
    if saved in ("fp32", "bf16"):
        return cfg.replace(muon_ns_dtype=saved)
    return cfg.replace(muon_ns_dtype="bf16" if fast_bf16 else "fp32")


def elastic_config(
    cfg: TrainConfig, world: int, resumed: ckpt.CheckpointInfo | None
) -> tuple[TrainConfig, list[str]]:
    """Resuming with another process count: keep the global batch by adjusting accumulation."""
    if resumed is None or resumed.world == world:
        return cfg, []
    total = resumed.trajectory["accum"]  # micro-batches per step over all ranks
    if total % world:
        raise ResumeError(
            f"the checkpoint's {total} micro-batches per step do not split over {world} processes",
            "resume with a process count that divides it",
        )
    how = (
        "and the tree reduction sums in the same order: bitwise"
        if cfg.hardware.reduction == "tree"
        else "but sums run in another order (not bitwise: --reduction collective)"
    )
    note = (
        f"checkpoint written by {resumed.world} process(es), resumed by {world}: "
        f"--accum set to {total // world} to keep the global batch; the data order continues, "
        + how
    )
    return cfg.replace(accum=total // world), [note]


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
        header["meta"] = found.info.as_written()
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
