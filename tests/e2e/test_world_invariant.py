"""The same bits on any process count (`--reduction tree`, the default): real torchrun, gloo.

A tiny run with dropout 0.1 and a global batch of 4 micro-batches, computed as processes x
accumulation 1x4, 2x2 and 4x1, under DDP's layout and FSDP2, with AdamW and with the shipped
recipe's options (Muon): the weights, the optimizer's tensors, every logged loss, gradient
norm and validation loss are identical. Every process runs one thread (conftest sets
OMP_NUM_THREADS=1, the launcher gives each worker one): the CPU kernels' sums depend on it.
Controls: the collective reduction at 4x1 differs from 1x4; an old (collective) run folder
resumes on its own reduction.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from octlm.trainer import checkpoint as ckpt
from tests.e2e.helpers import DIST_FLAGS, end_hash, octlm, read_log, steps_of
from tests.e2e.helpers import DIST_STEPS as STEPS
from tests.e2e.helpers import dist_args as args
from tests.e2e.test_recipe import SHIPPED_OPTIONS

pytestmark = pytest.mark.slow

DROPOUT = ("--dropout", "0.1")
LAYOUTS = {"1x4": ("--accum", "4"), "2x2": ("--accum", "2", "--nproc", "2")}
LAYOUTS["4x1"] = ("--accum", "1", "--nproc", "4")


def state_tensors(run: Path) -> dict[str, torch.Tensor]:
    """The newest checkpoint's weights and optimizer tensors (not the generators: a layout
    has one state per process)."""
    path, sha = ckpt.find_checkpoint(run)
    tensors = ckpt.load_checkpoint(path, sha)[1]
    return {k: v for k, v in tensors.items() if k.startswith((ckpt.MODEL_PREFIX, "optim."))}


def vals(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["val_loss"]) for r in read_log(run) if r["type"] == "val"]


def assert_same_run(a: Path, b: Path) -> None:
    assert end_hash(a) == end_hash(b)
    assert steps_of(a) == steps_of(b) and len(steps_of(a)) == STEPS
    assert vals(a) == vals(b) and vals(a)
    sa, sb = state_tensors(a), state_tensors(b)
    assert sa.keys() == sb.keys() and any(k.startswith("optim.") for k in sa)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def one_process(straight_run):
    """The 1x4 reference of each optimizer setting (shared by the session's workers)."""
    return {
        "adamw": straight_run(*DIST_FLAGS, *DROPOUT, *LAYOUTS["1x4"]),
        "recipe": straight_run(*DIST_FLAGS, *DROPOUT, *SHIPPED_OPTIONS, *LAYOUTS["1x4"]),
    }


CASES = [
    ("ddp", "adamw", "2x2"),
    ("ddp", "adamw", "4x1"),
    ("ddp", "recipe", "4x1"),
    ("fsdp", "adamw", "2x2"),
    ("fsdp", "recipe", "4x1"),
]


@pytest.mark.parametrize(("parallel", "optim", "layout"), CASES)
def test_every_layout_of_the_global_batch_gives_the_same_bits(
    tiny_dataset, one_process, tmp_path, parallel, optim, layout
) -> None:
    extra = (*DROPOUT, *(SHIPPED_OPTIONS if optim == "recipe" else ()), "--parallel", parallel)
    out = tmp_path / layout
    octlm(*args(tiny_dataset, out, *extra, *LAYOUTS[layout]))
    assert f'"world": {layout[0]}' in (out / "log.jsonl").read_text().splitlines()[0]
    assert_same_run(out, one_process[optim])


def test_stopped_on_4_resumed_on_2_then_on_1_ends_on_the_straight_run(
    tiny_dataset, one_process, tmp_path
) -> None:
    out = tmp_path / "elastic"
    octlm(*args(tiny_dataset, out, *DROPOUT, *LAYOUTS["4x1"], "--stop-at", "2"))
    proc = octlm(*args(tiny_dataset, out, *DROPOUT, *LAYOUTS["4x1"][:2], "--nproc", "2",
                       "--stop-at", "4", "--resume"))  # fmt: skip
    assert "written by 4 process(es), resumed by 2" in proc.stderr
    assert "the tree reduction sums in the same order: bitwise" in proc.stderr
    proc = octlm(*args(tiny_dataset, out, *DROPOUT, "--accum", "1", "--resume"))
    assert "resumed by 1" in proc.stderr and "(seed, step, micro-batch)" in proc.stderr
    assert_same_run(out, one_process["adamw"])


def test_stopped_on_1_resumed_on_4_ends_on_the_straight_run(
    tiny_dataset, one_process, tmp_path
) -> None:
    out = tmp_path / "grow"
    octlm(*args(tiny_dataset, out, *DROPOUT, *LAYOUTS["1x4"], "--stop-at", "3"))
    octlm(*args(tiny_dataset, out, *DROPOUT, "--accum", "4", "--nproc", "4", "--resume"))
    assert_same_run(out, one_process["adamw"])


def test_the_collective_reduction_follows_the_process_count(
    tiny_dataset, straight_run, tmp_path
) -> None:
    """The control: the same global batch under DDP's own sums, 4x1 against 1x4, differs (in
    the gradient norms first: four terms summed in another grouping)."""
    collective = ("--reduction", "collective", *DROPOUT)
    one = straight_run(*DIST_FLAGS, *collective, *LAYOUTS["1x4"])
    four = tmp_path / "four"
    octlm(*args(tiny_dataset, four, *collective, *LAYOUTS["4x1"]))
    assert steps_of(four) != steps_of(one)
    assert end_hash(four) != end_hash(one)


def test_a_collective_run_folder_resumes_on_its_own_reduction(
    tiny_dataset, straight_run, tmp_path
) -> None:
    """A folder written before the tree existed has no `reduction` in its fingerprint (the
    collective's fingerprint is the old one): resumed without the flag, it keeps the collective
    sums and ends on its straight run; asked for the tree, it is refused in one line."""
    collective = ("--reduction", "collective", "--accum", "4")
    straight = straight_run(*DIST_FLAGS, *collective)
    out = tmp_path / "old"
    octlm(*args(tiny_dataset, out, *collective, "--stop-at", "3"))
    header = json.loads((out / "log.jsonl").read_text().splitlines()[0])
    assert header["config"]["reduction"] == "collective"

    def files() -> list[tuple[str, int]]:  # the run's lock is taken (and let go) by any start
        return sorted((p.name, p.stat().st_mtime_ns) for p in out.rglob("*") if p.name != ".lock")

    before = files()
    refused = octlm(*args(tiny_dataset, out, "--accum", "4", "--reduction", "tree", "--resume"),
                    check=False)  # fmt: skip
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "--reduction 'collective' -> 'tree'" in refused.stderr  # named as typed
    assert files() == before
    octlm(*args(tiny_dataset, out, "--accum", "4", "--resume"))
    assert end_hash(out) == end_hash(straight)
    assert steps_of(out) == steps_of(straight)


def test_a_process_count_that_splits_a_subtree_is_refused_in_one_line(
    tiny_dataset, tmp_path
) -> None:
    out = tmp_path / "three"
    proc = octlm(*args(tiny_dataset, out, "--accum", "2", "--nproc", "3"), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "3 processes cannot share the step's 6 micro-batches" in proc.stderr
    assert "use 1, 2, 6 process(es)" in proc.stderr
    assert not (out / ckpt.CKPT_DIR).exists()
