"""docs/rl.md's walk-through runs as written, by bash, in an empty folder, with `octlm` meaning
this checkout's interpreter; only its knobs (step counts, batch, held-out prompts) are set
small."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from octlm.runlog.reader import read_log
from tests.doc_blocks import run_block, run_walkthrough, section_blocks, shim, shim_env
from tests.e2e.helpers import end_hash

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[1] / "docs" / "rl.md"


def test_the_walkthrough_runs(tmp_path, tmp_path_factory) -> None:
    blocks = section_blocks(DOC, "A complete run, on CPU")
    assert len(blocks) == 1
    work = tmp_path / "work"
    work.mkdir()
    bin_dir = shim(tmp_path, "octlm", python=True)
    env = shim_env(bin_dir, BASE_STEPS="21", TUNE_STEPS="11", RL_STEPS="3", BATCH="2", PROMPTS="8")
    # Its first two commands (prepare, the base run) run once per session, shared with the
    # walkthroughs that start with them (tests/doc_blocks.py run_walkthrough).
    result = run_walkthrough(blocks[0], 2, work, env, tmp_path_factory)
    records = read_log(work / "runs" / "rl")
    assert records[0]["kind"] == "rl" and records[0]["rl"]["task"] == "sorting:2"
    assert [r["step"] for r in records if r["type"] == "step"] == [1, 2, 3]
    assert [r["step"] for r in records if r["type"] == "val"] == [3]
    scored = [line for line in result.stdout.splitlines() if "task sorting:2: pass@1" in line]
    assert len(scored) == 2 and "runs/sort/" in scored[0] and "runs/rl/" in scored[1]
    assert (work / "rl.html").is_file()
    # The next section runs in the same folder, on the walkthrough's fine-tune.
    (block,) = section_blocks(DOC, "Settings files, Python, verify")
    result = run_block(block, work, env)
    assert tomllib.loads((work / "rl.toml").read_text())["task"] == "sorting:2"
    assert end_hash(work / "runs" / "rl-file") == result.stdout.strip().splitlines()[-1]
    assert "split@2" in result.stdout and "bit for bit" in result.stdout
