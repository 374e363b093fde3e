"""A real resumable sweep end to end: killed mid-run, resumed, summarised, and its interrupted run
equal to a direct uninterrupted one. The pure planning parts are in tests/tools/test_sweep.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from octlm.runlog.reader import read_log
from tests.e2e.helpers import nan_loss_pythonpath, octlm

pytestmark = pytest.mark.slow


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

    again = octlm(*sweep_cmd(tiny_dataset, out)[3:])  # forked: no process group to kill
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
    flags = ["--out", str(direct), "--seed", "1338", "--lr", "0.001", "--no-progress"]
    octlm("train", "--config", str(out / "base.toml"), *flags)
    end = [r for r in read_log(runs / "lr=0.001-r1") if r["type"] == "end"][0]
    assert end == [r for r in read_log(direct) if r["type"] == "end"][0] | {
        "elapsed": end["elapsed"]
    }


def test_a_sweep_with_a_failed_run_exits_1_naming_it(tiny_dataset, tmp_path) -> None:
    """The lr=1e6 run's loss is non-finite (poisoned): that run fails, the other one still runs
    to its end, and the sweep's exit status says it failed (before, it was 0)."""
    path = nan_loss_pythonpath(tmp_path / "site", "1000000.0")  # the run of lr=1e6 alone
    out = tmp_path / "sw"
    flags = ["--model", "micro", "--data", str(tiny_dataset), "--context", "32"]
    flags += ["--micro-batch", "2", "--accum", "1", "--steps", "2", "--warmup", "0"]
    flags += ["--grad-clip", "0", "--dtype", "fp32", "--val-batches", "1"]
    cmd = [
        sys.executable,
        "-m",
        "octlm",
        "sweep",
        *flags,
        "--grid",
        "lr=1e6,1e-3",
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "lr=1000000.0-r0 failed: octlm: error: non-finite loss" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("octlm: error: 1 of 2 runs failed: lr=1000000.0-r0; see their errors")
    assert '"type": "end"' in (out / "runs" / "lr=0.001-r0" / "log.jsonl").read_text()
    assert "| lr=1000000.0 | 0 |" in proc.stdout
