"""`--activation-checkpointing` keeps the bits: a run with dropout 0.1 and blocks recomputed in
the backward pass, stopped and resumed (turned off for the resume, since it is a setting),
ends on the weights and every logged number of the plain straight run; a control with another
seed ends elsewhere. Every step record carries the memory it measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.runlog.reader import read_log
from tests.e2e.helpers import end_hash, octlm, steps_of, train_args

pytestmark = pytest.mark.slow

DROPOUT = ("--dropout", "0.1")


@pytest.fixture(scope="module")
def plain(straight_run) -> Path:
    return straight_run(*DROPOUT)


def test_recomputed_blocks_give_the_plain_runs_bits_across_a_resume(
    tiny_dataset, plain, tmp_path
) -> None:
    out = tmp_path / "recomputed"
    flag = "--activation-checkpointing"
    octlm(*train_args(tiny_dataset, out, *DROPOUT, flag, "--stop-at", "4"))
    octlm(*train_args(tiny_dataset, out, *DROPOUT, "--resume"))  # off: a setting, not refused
    assert end_hash(out) == end_hash(plain)
    assert steps_of(out) == steps_of(plain)
    header = read_log(out)[0]
    assert header["config"]["activation_checkpointing"] is True
    assert all(r["mem_mb"] > 0 for r in read_log(out) if r["type"] == "step")


def test_control_another_seed_ends_elsewhere(tiny_dataset, plain, tmp_path) -> None:
    out = tmp_path / "seed"
    octlm(*train_args(tiny_dataset, out, *DROPOUT, "--activation-checkpointing", "--seed", "7"))
    assert end_hash(out) != end_hash(plain)
