"""--packing bos and --doc-mask resume exactly: stopped and resumed in a new process (random and
epoch orders, with and without the mask), and across world sizes (2 DDP processes -> 1 and
1 -> 2), each run ends on its straight run's bits. Controls that must differ: the same run with
stream windows, and with the mask off. Changing the packing on resume is refused in one line.

The data: speeches as documents (the first works cut at blank lines, tens of tokens each,
encoded with the tiny dataset's tokenizer), so rows can start at documents; the tiny dataset's
whole plays could not. Every run is a real `python -m octlm train` subprocess (torchrun with
gloo for 2 processes).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from octlm.data.shards import ShardDataset
from octlm.runlog.reader import read_log
from octlm.trainer import checkpoint as ckpt
from tests.e2e.helpers import (
    DIST_FLAGS,
    DIST_STEPS,
    assert_same_run,
    dist_args,
    end_hash,
    octlm,
    steps_of,
    train_args,
)
from tests.shared import shared

pytestmark = pytest.mark.slow

BOS = ("--packing", "bos")
MASKED = (*BOS, "--doc-mask", "--order", "epoch")


@pytest.fixture(scope="module")
def run_of(speeches, tmp_path_factory):
    """`run_of(*extra)`: the straight run of `train_args` + `extra` on the speeches (read-only)."""

    def get(*extra: str) -> Path:
        key = "bos_straight" + "".join(f"_{x.lstrip('-')}" for x in extra)
        build = lambda folder: octlm(*train_args(speeches, folder / "run", *extra))  # noqa: E731
        return shared(tmp_path_factory, key, build) / "run"

    return get


def header(run: Path) -> dict:
    return next(r for r in read_log(run) if r["type"] == "header")


def weights(run: Path) -> dict[str, torch.Tensor]:
    path, sha = ckpt.find_checkpoint(run)
    return ckpt.split_tensors(ckpt.load_checkpoint(path, sha)[1], "model.")


@pytest.mark.parametrize("extra", [BOS, MASKED], ids=["bos", "bos-doc-mask-epoch"])
def test_split_equals_straight(speeches, run_of, tmp_path, extra) -> None:
    split = tmp_path / "split"
    stop = octlm(*train_args(speeches, split, "--stop-at", "4", *extra))
    assert "BOS-aligned rows" in stop.stderr
    octlm(*train_args(speeches, split, "--resume", *extra))
    assert_same_run(split, run_of(*extra))


def test_rows_start_at_documents_and_the_header_says_so(speeches, run_of) -> None:
    record = header(run_of(*BOS))["packing"]["train"]
    assert record["packing"] == "bos" and record["cropped"] == record["padded"] == 0
    # At most one row per document can start at it (many speeches outgrow a row of 33
    # tokens); stream windows at any offset start at one about once per document's length.
    split = ShardDataset.open(speeches).manifest["splits"]["train"]
    possible = min(1.0, split["documents"] / record["rows"])
    assert record["rows_at_document_start"] >= 0.9 * possible
    assert possible > 10 * split["documents"] / split["tokens"]
    assert header(run_of(*BOS))["config"]["packing"] == "bos"


def test_controls_stream_windows_and_the_mask_change_the_run(run_of) -> None:
    assert len({end_hash(run_of()), end_hash(run_of(*BOS)), end_hash(run_of(*MASKED))}) == 3
    masked_epoch = run_of(*BOS, "--order", "epoch")
    assert end_hash(masked_epoch) != end_hash(run_of(*MASKED))  # the mask alone acts


def test_a_resume_that_changes_the_packing_is_refused(speeches, tmp_path) -> None:
    out = tmp_path / "run"
    octlm(*train_args(speeches, out, "--stop-at", "3", *BOS))
    proc = octlm(*train_args(speeches, out, "--resume"), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "packing" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("direction", ["2to1", "1to2"])
def test_resume_across_world_sizes(speeches, run_of, tmp_path, direction) -> None:
    single = run_of(*DIST_FLAGS, "--accum", "2", *MASKED)
    out = tmp_path / direction
    first, second = (("--nproc", "2"), ()) if direction == "2to1" else ((), ("--nproc", "2"))
    accum = ("--accum", "1" if first else "2")
    octlm(*dist_args(speeches, out, *accum, *first, "--stop-at", "3", *MASKED))
    shutil.copytree(out, tmp_path / "stopped")
    proc = octlm(*dist_args(speeches, out, *accum, *second, "--resume", *MASKED))
    assert "to keep the global batch" in proc.stderr
    assert [s for s, _, _ in steps_of(out)] == list(range(1, DIST_STEPS + 1))
    # The same rows in the same order on either world, and the tree's sums: bitwise.
    a, b = weights(single), weights(out)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) == 0.0
