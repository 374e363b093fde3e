"""Tests for octlm.trainer.inputs: `windows` builds each split's source from the config (which
windows a stream offers follows the data order), refuses a stream too short for the run, and the
validation set and the data fingerprint come from the windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from octlm.config.train import TrainConfig
from octlm.data.blocks import TokenBlocks
from octlm.data.shards import ShardDataset, TokenStream
from octlm.data.windows import StreamWindows
from octlm.errors import OctlmError
from octlm.trainer.distributed import DistInfo
from octlm.trainer.inputs import build_sampler, packing_record, validation_set, windows

T = 8


def dataset_of(n_train: int, n_val: int = 100) -> ShardDataset:
    """An in-memory dataset: tokens 0, 1, 2, ... in each split."""
    train = TokenStream([np.arange(n_train, dtype=np.uint16)])
    val = TokenStream([np.arange(n_val, dtype=np.uint16)])
    return ShardDataset(Path("memory"), {"fingerprint": "fp-data"}, train, val)


def config(**kw) -> TrainConfig:
    return TrainConfig(**{"model": "micro", "context": T, "micro_batch": 2, "accum": 1, **kw})


@pytest.mark.parametrize(
    ("kw", "stride"),
    [({}, 1), ({"order": "epoch"}, T + 1), ({"overfit_blocks": 3}, T + 1)],
)
def test_a_streams_windows_follow_the_data_order(kw, stride, tiny_tokenizer) -> None:
    dataset = dataset_of(10 * (T + 1))
    train = windows(config(**kw), dataset, tiny_tokenizer, "train")
    assert isinstance(train, StreamWindows) and train.stride == stride
    assert train.stream is dataset.train and train.fingerprint == dataset.fingerprint
    val = windows(config(**kw), dataset, tiny_tokenizer, "val")
    assert isinstance(val, StreamWindows) and (val.stream, val.stride) == (dataset.val, T)


def test_a_stream_too_short_for_the_run_is_refused(tiny_tokenizer) -> None:
    width = T + 1
    exact = dataset_of(3 * width)
    windows(config(overfit_blocks=3), exact, tiny_tokenizer, "train")
    # One token short of the three blocks --overfit-blocks memorises.
    with pytest.raises(OctlmError, match="too short"):
        windows(config(overfit_blocks=3), dataset_of(3 * width - 1), tiny_tokenizer, "train")
    for kw in ({}, {"order": "epoch"}):  # not one window
        with pytest.raises(OctlmError, match=f"stream of {T} tokens is too short for context"):
            windows(config(**kw), dataset_of(T), tiny_tokenizer, "train")


def test_blocks_are_the_training_windows_and_their_own_validation_set(
    tiny_tokenizer, tmp_path
) -> None:
    text = tmp_path / "play.txt"
    text.write_text("To be, or not to be, that is the question. " * 20)
    dataset = dataset_of(1000)
    cfg = config(blocks=str(text), overfit_blocks=4)
    train = windows(cfg, dataset, tiny_tokenizer, "train")
    assert isinstance(train, TokenBlocks) and len(train) == 4
    assert train.fingerprint != dataset.fingerprint  # the run's data is the text
    val = validation_set(cfg, train, windows(cfg, dataset, tiny_tokenizer, "val"), tiny_tokenizer)
    assert val.windows is train and val.indices.tolist() == [0, 1, 2, 3]
    assert packing_record(train, val.windows) is None


def test_validation_reads_the_val_splits_first_windows_or_the_memorised_ones(
    tiny_tokenizer,
) -> None:
    dataset = dataset_of(50 * (T + 1), n_val=5 * T + 1)
    for kw, expected_split, expected in [
        ({"val_batches": 2}, "val", [0, 1, 2, 3]),
        ({"val_batches": 9}, "val", [0, 1, 2, 3, 4]),  # all five windows of the split
        ({"overfit_blocks": 3}, "train", [0, 1, 2]),
    ]:
        cfg = config(**kw)
        train, val = (windows(cfg, dataset, tiny_tokenizer, s) for s in ("train", "val"))
        scored = validation_set(cfg, train, val, tiny_tokenizer)
        assert scored.windows is (val if expected_split == "val" else train)
        assert scored.indices.tolist() == expected


def test_the_sampler_draws_from_the_training_windows(tiny_tokenizer) -> None:
    dataset = dataset_of(20 * (T + 1))
    cfg = config(order="epoch", overfit_blocks=5)
    sampler = build_sampler(cfg, windows(cfg, dataset, tiny_tokenizer, "train"), DistInfo())
    assert sampler.n_positions == 5
    x, _ = sampler.batch(0, 0)
    assert set((x[:, 0] // (T + 1)).tolist()) <= set(range(5))
