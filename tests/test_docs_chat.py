"""docs/chat.md's walk-through runs as written, by bash, in an empty folder, with `octlm` and
`python` meaning this checkout's interpreter; only its step counts and batch are set small."""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.data.shards import ShardDataset
from octlm.runlog.reader import read_log
from tests.doc_blocks import run_walkthrough, section_blocks, shim, shim_env

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[1] / "docs" / "chat.md"


def test_the_walkthrough_runs(tmp_path, tmp_path_factory) -> None:
    blocks = section_blocks(DOC, "A complete run, on CPU in about 4 minutes")
    assert len(blocks) == 1
    work = tmp_path / "work"
    work.mkdir()
    bin_dir = shim(tmp_path, "octlm", python=True)
    env = shim_env(bin_dir, BASE_STEPS="21", TUNE_STEPS="11", BATCH="2")
    # Its first two commands (prepare, the base run) run once per session, shared with the
    # walkthroughs that start with them (tests/doc_blocks.py run_walkthrough).
    result = run_walkthrough(blocks[0], 2, work, env, tmp_path_factory)
    data = ShardDataset.open(work / "data" / "talk", verify_checksums=True)
    assert data.masked and data.manifest["chat_template"] == {"version": 1}
    assert read_log(work / "runs" / "talk")[0]["init_from"]["kind"] == "octlm"
    assert result.stdout.count("you> ") == 3  # two lines read, then the end of the input
    assert result.stdout.count("model> ") == 2
    assert "template ids equal: True" in result.stdout
    assert "reply:" in result.stdout
