"""The first seed's Day 1 check, end to end: memorise one fixed block, then recite it.

the shipped `day1-overfit` config (8 copies of the first 128-token block, 200 steps, warmup 20, peak
3e-4 to a 3e-5 floor) must drive the loss on that block below 1.0 by step 200, and greedy
decoding from the block's first token must reproduce the block exactly.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from octlm.data.shards import ShardDataset
from octlm.generation.sampling import generate
from octlm.generation.trained import load_model
from octlm.runlog.reader import read_log
from tests import octlm_process

pytestmark = pytest.mark.slow


def test_day1_overfit_memorises_its_block(embedded_4096: Path, tmp_path: Path) -> None:
    out = tmp_path / "day1"
    args = ["train", "--config", "day1-overfit", "--data", str(embedded_4096), "--out", str(out)]
    proc = octlm_process.run([*args, "--no-progress"], dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = read_log(out)
    vals = {r["step"]: r["val_loss"] for r in records if r["type"] == "val"}
    assert sorted(vals) == list(range(20, 201, 20))
    assert vals[20] > 3.0  # it starts far from memorised ...
    assert vals[200] < 1.0  # ... and ends below 1.0 by step 200, as the seed's run did
    losses = [r["loss"] for r in records if r["type"] == "step"]
    assert losses[-1] < 1.0

    model, meta = load_model(out)
    dataset = ShardDataset.open(meta.data_dir)
    context = model.config.context
    block = dataset.train.window(0, context + 1).tolist()
    assert generate(model, block[:1], context) == block[1:]
