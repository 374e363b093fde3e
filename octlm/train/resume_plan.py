"""What a resume decides before any part of a run is built, from the newest checkpoint's
metadata: defaults that changed after the run started, and the accumulation under another
process count. Every part is then built with the settings it runs with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from octlm.config import TrainConfig, fused_or_default
from octlm.errors import ResumeError
from octlm.train import checkpoint as ckpt


def plan_resume(cfg: TrainConfig, world: int) -> tuple[TrainConfig, list[str]]:
    """`cfg` settled for the run folder it resumes (as it is for a new run), and the notes."""
    meta = ckpt.peek_newest_meta(Path(cfg.out)) if cfg.resume else None
    return elastic_config(settled_defaults(cfg, meta), world, meta)


def settled_defaults(cfg: TrainConfig, meta: dict[str, Any] | None) -> TrainConfig:
    """Settings left unset whose default changed after runs existed: a resume takes the
    checkpoint's value (`meta`, None for a new run), so an older run folder resumes on the
    numbers it started with; a new run takes today's default."""
    if cfg.fused is None:
        saved = meta["trajectory"].get("fused") if meta is not None else None
        cfg = cfg.replace(fused=fused_or_default(saved))
    return cfg


def elastic_config(
    cfg: TrainConfig, world: int, meta: dict[str, Any] | None
) -> tuple[TrainConfig, list[str]]:
    """Resuming with another process count: keep the global batch by adjusting accumulation.
    Decided before any part is built, so every part sees the accumulation it runs with."""
    if meta is None or meta.get("world", 1) == world:
        return cfg, []
    total = meta["trajectory"]["accum"]  # micro-batches per step over all ranks
    if total % world:
        raise ResumeError(
            f"the checkpoint's {total} micro-batches per step do not split over {world} processes",
            "resume with a process count that divides it",
        )
    note = (
        f"checkpoint written by {meta.get('world', 1)} process(es), resumed by {world}: "
        f"--accum set to {total // world} to keep the global batch; the data order continues, "
        "but sums run in another order (not bitwise)"
    )
    return cfg.replace(accum=total // world), [note]
