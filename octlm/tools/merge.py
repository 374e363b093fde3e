"""`octlm merge`: the float32 mean of a run's last checkpoints (or of named ones), written as a
folder that `octlm eval`, `generate`, `hash`, `export` and `--init-from` read like a run.

Averaging the last checkpoints of a run's stable phase is a free gain users of a WSD schedule
take (Megatron's checkpoint merging). The folder holds `model.safetensors` (a weights-only
snapshot, as `octlm export --format safetensors` writes) and `merge.json`, which names each
source file, its step and weight, and the merged weights' hash.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from octlm.config import checks
from octlm.config.checks import shown, shown_path
from octlm.errors import OctlmError
from octlm.fsutil import atomic_write, atomic_write_bytes
from octlm.hashing import weights_sha256
from octlm.prepare.folder import staged
from octlm.tools.outputs import check_finite, check_folder_out
from octlm.trainer import checkpoint as ckpt

WEIGHT = checks.Number(1e-6, 1e6)
"""Weights are relative (the sum divides them): [1e-6, 1e6] spans every mixture a float32 mean
can hold, and keeps each `tensor * weight` and their sum float32 numbers (1e308 twice is inf,
1e-320 is 0 in float32, and 0 / 0 is NaN)."""
MIN_SHARE = 1e-6
"""A weight under this share of the largest adds less than float32's ~7 significant digits
resolve: its checkpoint would vanish from the sum."""


def last_checkpoints(run: Path, last: int) -> list[tuple[Path, str | None]]:
    """(file, listed checksum) of the `last` newest steps a run keeps, oldest first: its listed
    checkpoints and its snapshots (--keep-ckpts), one file per step."""
    if not run.is_dir():
        raise OctlmError(f"{shown_path(run)} is not a run folder", "name a run folder with --last")
    by_step: dict[int, tuple[Path, str | None]] = {}
    for path in sorted((run / ckpt.SNAPSHOT_DIR).glob("step_*.safetensors")):
        by_step[int(path.stem.removeprefix("step_"))] = (path, None)
    for entry in ckpt.read_latest(run):  # listed files carry a checksum: they win
        by_step[entry["step"]] = (run / ckpt.CKPT_DIR / entry["file"], entry["checksum"])
    if len(by_step) < last:
        raise OctlmError(
            f"{shown_path(run)} keeps {len(by_step)} checkpoint(s), fewer than --last {last}",
            "train with --keep-ckpts (a snapshot at each checkpoint), or ask for fewer",
        )
    return [by_step[step] for step in sorted(by_step)[-last:]]


def merge(
    sources: list[tuple[Path, str | None]],
    weights: list[float] | None,
    out: Path,
    force: bool,
    eval_data: bool = False,
) -> tuple[Path, str]:
    """Write the weighted float32 mean of `sources` to `out`; (weights file, its hash). The
    folder is written beside `out` and renamed into place when whole: a merge that fails leaves
    no folder (or the one --force was to replace) behind. `eval_data`: `compare_with_last`
    follows, so the run's dataset is opened first (a dataset gone is one line, nothing written)."""
    weights = [1.0] * len(sources) if weights is None else weights
    check_merge_out(out, force)
    _check(sources, weights)
    merged, infos = _mean(sources, weights)
    check_finite(merged, "the merged weights")
    if eval_data:
        from octlm.data.dataset_tokenizer import dataset_tokenizer
        from octlm.generation.trained import run_dataset

        dataset_tokenizer(run_dataset(infos[-1]))  # the merge's and the last file's dataset
    with staged(out) as tmp:
        digest = _write(tmp, merged, infos, weights)
    return out / ckpt.WEIGHTS_FILE, digest


def check_merge_out(out: Path, force: bool) -> None:
    """-o before any work: never a run folder nor inside one; new or empty, or with --force a
    folder an earlier merge wrote (it is replaced whole)."""
    check_folder_out("-o", out, force, replaceable=(ckpt.MERGE_RECORD,))


def _mean(
    sources: list[tuple[Path, str | None]], weights: list[float]
) -> tuple[dict[str, torch.Tensor], list[ckpt.CheckpointInfo]]:
    infos: list[ckpt.CheckpointInfo] = []
    total = None
    for (path, checksum), weight in zip(sources, weights, strict=True):
        info, tensors = ckpt.load_checkpoint(path, checksum)
        model = {name: t.float() for name, t in ckpt.model_weights(tensors).items()}
        if total is None:
            total = {name: torch.zeros_like(t) for name, t in model.items()}
        _same_model(infos[0] if infos else info, info, total, model)
        # Summed oldest first, in float32, then divided once: the merge's bits are a function
        # of the files and weights alone (the order is fixed, no reduction kernel chooses one).
        # Multiplied, then added: add_'s alpha may fuse the two into one rounding on some CPUs.
        for name, t in model.items():
            total[name].add_(t * weight)
        infos.append(info)
    assert total is not None
    merged = {name: (t / math.fsum(weights)).contiguous() for name, t in total.items()}
    return merged, infos


def compare_with_last(out: Path, last: Path, batches: int, micro_batch: int = 16) -> dict:
    """Validation loss and bits per byte of the merge at `out` and of `last`, the newest file it
    was made of, on the same windows of the run's validation split (fp32); recorded in
    merge.json as `eval`, and drawn by `octlm report OUT`."""
    from octlm.data.dataset_tokenizer import dataset_tokenizer
    from octlm.evaluate.loss import evaluate_split
    from octlm.generation.trained import load_model, run_dataset

    scores: dict = {"split": "val", "batches": batches, "micro_batch": micro_batch}
    for name, path in (("merged", out), ("last", last)):
        model, info = load_model(path)
        dataset = run_dataset(info)
        token_bytes = dataset_tokenizer(dataset).token_bytes_table
        r = evaluate_split(
            model, dataset, token_bytes, split="val", batches=batches, micro_batch=micro_batch
        )
        scores[name] = {"step": info.step, "loss": r.loss, "bpb": r.bpb, "tokens": r.tokens}
    record = json.loads((out / ckpt.MERGE_RECORD).read_text(encoding="utf-8"))
    record["eval"] = scores
    atomic_write_bytes(out / ckpt.MERGE_RECORD, (json.dumps(record, indent=2) + "\n").encode())
    return scores


def _check(sources: list[tuple[Path, str | None]], weights: list[float]) -> None:
    if len(sources) < 2:
        raise OctlmError(f"{len(sources)} checkpoint(s) to merge", "name two or more, or --last 2+")
    if len(weights) != len(sources):
        raise OctlmError(
            f"--weights gives {len(weights)} weight(s) for {len(sources)} checkpoints",
            "give one weight per checkpoint, oldest first",
        )
    check_weights(weights)


def check_weights(weights: list[float]) -> None:
    """Each weight in `WEIGHT`, none vanishing beside the largest (before any file is read)."""
    for weight in weights:
        if not WEIGHT.ok(weight):
            raise OctlmError(
                f"--weights {shown(weight)}: each must be a finite number > 0, from "
                f"{WEIGHT.lo:g} to {WEIGHT.hi:g}",
                "weights are relative (their sum divides them): e.g. 1,1,2",
            )
    if min(weights) < MIN_SHARE * max(weights):
        raise OctlmError(
            f"--weights {shown(min(weights))} is under a millionth of the largest, "
            f"{shown(max(weights))}: its checkpoint would change nothing a float32 mean holds",
            "drop that checkpoint, or give it a larger weight",
        )


def _same_model(
    first: ckpt.CheckpointInfo,
    info: ckpt.CheckpointInfo,
    total: dict[str, torch.Tensor],
    model: dict,
) -> None:
    """One model shape across the sources: the same config and the same tensors."""
    shapes = {name: tuple(t.shape) for name, t in total.items()}
    if first.model_config != info.model_config or shapes != {
        name: tuple(t.shape) for name, t in model.items()
    }:
        raise OctlmError(
            f"{shown_path(info.path)} holds a model of another shape than the first checkpoint's",
            "merge checkpoints of one model shape (one run, or runs of the same shape)",
        )


def _write(
    out: Path,
    merged: dict[str, torch.Tensor],
    infos: list[ckpt.CheckpointInfo],
    weights: list[float],
) -> str:
    from safetensors.torch import save_file

    digest = weights_sha256(merged)
    parts = [
        {"file": str(info.path.resolve()), "step": info.step, "weight": weight}
        for info, weight in zip(infos, weights, strict=True)
    ]
    header = {**infos[-1].snapshot_header(), "merged_from": parts}
    target = out / ckpt.WEIGHTS_FILE
    metadata = {"format": "pt", "octlm": json.dumps(header)}
    atomic_write(target, lambda tmp: save_file(merged, str(tmp), metadata=metadata))
    record = {"merged_from": parts, "weights_sha256": digest}
    atomic_write_bytes(out / ckpt.MERGE_RECORD, (json.dumps(record, indent=2) + "\n").encode())
    return digest
