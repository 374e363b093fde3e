"""A mixture's weights are shares: a run started with --data A:0.7,B:0.3, stopped, and resumed
with A:7,B:3 ends on the straight run's bits (the fingerprint and the sampler's state compare
the weights normalised). Real `python -m octlm train` subprocesses, as tests/e2e/test_mixture.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import assert_same_run, octlm, train_args

pytestmark = pytest.mark.slow


def test_a_resume_with_the_same_shares_respelt_ends_on_the_straight_run(
    tiny_dataset, few_speeches, tmp_path
) -> None:
    started, respelt = (f"{tiny_dataset}:{a},{few_speeches}:{b}" for a, b in ((0.7, 0.3), (7, 3)))
    straight, split = tmp_path / "straight", tmp_path / "split"
    octlm(*train_args(Path(started), straight))
    octlm(*train_args(Path(started), split, "--stop-at", "5"))
    # The control: other shares are another run, refused in one line, the folder untouched.
    other = f"{tiny_dataset}:6,{few_speeches}:4"
    before = {p: p.read_bytes() for p in split.rglob("*") if p.is_file() and p.name != ".lock"}
    refused = octlm(*train_args(Path(other), split, "--resume"), check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert refused.stderr.count("octlm: error: ") == 1
    after = {p: p.read_bytes() for p in split.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before
    proc = octlm(*train_args(Path(respelt), split, "--resume"))
    assert "resumed from" in proc.stderr
    assert_same_run(split, straight)
