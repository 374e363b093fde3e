"""The learning-rate schedule: a pure function of the step, so a resume recomputes it exactly.

Its twin in JavaScript (the report's schedule playground) must give the same numbers.
"""

from __future__ import annotations

import math
from typing import Protocol


class ScheduleSettings(Protocol):
    lr: float
    warmup: int
    steps: int
    min_lr_ratio: float


def learning_rate(step: int, config: ScheduleSettings) -> float:
    """Rate for the 0-based `step`: linear warmup peak*(step+1)/warmup, then half a cosine to
    peak*min_lr_ratio at `steps`; flat at that floor past the end (progress clamped at 1)."""
    peak = config.lr
    if step < config.warmup:
        return peak * (step + 1) / config.warmup  # step 0 already trains at peak/warmup
    floor = peak * config.min_lr_ratio
    progress = min(1.0, (step - config.warmup) / max(1, config.steps - config.warmup))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))
