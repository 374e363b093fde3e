"""docs/finetune.md's walk-through runs as written, by bash, in an empty folder, with `octlm`
and `python` meaning this checkout's interpreter; only its step counts and batch are set small."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from octlm.data.shards import ShardDataset
from octlm.runlog.reader import read_log
from tests.doc_blocks import run_walkthrough, section_blocks, shim, shim_env

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[1] / "docs" / "finetune.md"


def walkthrough() -> str:
    blocks = section_blocks(DOC, "A complete run, on CPU in about 3 minutes")
    assert len(blocks) == 1
    return blocks[0]


def test_the_walkthrough_runs(tmp_path, tmp_path_factory) -> None:
    work = tmp_path / "work"
    work.mkdir()
    bin_dir = shim(tmp_path, "octlm", python=True)
    env = shim_env(bin_dir, BASE_STEPS="21", TUNE_STEPS="11", BATCH="2")
    # Its first command (prepare) runs once per session, shared with the walkthroughs that
    # start with it (tests/doc_blocks.py run_walkthrough).
    result = run_walkthrough(walkthrough(), 1, work, env, tmp_path_factory)
    data = ShardDataset.open(work / "data" / "replies", verify_checksums=True)
    assert data.masked and data.manifest["splits"]["train"]["documents"] > 20_000
    tuned = read_log(work / "runs" / "replies")
    assert tuned[0]["init_from"]["kind"] == "octlm" and tuned[0]["packing"]["train"]["windows"]
    assert [r["epoch"] for r in tuned if r["type"] == "step"][-1] == 0
    evals = re.findall(r"val: loss ([\d.]+) .*\(([\d,]+) tokens\)", result.stdout)
    assert len(evals) == 2 and evals[0][1] == evals[1][1]  # the same targets scored
    assert "MACBETH.\n" in result.stdout
