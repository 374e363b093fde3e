"""The learning-rate schedule: a pure function of the step, so a resume recomputes it exactly.

Both schedules share the warmup and the floor (peak * min_lr_ratio). `cosine` decays over the
whole run; `wsd` (warmup-stable-decay) holds the peak and decays only over the last
`decay_steps`, so a checkpoint from the stable part can be extended or branched into runs of
other lengths that each get a full decay. Its twin in JavaScript (the report's schedule
playground) must give the same numbers.
"""

from __future__ import annotations

import math

from octlm.config.learning import ScheduleSettings


def learning_rate(step: int, config: ScheduleSettings) -> float:
    """Rate for the 0-based `step`: linear warmup peak*(step+1)/warmup, then the cosine or the
    warmup-stable-decay schedule down to peak*min_lr_ratio at `steps`; flat at that floor past
    the end (progress clamped at 1)."""
    peak = config.lr
    if step < config.warmup:
        return peak * (step + 1) / config.warmup  # step 0 already trains at peak/warmup
    floor = peak * config.min_lr_ratio
    if config.schedule == "wsd":
        return wsd_rate(step, peak, floor, config)
    progress = min(1.0, (step - config.warmup) / max(1, config.steps - config.warmup))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def wsd_rate(step: int, peak: float, floor: float, config: ScheduleSettings) -> float:
    """After warmup: the peak until `steps - decay_steps`, then linear or 1-sqrt to the floor.
    As with the cosine, the floor itself is reached at `steps` (the last step trains just
    above it), so the decay's first step is still the peak."""
    decay = config.decay_steps or 1  # the config refuses wsd without decay_steps
    start = config.steps - decay
    if step < start:
        return peak
    progress = min(1.0, (step - start) / decay)
    if config.decay_shape == "1-sqrt":
        return floor + (peak - floor) * (1.0 - math.sqrt(progress))
    return floor + (peak - floor) * (1.0 - progress)
