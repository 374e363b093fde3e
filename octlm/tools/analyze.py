"""`octlm analyze`: the unigram-entropy baseline of a dataset, and FP16/BF16 gradient underflow.

The unigram entropy is the loss of a model that knows only how often each token occurs. The
underflow report records the gradient flowing into every nn.Linear output for one real
micro-batch, scaled as in an accumulated training step, and counts what FP16 would flush.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from octlm.config.checks import shown_path
from octlm.config.train import TrainConfig, config_keys
from octlm.data.dataset_tokenizer import dataset_tokenizer
from octlm.data.order import Sampler
from octlm.data.shards import ShardDataset, TokenStream
from octlm.device import autocast, check_dtype
from octlm.errors import OctlmError
from octlm.generation.trained import load_model, run_dataset
from octlm.trainer.checkpoint import CheckpointInfo
from octlm.trainer.distributed import DistInfo
from octlm.trainer.inputs import build_sampler, windows

FP16_MIN_SUBNORMAL = 2.0**-24  # smaller magnitudes flush to zero in FP16
FP16_MIN_NORMAL = 2.0**-14  # below this FP16 keeps fewer significant bits
BF16_MIN_SUBNORMAL = 2.0**-133
_CHUNK = 1 << 24  # tokens counted at once: a 32 MiB slice of a uint16 memmap


def token_counts(stream: TokenStream, vocab_size: int, chunk: int = _CHUNK) -> np.ndarray:
    """Occurrences of each id in the stream, read shard by shard, `chunk` tokens at a time."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for shard in stream.shards:
        for start in range(0, len(shard), chunk):
            part = np.bincount(np.asarray(shard[start : start + chunk]), minlength=vocab_size)
            if len(part) > vocab_size:
                raise OctlmError(
                    f"the stream holds token id {len(part) - 1} >= vocabulary {vocab_size}",
                    "re-run `octlm prepare`",
                )
            counts += part
    return counts


def unigram_entropy(stream: TokenStream, vocab_size: int) -> float:
    """H = -sum p log p (nats) of the stream's token frequencies."""
    return entropy_of_counts(token_counts(stream, vocab_size))


def entropy_of_counts(counts: np.ndarray) -> float:
    total = counts.sum()
    if total == 0:
        raise OctlmError("the stream holds no tokens", "prepare a dataset with a validation split")
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())


def unigram_for_data(data_dir: str | Path) -> dict[str, Any]:
    """The validation split's unigram entropy of a prepared dataset folder."""
    root = Path(data_dir)
    if not root.is_dir():
        raise OctlmError(
            f"{shown_path(root)} is not a folder", "name a dataset folder made by `octlm prepare`"
        )
    dataset = ShardDataset.open(root)
    vocab = int(dataset.manifest["tokenizer"]["vocab_size"])
    counts = token_counts(dataset.val, vocab)
    nats = entropy_of_counts(counts)
    return {
        "data": str(root),
        "vocab_size": vocab,
        "tokens": int(counts.sum()),
        "distinct": int((counts > 0).sum()),
        "nats": nats,
        "bits": nats / math.log(2),
    }


def format_unigram(r: dict[str, Any]) -> str:
    return (
        f"{r['data']}  val split: {r['tokens']:,} tokens, {r['distinct']:,} of {r['vocab_size']:,} "
        f"ids used\nunigram entropy {r['nats']:.4f} nats/token ({r['bits']:.4f} bits): the loss "
        "of a model that knows only each token's frequency"
    )


@dataclass
class UnderflowReport:
    """Counts over every element of every recorded gradient; shares are derived from them."""

    dtype: str
    accum: int
    n_targets: int
    loss: float
    n_tensors: int = 0
    n_elements: int = 0
    n_zero: int = 0
    n_below_fp16_subnormal: int = 0
    n_below_fp16_normal: int = 0
    n_below_bf16_subnormal: int = 0
    min_nonzero: float | None = None
    max_abs: float = 0.0
    decades: Counter = field(default_factory=Counter)
    """floor(log10 |g|) -> count, over the nonzero elements."""
    by_kind: dict[str, list[int]] = field(default_factory=dict)
    """Module kind (wq, w1, ...) -> [elements, nonzero, nonzero below FP16's smallest value]."""
    source: str = ""

    @property
    def n_nonzero(self) -> int:
        return self.n_elements - self.n_zero

    @property
    def zero_share(self) -> float:
        return self.n_zero / self.n_elements if self.n_elements else 0.0

    def share(self, count: int) -> float:
        """A count as a share of the NONZERO elements."""
        return count / self.n_nonzero if self.n_nonzero else 0.0

    @property
    def fp16_subnormal_share(self) -> float:
        return self.share(self.n_below_fp16_subnormal)

    @property
    def fp16_normal_share(self) -> float:
        return self.share(self.n_below_fp16_normal)

    @property
    def bf16_subnormal_share(self) -> float:
        return self.share(self.n_below_bf16_subnormal)

    @torch.no_grad()
    def add(self, kind: str, grad: Tensor) -> None:
        a = grad.detach().float().abs().flatten()  # bf16/fp16 -> fp32 is exact
        nonzero = a[a != 0]
        n, nz = a.numel(), nonzero.numel()
        below16 = int((nonzero < FP16_MIN_SUBNORMAL).sum())
        self.n_tensors += 1
        self.n_elements += n
        self.n_zero += n - nz
        self.n_below_fp16_subnormal += below16
        self.n_below_fp16_normal += int((nonzero < FP16_MIN_NORMAL).sum())
        self.n_below_bf16_subnormal += int((nonzero < BF16_MIN_SUBNORMAL).sum())
        row = self.by_kind.setdefault(kind, [0, 0, 0])
        row[0], row[1], row[2] = row[0] + n, row[1] + nz, row[2] + below16
        if nz:
            low = float(nonzero.min())
            self.min_nonzero = low if self.min_nonzero is None else min(self.min_nonzero, low)
            self.max_abs = max(self.max_abs, float(nonzero.max()))
            exps = torch.floor(torch.log10(nonzero.double())).long()  # float64: exact decades
            values, counts = torch.unique(exps, return_counts=True)
            self.decades.update(dict(zip(values.tolist(), counts.tolist(), strict=True)))


def underflow_report(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    *,
    accum: int,
    dtype: str,
    device: torch.device | str,
    extra_scale: float = 1.0,
    segments: Tensor | None = None,
) -> UnderflowReport:
    """Gradients into every nn.Linear output for one micro-batch inside an accumulated step.

    The loss is loss_sum / (n_targets * accum), as train_step scales one of `accum` equal
    micro-batches. `extra_scale` multiplies it further (to probe the thresholds). Parameter
    `.grad`s are left untouched: the backward asks only for the embedding's gradient, which
    every Linear output lies on the path to.
    """
    check_dtype(dtype)
    device = torch.device(device)
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise OctlmError("the model has no nn.Linear layers", "analyze a GPT checkpoint")
    report = UnderflowReport(dtype=dtype, accum=accum, n_targets=0, loss=math.nan)

    def record(kind: str):
        def forward_hook(_module: nn.Module, _inp: Any, out: Tensor) -> None:
            out.register_hook(lambda g: report.add(kind, g))

        return forward_hook

    handles = [m.register_forward_hook(record(name.rsplit(".", 1)[-1])) for name, m in linears]
    was_training = model.training
    model.train()  # as in training (dropout, if any, is active)
    try:
        with autocast(device, dtype):
            extra = () if segments is None else (segments.to(device),)
            loss_sum, n_targets = model(inputs.to(device), targets.to(device), *extra)
        n = int(n_targets)
        if n == 0:
            raise OctlmError("the micro-batch has no real targets", "use another micro-batch")
        report.n_targets, report.loss = n, float(loss_sum.detach()) / n
        loss = loss_sum / (n * accum) * extra_scale
        embedding = model.get_submodule("tok_embeddings").weight
        torch.autograd.grad(loss, [embedding])
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return report


def underflow_for_run(
    run_or_ckpt: str | Path,
    *,
    micro_batch: int | None = None,
    dtype: str | None = None,
    device: str = "cpu",
    step: int | None = None,
) -> UnderflowReport:
    """The report for a run's checkpoint, on micro-batch 0 of a training step of its own data.

    The step defaults to the one the checkpoint would take next, so the gradient is the one
    training was about to compute; micro_batch, dtype, context, accum and seed are the run's.
    """
    if micro_batch is not None and micro_batch < 1:
        raise OctlmError(f"--micro-batch {micro_batch} holds no sequence", "use 1 or more")
    if step is not None and step < 0:
        raise OctlmError(f"--step {step} is negative", "use a step >= 0")
    model, info = load_model(run_or_ckpt, device=device)
    cfg = info.config
    if not cfg:
        raise OctlmError(
            f"{shown_path(info.path)} holds no training config (a weights-only snapshot?)",
            "name the run folder or one of its full checkpoints",
        )
    step = info.step if step is None else step
    sampler = run_sampler(info, micro_batch)
    inputs, targets, *segments = sampler.batch(step, 0)
    report = underflow_report(
        model,
        inputs,
        targets,
        segments=segments[0] if segments else None,
        accum=cfg["accum"],
        dtype=dtype or cfg["dtype"],
        device=next(model.parameters()).device,
    )
    report.source = (
        f"{info.path} (trained {info.step} steps): micro-batch 0 of "
        f"step {step}, {inputs.shape[0]}x{inputs.shape[1]} tokens of {info.data_dir}"
        + ("  [note: the run trained on in-memory --blocks]" if cfg["blocks"] else "")
    )
    return report


def run_sampler(info: CheckpointInfo, micro_batch: int | None) -> Sampler:
    """The sampler of a checkpoint's run over its own training windows (with every rank's
    micro-batches: micro-batch 0 is the step's first slice), at `micro_batch` if given."""
    # A key written before its setting existed takes the default that means what the run did
    # ("order" absent: random; CheckpointInfo.config). --blocks runs are drawn from the dataset's
    # stream (the report's source line says so): their text file may be gone.
    saved = info.config or {}
    cfg = TrainConfig(**{k: v for k, v in saved.items() if k in config_keys()})
    dataset = run_dataset(info)
    train = windows(cfg.replace(blocks=None), dataset, dataset_tokenizer(dataset), "train")
    if micro_batch is not None:
        cfg = cfg.replace(micro_batch=micro_batch)
    return build_sampler(cfg, train, DistInfo(rank=0, world=info.world))


def _pct(x: float) -> str:
    return f"{100 * x:.4g}%"


def format_underflow(r: UnderflowReport) -> str:
    lines = [
        r.source,
        f"loss {r.loss:.4f}, scaled by 1 / ({r.n_targets} targets x accum {r.accum}), "
        f"autocast {r.dtype}"
        + (
            " (no GradScaler: training's fp16 loss scale would lift these)"
            if r.dtype == "fp16"
            else ""
        ),
        f"{r.n_tensors} Linear outputs, {r.n_elements:,} gradient elements",
        f"exactly zero:                              {_pct(r.zero_share)} of all elements",
        "of the nonzero elements:",
        f"  below FP16's smallest subnormal (2^-24):   {_pct(r.fp16_subnormal_share)}"
        "  (flush to zero in FP16)",
        f"  below FP16's smallest normal (2^-14):      {_pct(r.fp16_normal_share)}",
        f"  below BF16's smallest subnormal (2^-133):  {_pct(r.bf16_subnormal_share)}",
        f"smallest nonzero |g| {r.min_nonzero:.3g}" if r.min_nonzero is not None else "all zero",
        f"largest |g| {r.max_abs:.3g}",
        "by layer kind (share of its nonzero elements below 2^-24):",
    ]
    for kind, (n, nz, below) in sorted(r.by_kind.items()):
        lines.append(f"  {kind:<6} {n:>12,} elements  {_pct(below / nz if nz else 0.0):>9}")
    lines.append("|g| by decade (nonzero elements):")
    total = max(1, r.n_nonzero)
    for e in sorted(r.decades):
        count = r.decades[e]
        bar = "#" * max(1, round(40 * count / total)) if count else ""
        span = f"1e{e}..1e{e + 1}"
        lines.append(f"  {span:<14} {count:>12,} {_pct(count / total):>9} {bar}")
    return "\n".join(lines)
