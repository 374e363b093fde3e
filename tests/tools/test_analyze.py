"""`octlm analyze`: unigram entropy against hand and numpy answers; the underflow report's counts,
thresholds and loss scaling on a tiny GPT, and both commands end to end on a real tiny run.
"""

from __future__ import annotations

import math
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from octlm.config.shape import preset
from octlm.data.order import Sampler
from octlm.data.shards import ShardDataset, TokenStream
from octlm.data.windows import StreamWindows
from octlm.errors import OctlmError
from octlm.model.gpt import GPT
from octlm.tools.analyze import (
    FP16_MIN_SUBNORMAL,
    token_counts,
    underflow_for_run,
    underflow_report,
    unigram_entropy,
    unigram_for_data,
)
from tests import octlm_process

CONTEXT = 32


def octlm(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OCTLM_CACHE": "/nonexistent-octlm-cache"}
    return octlm_process.run([*map(str, args)], env, timeout=300)


# -- unigram ----------------------------------------------------------------------------------


def test_unigram_by_hand() -> None:
    stream = TokenStream([np.array([0, 0, 1, 2], np.uint16), np.array([2, 2, 0, 0], np.uint16)])
    p = np.array([4, 1, 3]) / 8  # id 3 of the vocabulary of 4 never occurs
    expected = -sum(x * math.log(x) for x in p)
    assert unigram_entropy(stream, 4) == pytest.approx(expected, rel=1e-12)
    assert unigram_entropy(TokenStream([np.arange(8, dtype=np.uint16)]), 8) == pytest.approx(
        math.log(8)
    )
    assert unigram_entropy(TokenStream([np.zeros(5, np.uint16)]), 3) == 0.0
    assert token_counts(stream, 4, chunk=3).tolist() == [4, 1, 3, 0]  # chunks cross nothing


def test_unigram_errors() -> None:
    with pytest.raises(OctlmError, match="token id 9"):
        unigram_entropy(TokenStream([np.array([1, 9], np.uint16)]), 4)
    with pytest.raises(OctlmError, match="no tokens"):
        unigram_entropy(TokenStream([np.zeros(0, np.uint16)]), 4)


def test_unigram_on_tiny_dataset(tiny_dataset: Path) -> None:
    dataset = ShardDataset.open(tiny_dataset)
    vocab = dataset.manifest["tokenizer"]["vocab_size"]
    tokens = dataset.val.window(0, len(dataset.val))
    p = np.bincount(tokens, minlength=vocab) / len(tokens)
    p = p[p > 0]
    direct = float(-(p * np.log(p)).sum())
    assert unigram_entropy(dataset.val, vocab) == pytest.approx(direct, rel=1e-12)
    small_chunks = token_counts(dataset.val, vocab, chunk=1001)
    assert small_chunks.tolist() == np.bincount(tokens, minlength=vocab).tolist()
    r = unigram_for_data(tiny_dataset)
    assert r["tokens"] == len(dataset.val) and r["bits"] == pytest.approx(direct / math.log(2))
    assert 0 < direct < math.log(vocab)  # below the uniform distribution's entropy


# -- underflow on an in-process model ---------------------------------------------------------


@pytest.fixture(scope="module")
def model_and_batch(tiny_dataset: Path):
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=512, context=CONTEXT))
    train = StreamWindows(ShardDataset.open(tiny_dataset).train, CONTEXT, 1, "")
    sampler = Sampler(train, seed=1, context=CONTEXT, micro_batch=2, accum=2)
    return model, *sampler.batch(0, 0)


def report_for(model_and_batch, **kw):
    model, x, y = model_and_batch
    kw = {"accum": 2, "dtype": "bf16", "device": "cpu", **kw}
    return underflow_report(model, x, y, **kw)


def test_underflow_counts_are_consistent(model_and_batch) -> None:
    model, x, _ = model_and_batch
    r = report_for(model_and_batch)
    assert r.n_tensors == model.num_linear_layers() == 7 * model.config.n_layers
    widths = sum(m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert r.n_elements == x.numel() * widths
    assert sum(r.decades.values()) == r.n_nonzero > 0
    assert sum(row[0] for row in r.by_kind.values()) == r.n_elements
    assert sum(row[1] for row in r.by_kind.values()) == r.n_nonzero
    assert sum(row[2] for row in r.by_kind.values()) == r.n_below_fp16_subnormal
    assert set(r.by_kind) == {"wq", "wk", "wv", "wo", "w1", "w2", "w3"}
    assert r.n_below_bf16_subnormal <= r.n_below_fp16_subnormal <= r.n_below_fp16_normal
    for share in (r.zero_share, r.fp16_subnormal_share, r.fp16_normal_share):
        assert 0.0 <= share <= 1.0
    assert r.bf16_subnormal_share == 0.0  # normal conditions
    assert 0 < r.min_nonzero <= r.max_abs
    decade_low = min(r.decades)
    assert 10.0**decade_low <= r.min_nonzero < 10.0 ** (decade_low + 1)
    assert r.n_targets == x.numel() and r.loss > 0


def test_underflow_leaves_the_model_as_it_was(model_and_batch) -> None:
    model = model_and_batch[0]
    model.eval()
    report_for(model_and_batch)
    assert not model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(not m._forward_hooks for m in model.modules())


def test_underflow_thresholds_respond_to_scale(model_and_batch) -> None:
    down = report_for(model_and_batch, extra_scale=1e-12)
    up = report_for(model_and_batch, extra_scale=1e12)
    assert down.fp16_subnormal_share > 0.9
    assert up.fp16_subnormal_share == 0.0 and up.min_nonzero >= FP16_MIN_SUBNORMAL
    # fp32 gradients reach below BF16's smallest value when pushed there: the control.
    tiny = report_for(model_and_batch, dtype="fp32", extra_scale=1e-36)
    assert tiny.bf16_subnormal_share > 0.0


def test_underflow_loss_scaling_is_exact(model_and_batch) -> None:
    # In fp32, halving the loss by accum=2 halves every gradient exactly (a power of two).
    one = report_for(model_and_batch, dtype="fp32", accum=1)
    two = report_for(model_and_batch, dtype="fp32", accum=2)
    assert one.max_abs == 2 * two.max_abs and one.min_nonzero == 2 * two.min_nonzero
    assert one.n_zero == two.n_zero


# -- end to end on a real run -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tiny_dataset: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("analyze") / "run"
    proc = octlm(
        "train", "--model", "tiny", "--data", tiny_dataset, "--out", out, "--steps", "2",
        "--warmup", "1", "--context", str(CONTEXT), "--micro-batch", "2", "--accum", "2",
        "--val-every", "0", "--val-batches", "1", "--dtype", "bf16", "--device", "cpu",
        "--seed", "5", "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.slow
def test_underflow_on_a_run(tiny_run: Path, tiny_dataset: Path) -> None:
    r = underflow_for_run(tiny_run)
    assert "micro-batch 0 of step 2" in r.source and r.dtype == "bf16" and r.accum == 2
    # The same micro-batch the run would draw next, straight from the Sampler.
    train = StreamWindows(ShardDataset.open(tiny_dataset).train, CONTEXT, 1, "")
    x, _ = Sampler(train, seed=5, context=CONTEXT, micro_batch=2, accum=2).batch(2, 0)
    assert r.n_targets == x.numel()
    assert underflow_for_run(tiny_run, micro_batch=3, step=0).n_targets == 3 * CONTEXT
    with pytest.raises(OctlmError):
        underflow_for_run(tiny_run, micro_batch=0)


@pytest.mark.slow
def test_cli(tiny_run: Path, tiny_dataset: Path, tmp_path: Path) -> None:
    with ThreadPoolExecutor(3) as pool:
        uni, uf, missing = pool.map(
            lambda a: octlm(*a),
            [
                ("analyze", "unigram", tiny_dataset),
                ("analyze", "underflow", tiny_run, "--dtype", "fp32"),
                ("analyze", "underflow", tmp_path / "nope"),
            ],
        )
    assert uni.returncode == 0, uni.stderr
    nats = unigram_entropy(ShardDataset.open(tiny_dataset).val, 512)
    assert f"unigram entropy {nats:.4f} nats/token" in uni.stdout
    assert uf.returncode == 0, uf.stderr
    assert "28 Linear outputs" in uf.stdout and "autocast fp32" in uf.stdout
    assert "below FP16's smallest subnormal" in uf.stdout and "1e-" in uf.stdout
    assert missing.returncode == 1
    assert missing.stderr.startswith("octlm: error: ") and len(missing.stderr.splitlines()) == 1
    with pytest.raises(OctlmError, match="not a folder"):
        unigram_for_data(tmp_path / "nope")
