"""--data A:0.7,B:0.3 resumes exactly: a weighted mixture of two prepared datasets, stopped
inside an epoch of one source and across the other's epoch edge, ends on its straight run's
bits; so does a stop on 2 DDP processes resumed on 1 (and 1 -> 2). Controls that must differ:
other weights. A resume with other weights, and a dataset with another tokenizer, are refused
in one line. Validation is logged per dataset and over both. Every run is a real
`python -m octlm train` subprocess (torchrun with gloo for 2 processes).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

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

EPOCH = ("--order", "epoch")


@pytest.fixture(scope="module")
def mix(tiny_dataset, few_speeches):
    """`mix(a, b)`: the --data spec of the plays at weight a and the few speeches at b."""
    return lambda a, b: f"{tiny_dataset}:{a},{few_speeches}:{b}"


@pytest.fixture(scope="module")
def run_of(tiny_dataset, tmp_path_factory):
    """`run_of(data, *extra)`: the straight run of `train_args` on `data` (read-only)."""

    def get(data: str, *extra: str) -> Path:
        key = "mix_straight_" + hashlib.sha256(repr((data, extra)).encode()).hexdigest()[:16]

        def build(folder: Path) -> None:
            octlm(*train_args(Path(data), folder / "run", *extra))

        return shared(tmp_path_factory, key, build) / "run"

    return get


def epochs(run: Path) -> list[dict[str, int]]:
    return [r["epoch"] for r in read_log(run) if r["type"] == "step"]


def test_split_inside_one_epoch_and_across_the_others_edge(mix, run_of, tmp_path) -> None:
    data = mix(0.5, 0.5)  # the few speeches' 14 windows: a new epoch after about 7 steps
    straight = run_of(data, *EPOCH)
    seen = epochs(straight)
    names = list(seen[0])  # both folders are named "data": the log names them by path
    assert names == [p.rsplit(":", 1)[0] for p in data.split(",")]
    # Stopped at step 4: the plays are inside their first epoch at both ends, the few
    # speeches start a new epoch between the stop and the end.
    assert all(e[names[0]] == 0 for e in seen)
    assert seen[3][names[1]] < seen[-1][names[1]]
    split = tmp_path / "split"
    octlm(*train_args(Path(data), split, "--stop-at", "4", *EPOCH))
    proc = octlm(*train_args(Path(data), split, "--resume", *EPOCH))
    assert "resumed from" in proc.stderr
    assert_same_run(split, straight)


def test_random_order_split_equals_straight_and_weights_act(mix, run_of, tmp_path) -> None:
    data = mix(0.7, 0.3)
    split = tmp_path / "split"
    octlm(*train_args(Path(data), split, "--stop-at", "5"))
    octlm(*train_args(Path(data), split, "--resume"))
    assert_same_run(split, run_of(data))
    assert end_hash(run_of(mix(0.5, 0.5))) != end_hash(run_of(data))  # the weights act
    assert end_hash(run_of(mix(7, 3))) == end_hash(run_of(data))  # only their ratio counts


def test_validation_is_logged_per_dataset_and_over_both(mix, run_of) -> None:
    vals = [r for r in read_log(run_of(mix(0.7, 0.3))) if r["type"] == "val"]
    assert vals
    for v in vals:
        per = {k: x for k, x in v.items() if k.startswith("val_bpb/")}
        assert len(per) == 2
        assert min(per.values()) <= v["val_bpb"] <= max(per.values())


def test_a_resume_with_other_weights_is_refused(mix, tmp_path) -> None:
    out = tmp_path / "run"
    octlm(*train_args(Path(mix(0.7, 0.3)), out, "--stop-at", "3"))
    proc = octlm(*train_args(Path(mix(0.6, 0.4)), out, "--resume"), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "data" in proc.stderr.strip().splitlines()[-1]


def test_a_dataset_with_another_tokenizer_is_refused(tiny_dataset, tmp_path) -> None:
    other = tmp_path / "other"
    text = tmp_path / "t.txt"
    text.write_text("Some words, and some more words. " * 400, encoding="utf-8")
    octlm("prepare", str(text), "--out", str(other), "--vocab-size", "300", "--context", "32",
          "--split-on", ".", "--workers", "1")  # fmt: skip
    proc = octlm(*train_args(Path(f"{tiny_dataset}:1,{other}:1"), tmp_path / "r"), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "another tokenizer" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("direction", ["2to1", "1to2"])
def test_resume_across_world_sizes(mix, run_of, tmp_path, direction) -> None:
    data = mix(0.7, 0.3)
    single = run_of(data, *DIST_FLAGS, "--accum", "2", *EPOCH)
    out = tmp_path / direction
    first, second = (("--nproc", "2"), ()) if direction == "2to1" else ((), ("--nproc", "2"))
    accum = ("--accum", "1" if first else "2")
    octlm(*dist_args(Path(data), out, *accum, *first, "--stop-at", "3", *EPOCH))
    shutil.copytree(out, tmp_path / "stopped")
    proc = octlm(*dist_args(Path(data), out, *accum, *second, "--resume", *EPOCH))
    assert "to keep the global batch" in proc.stderr
    assert [s for s, _, _ in steps_of(out)] == list(range(1, DIST_STEPS + 1))
    a, b = (ckpt.split_tensors(ckpt.load_checkpoint(*ckpt.find_checkpoint(r))[1], "model.")
            for r in (single, out))  # fmt: skip
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) == 0.0
