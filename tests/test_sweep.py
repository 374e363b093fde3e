"""Sweep planning and summaries (pure parts), and a real resumable sweep end to end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from octlm.config import TrainConfig
from octlm.errors import OctlmError
from octlm.runlog import read_log
from octlm.sweep import mark_noise, parse_assignments, parse_set, plan


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


def sweep_cmd(data: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "octlm",
        "sweep",
        "--model",
        "tiny",
        "--data",
        str(data),
        "--context",
        "32",
        "--micro-batch",
        "2",
        "--accum",
        "1",
        "--steps",
        "12",
        "--warmup",
        "2",
        "--dtype",
        "fp32",
        "--val-every",
        "6",
        "--val-batches",
        "1",
        "--ckpt-every",
        "2",
        "--grid",
        "lr=1e-3,3e-3",
        "--repeats",
        "2",
        "--out",
        str(out),
    ]


def test_sweep_runs_summarises_and_resumes_exactly(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "sw"
    runs = out / "runs"
    # Its own process group, killed as a whole: what a scheduler does to a job.
    proc = subprocess.Popen(
        sweep_cmd(tiny_dataset, out),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    first = runs / "lr=0.001-r0" / "log.jsonl"
    second = runs / "lr=0.001-r1" / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:  # kill the sweep once its second run has taken a few steps
        if second.exists() and second.read_text().count('"type": "step"') >= 3:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.2)  # let the kernel reap the killed trainer and drop its lock
    assert '"type": "end"' in first.read_text()
    assert '"type": "end"' not in second.read_text()

    again = subprocess.run(sweep_cmd(tiny_dataset, out), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "1 of 4 runs already finished: skipped" in again.stderr
    assert "[2/4] lr=0.001-r1 (seed 1338)" in again.stderr
    summary = (out / "summary.md").read_text()
    assert "| lr=0.001 | 2 |" in summary and "| lr=0.003 | 2 |" in summary
    assert "best" in summary
    csv_lines = (out / "summary.csv").read_text().splitlines()
    assert csv_lines[0].startswith("setting,repeats,failed,mean,min,max,spread")
    assert len(csv_lines) == 3

    # The interrupted run, resumed by the second sweep, equals a direct uninterrupted run.
    direct = tmp_path / "direct"
    cmd = [
        sys.executable,
        "-m",
        "octlm",
        "train",
        "--config",
        str(out / "base.toml"),
        "--out",
        str(direct),
        "--seed",
        "1338",
        "--lr",
        "0.001",
        "--no-progress",
    ]
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ))
    end = [r for r in read_log(runs / "lr=0.001-r1") if r["type"] == "end"][0]
    assert end == [r for r in read_log(direct) if r["type"] == "end"][0] | {
        "elapsed": end["elapsed"]
    }
