"""docs/finetune.md's walk-through runs as written, by bash, in an empty folder, with `octlm`
and `python` meaning this checkout's interpreter; only its step counts and batch are set small."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from octlm.data.shards import ShardDataset
from octlm.runlog import read_log

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[1] / "docs" / "finetune.md"


def walkthrough() -> str:
    section = DOC.read_text(encoding="utf-8").split("\n## A complete run", 1)[1]
    blocks = re.findall(r"```bash\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


def shim(folder: Path) -> Path:
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name, command in (("octlm", f'"{sys.executable}" -m octlm'), ("python", sys.executable)):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_the_walkthrough_runs(tmp_path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "PATH": f"{shim(tmp_path)}{os.pathsep}{os.environ['PATH']}",
        "BASE_STEPS": "21",
        "TUNE_STEPS": "11",
        "BATCH": "4",
    }
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", walkthrough()],
        cwd=work, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    data = ShardDataset.open(work / "data" / "replies", verify_checksums=True)
    assert data.masked and data.manifest["splits"]["train"]["documents"] > 20_000
    tuned = read_log(work / "runs" / "replies")
    assert tuned[0]["init_from"]["kind"] == "octlm" and tuned[0]["packing"]["train"]["windows"]
    assert [r["epoch"] for r in tuned if r["type"] == "step"][-1] == 0
    evals = re.findall(r"val: loss ([\d.]+) .*\(([\d,]+) tokens\)", result.stdout)
    assert len(evals) == 2 and evals[0][1] == evals[1][1]  # the same targets scored
    assert "MACBETH.\n" in result.stdout
