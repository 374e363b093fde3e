"""Run folders users already have keep resuming exactly.

`tests/golden/v1-micro/run` was written by octlm before the redesign (checkpoint format v1,
`tests/golden/make_golden.py`): a micro run stopped at step 6. Today's code resumes a copy of
it and must end on the weights hash and the log records of that octlm's straight run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden" / "v1-micro"

pytestmark = pytest.mark.slow


def _train(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "octlm", "train", "--config", str(folder / "config.toml"),
           "--data", str(folder / "data"), "--out", str(folder / "run"), *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)


def test_golden_v1_run_folder_resumes_to_the_recorded_bits(tmp_path) -> None:
    folder = tmp_path / "golden"
    shutil.copytree(GOLDEN, folder)
    expected = json.loads((folder / "expected.json").read_text())
    proc = _train(folder, "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"resumed from {folder / 'run'}" in proc.stderr
    records = [json.loads(x) for x in (folder / "run" / "log.jsonl").read_text().splitlines()]
    keep = set().union(*(r.keys() for r in expected["records"]))
    got = [{k: v for k, v in r.items() if k in keep} for r in records[1:] if r["type"] != "event"]
    assert got == expected["records"]  # every loss and grad norm, before and after the stop
    assert records[-1]["type"] == "end"
    assert records[-1]["weights_sha256"] == expected["weights_sha256"]


def test_control_golden_folder_with_another_lr_is_refused(tmp_path) -> None:
    """The resume above is checked, not waved through: a changed setting is refused in one
    line and the folder is left as it was."""
    folder = tmp_path / "golden"
    shutil.copytree(GOLDEN, folder)
    before = (folder / "run" / "log.jsonl").read_bytes()
    proc = _train(folder, "--resume", "--lr", "1e-3")
    assert proc.returncode == 1
    assert proc.stderr.startswith("octlm: error: ") and "Traceback" not in proc.stderr
    assert "lr" in proc.stderr
    assert (folder / "run" / "log.jsonl").read_bytes() == before


def test_golden_folder_keeps_the_unfused_adamw_it_started_with(tmp_path) -> None:
    """Fused AdamW became the default after this folder was written: left unset, the resume
    takes the checkpoint's `fused = false` (the exact resume above); asking for the fused
    kernel is a trajectory change, refused in one line."""
    folder = tmp_path / "golden"
    shutil.copytree(GOLDEN, folder)
    before = (folder / "run" / "log.jsonl").read_bytes()
    proc = _train(folder, "--resume", "--fused")
    assert proc.returncode == 1
    assert proc.stderr.startswith("octlm: error: ") and "Traceback" not in proc.stderr
    assert "fused" in proc.stderr and proc.stderr.count("\n") == 1
    assert (folder / "run" / "log.jsonl").read_bytes() == before
