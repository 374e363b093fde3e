"""Tests for octlm.trainer.schedule: the learning rate is a pinned, pure function of the step."""

from __future__ import annotations

import math

import pytest

from octlm.config.train import TrainConfig
from octlm.trainer.schedule import learning_rate

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


def wsd(**changes) -> TrainConfig:
    return cfg(**{"schedule": "wsd", "decay_steps": 40, **changes})  # decay from step 70


@pytest.mark.parametrize(
    ("shape", "step", "expected"),
    [
        ("linear", 0, 1e-4),  # the warmup is the cosine's
        ("linear", 10, 1e-3),  # stable: the peak from the end of warmup ...
        ("linear", 69, 1e-3),
        ("linear", 70, 1e-3),  # ... to the decay's first step (progress 0)
        ("linear", 80, 0.0007750000000000001),  # floor + 0.75 * (peak - floor)
        ("linear", 90, 0.00055),  # the decay's midpoint
        ("linear", 109, 0.00012250000000000002),  # the last step, just above the floor
        ("linear", 110, 1e-4),  # the floor at `steps`
        ("linear", 200, 1e-4),  # flat past the end
        ("1-sqrt", 80, 0.00055),  # 1 - sqrt(0.25) = 0.5: half-way down after a quarter
        ("1-sqrt", 90, 0.0003636038969321072),
        ("1-sqrt", 100, 0.00022057713659400527),
        ("1-sqrt", 109, 0.00011132120538408257),
        ("1-sqrt", 110, 1e-4),
    ],
)
def test_wsd_matches_pinned_values(shape: str, step: int, expected: float) -> None:
    assert learning_rate(step, wsd(decay_shape=shape)) == expected  # the same double


def test_wsd_closed_forms() -> None:
    floor, span = PEAK * 0.1, PEAK * 0.9
    for s in range(70, 111):
        p = (s - 70) / 40
        lin, root = learning_rate(s, wsd()), learning_rate(s, wsd(decay_shape="1-sqrt"))
        assert lin == pytest.approx(floor + span * (1 - p), rel=1e-15)
        assert root == pytest.approx(floor + span * (1 - math.sqrt(p)), rel=1e-15)


def test_wsd_stable_part_does_not_depend_on_the_run_length() -> None:
    """Why WSD: a run extended (more steps) before its decay trains with the same rates up to
    the point it branched, so its checkpoint from the stable part is a valid start."""
    short, long = wsd(), wsd(steps=1000)
    assert [learning_rate(s, short) for s in range(70)] == [
        learning_rate(s, long) for s in range(70)
    ]


def test_wsd_decay_over_everything_after_warmup_starts_at_the_peak() -> None:
    c = wsd(decay_steps=100)
    assert learning_rate(10, c) == PEAK
    rates = [learning_rate(s, c) for s in range(10, 111)]  # strictly down to the floor at 110
    assert all(b < a for a, b in zip(rates, rates[1:], strict=False)) and rates[-1] == PEAK / 10
