"""Tests for octlm.train.schedule: the learning rate is a pinned, pure function of the step."""

from __future__ import annotations

import math

import pytest

from octlm.config import TrainConfig
from octlm.train.schedule import learning_rate

PEAK = 1e-3


def cfg(**changes) -> TrainConfig:
    base = {"lr": PEAK, "warmup": 10, "steps": 110, "min_lr_ratio": 0.1}
    return TrainConfig(**{**base, **changes})


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 1e-4),  # peak * (0 + 1) / warmup: step 0 already trains
        (4, 5e-4),
        (9, 1e-3),  # the last warmup step reaches the peak
        (10, 1e-3),  # cosine start
        (60, 0.55e-3),  # midpoint: floor + half of (peak - floor)
        (110, 1e-4),  # end of the cosine: the floor
        (200, 1e-4),  # past the end: flat at the floor
    ],
)
def test_schedule_matches_pinned_table(step: int, expected: float) -> None:
    assert learning_rate(step, cfg()) == pytest.approx(expected, rel=1e-12, abs=0)


def test_last_warmup_step_is_exactly_the_peak() -> None:
    assert learning_rate(9, cfg()) == PEAK
    assert learning_rate(10, cfg()) == PEAK


def test_schedule_is_monotone_non_increasing_after_warmup() -> None:
    c = cfg()
    rates = [learning_rate(s, c) for s in range(c.warmup, 300)]
    assert all(b <= a for a, b in zip(rates, rates[1:], strict=False))
    assert min(rates) == pytest.approx(PEAK * c.min_lr_ratio, rel=1e-12)


def test_warmup_is_linear_and_increasing() -> None:
    c = cfg()
    rates = [learning_rate(s, c) for s in range(c.warmup)]
    assert all(b > a for a, b in zip(rates, rates[1:], strict=False))
    for s, r in enumerate(rates):
        assert r == pytest.approx(PEAK * (s + 1) / c.warmup, rel=1e-15)


def test_zero_warmup_starts_at_the_peak() -> None:
    c = cfg(warmup=0)
    assert learning_rate(0, c) == PEAK
    assert learning_rate(c.steps, c) == pytest.approx(PEAK * c.min_lr_ratio, rel=1e-12)


def test_min_lr_ratio_one_is_constant_after_warmup() -> None:
    c = cfg(min_lr_ratio=1.0)
    assert {learning_rate(s, c) for s in range(c.warmup - 1, 150)} == {PEAK}


def test_seed_two_small_config_rate_at_step_300() -> None:
    # The seed's log line for the small config: lr 0.0004875 at step 300.
    c = TrainConfig()  # defaults are the small config: steps 440, warmup 20, lr 1.5e-3
    assert (c.steps, c.warmup, c.lr, c.min_lr_ratio) == (440, 20, 1.5e-3, 0.1)
    assert math.isclose(learning_rate(300, c), 0.0004875, rel_tol=1e-15, abs_tol=0)


def test_schedule_is_a_pure_function_of_the_step() -> None:
    c = cfg()
    first = [learning_rate(s, c) for s in range(0, 150, 7)]
    learning_rate(1000, c)
    assert [learning_rate(s, c) for s in range(0, 150, 7)] == first
