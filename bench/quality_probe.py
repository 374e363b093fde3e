"""bench/quality.py's equal wall clock: a side's probe, the steps that fill the budget, the
calibration of later rounds, and each trainer's warmup at that step count."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from bench.quality_data import BenchError

PROBE_STEPS = 15
PROBE_DROP = 3
"""A probe's first steps, left out of its median (first-call set-up, nanoGPT's first evaluation)."""
OCTLM_WARMUP_SHARE = 0.05
PROBE_RUN_STEPS = 100_000
"""octlm's probe: a run of this many steps stopped at --probe-steps (`--stop-at`)."""
CALIBRATION_RANGE = (0.8, 1.25)
"""The bounds of a side's calibration (`calibration`)."""
NANOGPT_WARMUP = 100


def probe_estimate(times_ms: Sequence[float], drop: int = PROBE_DROP) -> tuple[float, float]:
    """From a probe's per-step times (ms, from its first step): the median step time of all but
    the first `drop`, and the seconds those first steps took beyond it (at least 0)."""
    if len(times_ms) <= drop:
        raise BenchError(f"the probe timed {len(times_ms)} steps, more than {drop} are needed")
    median = statistics.median(times_ms[drop:])
    extra = max(0.0, sum(times_ms[:drop]) - drop * median) / 1e3
    return median, extra


def size_steps(budget_s: float, step_ms: float, extra_s: float = 0.0) -> int:
    """The steps whose training ends at `budget_s`: `extra_s` (the first steps' set-up) plus
    steps x `step_ms`; at least 1."""
    return max(1, int((budget_s - extra_s) * 1e3 / step_ms))


def calibration(earlier: Sequence[dict]) -> float:
    """How a side's earlier rounds' training seconds compared with what their probes predicted
    (the median of train_s / (extra + steps x probe ms)); 1 before any round. A probe of a few
    steps can be biased for one trainer (nanoGPT's first steps are a few percent slower than its
    run's average here), and that bias would take a share of the budget from one side only."""
    ratios = [
        r["train_s"] / (r["probe_extra_s"] + r["steps"] * r["probe_ms_per_step"] / 1e3)
        for r in earlier
        if math.isfinite(r["probe_ms_per_step"])
    ]
    # Bounded: beyond a quarter the probe is not biased but wrong (a tiny budget whose first
    # steps' set-up dominates, a load spike), and an earlier round's accident would size a run
    # far off the budget.
    return (
        min(max(statistics.median(ratios), CALIBRATION_RANGE[0]), CALIBRATION_RANGE[1])
        if ratios
        else 1.0
    )


def octlm_warmup(steps: int) -> int:
    """octlm's warmup: the share of the run its default has (20 steps of 440), at least 1."""
    return max(1, round(OCTLM_WARMUP_SHARE * steps))


def nanogpt_warmup(steps: int) -> int:
    """nanoGPT's recipe's 100 warmup iterations, but no larger a share of the run than octlm's
    warmup has (the cap binds under 2000 steps; at a few hundred, 100 would be most of the run).
    Always below `steps`: its cosine divides by lr_decay_iters - warmup_iters."""
    return min(NANOGPT_WARMUP, round(OCTLM_WARMUP_SHARE * steps))
