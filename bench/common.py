"""What several benches share: the quiet short-run config they train with.

A bench run times steps, so it validates and checkpoints never, prints no progress bar and
warms up for 2 steps only; those keys were written out by each bench until they drifted.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from octlm.config.files import make_config
from octlm.config.train import TrainConfig

QUIET = {"warmup": 2, "val_every": 0, "ckpt_every": 0, "progress": False}
"""A bench run's keys beside its shape: no validation, checkpoint or progress bar between the
steps it times, and a short warm-up so that a run of a few steps reaches its peak lr."""


def bench_keys(
    model: str | None = None,
    *,
    steps: int,
    context: int | None = None,
    micro_batch: int | None = None,
    accum: int | None = None,
    dtype: str | None = None,
    out: str | Path | None = None,
    device: str = "cpu",
    **extra: Any,
) -> dict[str, Any]:
    """The flat `octlm train` keys of a quiet bench run (`QUIET`); a shape value left None is
    the base's (the preset's, or the TOML's), so it is not written. `extra` comes last and
    wins, None values included (some keys, e.g. `fused`, mean "auto" by None)."""
    shape = {"model": model, "context": context, "micro_batch": micro_batch, "accum": accum}
    shape |= {"dtype": dtype, "out": None if out is None else str(out)}
    given = {k: v for k, v in shape.items() if v is not None}
    return {**given, "steps": steps, "device": device, **QUIET, **extra}


def bench_config(
    model: str | None = None, *, base: str | Path | None = None, **keys: Any
) -> TrainConfig:
    """A TrainConfig of `bench_keys(model, **keys)`, built flat (`TrainConfig(**keys)`), or
    over `base` (a shipped config's name such as "recipe", or a TOML path) when given."""
    values = bench_keys(model, **keys)
    if base is None:
        return TrainConfig(**values)
    return make_config(base, **values)


def optimizer_for(model: Any, cfg: TrainConfig) -> Any:
    """The run's optimizer as `build_run` builds it: the optimizer section, the schedule's peak
    as the starting rate."""
    from octlm.trainer.optim import build_optimizer

    return build_optimizer(model, cfg.optim, cfg.lr_schedule.lr)


def step_times_and_memory(cfg: TrainConfig) -> tuple[list[float], float | None]:
    """Seconds per step (gaps between the log's `elapsed`, warm-up dropped) and the largest
    `mem_mb` of the run's steps (on CUDA the step's peak allocated memory)."""
    from octlm.runlog.reader import read_log
    from octlm.trainer.loop import train

    with tempfile.TemporaryDirectory() as tmp:
        train(cfg.replace(out=str(Path(tmp) / "run")))
        steps = [r for r in read_log(Path(tmp) / "run") if r["type"] == "step"]
    elapsed = [r["elapsed"] for r in steps]
    memory = [r["mem_mb"] for r in steps if r.get("mem_mb") is not None]
    gaps = [b - a for a, b in zip(elapsed[1:], elapsed[2:], strict=False)]
    return gaps[2:], max(memory) if memory else None  # compile warms up over the first steps


def gpu_config(model: str, args: Any, steps: int, **extra: Any) -> TrainConfig:
    """The GPU checks' run (bench/gpu_check.py, bench/gpu_determinism.py): `args`' shape, bf16
    autocast, lr 6e-4, on `args.device`; `extra` over it."""
    return bench_config(
        model,
        steps=steps,
        context=args.context,
        micro_batch=args.micro_batch,
        accum=args.accum,
        dtype="bf16",
        device=args.device,
        lr=6e-4,
        **extra,
    )
