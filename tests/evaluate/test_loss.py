"""Tests for octlm.evaluate.loss: the validation loss and bits per byte match a hand computation, do
not depend on batching, and evaluation leaves the RNG and the train/eval mode as it found them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from octlm.data.shards import ShardDataset, TokenStream
from octlm.data.windows import StreamWindows, first_windows
from octlm.evaluate.loss import ValidationSet, validate
from octlm.model.gpt import GPT
from octlm.tokenizer.core import Tokenizer
from tests.unit_model import unit_config

CONTEXT = 32
CPU = torch.device("cpu")


def tiny(dropout: float = 0.0):
    return unit_config(CONTEXT, dropout=dropout)


def make_model(dropout: float = 0.0, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny(dropout))


@pytest.fixture(scope="module")
def val_data(tiny_dataset) -> tuple[TokenStream, Tokenizer, np.ndarray]:
    dataset = ShardDataset.open(tiny_dataset)
    tokenizer = Tokenizer.load(dataset.tokenizer_path)  # the tokenizer the shards were cut with
    assert tokenizer.vocab_size == 512
    windows = StreamWindows(dataset.val, CONTEXT, CONTEXT, dataset.fingerprint)
    starts = first_windows(windows, 10) * windows.stride
    assert len(starts) == 10
    return dataset.val, tokenizer, starts


def run_eval(model, stream, tokenizer, starts, micro_batch: int = 4, dtype: str = "fp32"):
    """Score the windows of CONTEXT + 1 tokens at `starts` (multiples of CONTEXT)."""
    windows = StreamWindows(stream, CONTEXT, CONTEXT, "")
    indices = np.asarray(starts, dtype=np.int64) // CONTEXT
    assert np.array_equal(indices * CONTEXT, starts)
    val = ValidationSet(windows, indices, micro_batch, tokenizer.token_bytes_table)
    return validate(model, val, device=CPU, dtype=dtype)


def by_hand(
    model: GPT, stream: TokenStream, tokenizer: Tokenizer, starts
) -> tuple[float, int, int]:
    """(total nats, targets, bytes) window by window, in float64."""
    nats, n, n_bytes = 0.0, 0, 0
    model.eval()
    with torch.no_grad():
        for s in starts:
            w = torch.from_numpy(stream.window(int(s), CONTEXT + 1))
            x, y = w[:-1], w[1:]
            logits = model(x[None])[0].double()
            nats += float(F.cross_entropy(logits, y, reduction="sum"))
            n += len(y)
            n_bytes += sum(tokenizer.token_bytes(int(t)) for t in y)
    return nats, n, n_bytes


def test_val_loss_is_the_mean_cross_entropy_over_the_windows(val_data) -> None:
    stream, tokenizer, starts = val_data
    model = make_model()
    result = run_eval(model, stream, tokenizer, starts)  # 10 windows in batches of 4, 4, 2
    nats, n, _ = by_hand(model, stream, tokenizer, starts)
    assert result.tokens == n == 10 * CONTEXT
    assert result.loss == pytest.approx(nats / n, rel=1e-6)
    assert result.ppl == pytest.approx(math.exp(nats / n), rel=1e-6)
    assert 5.0 < result.loss < 7.5  # near ln(512) = 6.24 for a random init


def test_bits_per_byte_is_total_nats_over_ln2_times_total_bytes(val_data) -> None:
    stream, tokenizer, starts = val_data
    model = make_model()
    result = run_eval(model, stream, tokenizer, starts)
    nats, _, n_bytes = by_hand(model, stream, tokenizer, starts)
    assert result.bytes == n_bytes > 0
    assert result.bpb == pytest.approx(nats / (math.log(2) * n_bytes), rel=1e-6)
    # Not the mean of per-window bpb values: the two differ when windows differ in bytes.
    per_window = [by_hand(model, stream, tokenizer, [s]) for s in starts]
    mean_of_ratios = np.mean([w[0] / (math.log(2) * w[2]) for w in per_window])
    assert {w[2] for w in per_window} != {per_window[0][2]}
    assert abs(mean_of_ratios - result.bpb) > 1e-6


@pytest.mark.parametrize("micro_batch", [1, 3, 10, 64])
def test_results_do_not_depend_on_the_batching(val_data, micro_batch: int) -> None:
    stream, tokenizer, starts = val_data
    model = make_model()
    reference = run_eval(model, stream, tokenizer, starts, micro_batch=4)
    result = run_eval(model, stream, tokenizer, starts, micro_batch=micro_batch)
    assert (result.tokens, result.bytes) == (reference.tokens, reference.bytes)
    assert result.loss == pytest.approx(reference.loss, rel=1e-6)
    assert result.bpb == pytest.approx(reference.bpb, rel=1e-6)


def test_evaluation_leaves_the_rng_alone_and_restores_train_mode(val_data) -> None:
    stream, tokenizer, starts = val_data
    model = make_model(dropout=0.3)
    model.train()
    rng = torch.get_rng_state()
    result = run_eval(model, stream, tokenizer, starts)
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training
    assert all(m.training for m in model.modules())
    # Dropout was off during evaluation: the numbers equal a dropout-free eval-mode pass.
    nats, n, _ = by_hand(model, stream, tokenizer, starts)
    assert result.loss == pytest.approx(nats / n, rel=1e-6)
    # Repeating it gives the same bits, which dropout in train mode would not.
    model.train()
    assert run_eval(model, stream, tokenizer, starts).loss == result.loss


def test_evaluation_keeps_an_eval_model_in_eval_mode(val_data) -> None:
    stream, tokenizer, starts = val_data
    model = make_model()
    model.eval()
    run_eval(model, stream, tokenizer, starts)
    assert not model.training


def test_bf16_evaluation_is_close_to_fp32(val_data) -> None:
    stream, tokenizer, starts = val_data
    model = make_model()
    fp32 = run_eval(model, stream, tokenizer, starts)
    bf16 = run_eval(model, stream, tokenizer, starts, dtype="bf16")
    assert bf16.tokens == fp32.tokens
    assert bf16.loss == pytest.approx(fp32.loss, rel=1e-2)
