"""Sweep planning and summaries (pure parts); a real sweep runs in tests/e2e/test_sweep.py."""

from __future__ import annotations

import pytest

from octlm.config import TrainConfig
from octlm.errors import OctlmError
from octlm.tools.sweep import mark_noise, parse_assignments, parse_set, plan


def test_grid_values_take_the_field_types() -> None:
    assert parse_assignments("lr=3e-4,1.5e-3") == {"lr": [3e-4, 1.5e-3]}
    assert parse_assignments("warmup=0,20") == {"warmup": [0, 20]}
    assert parse_assignments("fused=true,false") == {"fused": [True, False]}
    assert parse_set("accum=8,steps=50") == {"accum": 8, "steps": 50}


@pytest.mark.parametrize("bad", ["lr", "lr=", "bogus=1", "warmup=1.5", "out=x", "seed=1,2"])
def test_bad_grids_are_errors(bad: str) -> None:
    with pytest.raises(OctlmError):
        parse_assignments(bad)


def test_plan_is_product_times_repeats_with_seeds() -> None:
    base = TrainConfig(model="tiny", context=32, steps=10, warmup=2, seed=100)
    specs = plan(base, {"lr": [1e-3, 2e-3], "warmup": [0, 2]}, [], repeats=3)
    assert len(specs) == 12
    assert {s.seed for s in specs} == {100, 101, 102}
    assert len({s.name for s in specs}) == 12
    assert specs[0].name == "lr=0.001,warmup=0-r0"
    with pytest.raises(OctlmError):  # each setting is validated before anything runs
        plan(base, {"warmup": [50]}, [], repeats=1)


def test_explicit_sets_change_keys_together() -> None:
    base = TrainConfig(model="tiny", context=32, steps=400, warmup=40)
    sets = [{"accum": 8, "steps": 50, "warmup": 5}, {"accum": 1, "steps": 400, "warmup": 40}]
    specs = plan(base, {}, sets, repeats=1)
    assert [dict(s.setting) for s in specs] == sets


def test_noise_marks() -> None:
    rows = [
        {"setting": "a", "repeats": 3, "mean": 5.00, "spread": 0.10},
        {"setting": "b", "repeats": 3, "mean": 5.08, "spread": 0.05},  # gap 0.08 < 0.10
        {"setting": "c", "repeats": 3, "mean": 5.30, "spread": 0.05},  # gap 0.30 > 0.10
        {"setting": "d", "repeats": 1, "mean": 5.20, "spread": 0.0},
        {"setting": "e", "repeats": 0, "mean": None, "spread": None},
    ]
    mark_noise(rows)
    marks = {r["setting"]: r["vs_best"] for r in rows}
    assert marks["a"] == "best"
    assert marks["b"] == "+0.080 within noise"
    assert marks["c"] == "+0.300 beyond noise"
    assert "noise unknown" in marks["d"] and marks["e"] == "failed"
