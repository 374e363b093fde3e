"""Validation loss, perplexity and bits per byte on a fixed set of windows.

Bits per byte = total nats / (ln 2 * total bytes), summed over every target and divided once,
so it does not depend on how the windows are batched. Evaluation runs in eval mode under
no_grad inside `fork_rng`, so it never moves the training trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from octlm.config import checks
from octlm.data.packed import PackedWindows
from octlm.data.shards import ShardDataset
from octlm.data.windows import Batch, StreamWindows, Windows, first_windows
from octlm.device import autocast
from octlm.model.gpt import GPT, IGNORE_INDEX


@dataclass(frozen=True)
class EvalResult:
    loss: float
    ppl: float
    bpb: float
    tokens: int
    bytes: int
    sources: dict[str, EvalResult] | None = None
    """A --data mixture's numbers per dataset (these are over all of them)."""


def combine(results: dict[str, EvalResult]) -> EvalResult:
    """Several datasets' numbers as one: total nats over total tokens and bytes, each part
    kept under `sources`."""
    nats = sum(r.loss * r.tokens for r in results.values())
    tokens = sum(r.tokens for r in results.values())
    n_bytes = sum(r.bytes for r in results.values())
    loss = nats / max(1, tokens)
    bpb = nats / (math.log(2) * n_bytes) if n_bytes else float("nan")
    return EvalResult(loss, math.exp(min(loss, 700.0)), bpb, tokens, n_bytes, results)


@dataclass(frozen=True)
class ValidationSet:
    """The fixed windows a run validates on: `indices` into `windows` (the validation split's
    first windows, the memorised windows of an overfit run, or the in-memory blocks)."""

    windows: Windows
    indices: np.ndarray
    micro_batch: int
    token_bytes: np.ndarray

    def batches(self, rank: int = 0, world: int = 1) -> Iterator[Batch]:
        """This rank's share: every world-th window, from the rank-th, `micro_batch` at a time."""
        share = self.indices[rank::world]
        for i in range(0, len(share), self.micro_batch):
            yield self.windows.batch(share[i : i + self.micro_batch])

    def whole_batches(self, rank: int = 0, world: int = 1) -> Iterator[Batch]:
        """This rank's share of one process's batches: batch b goes to rank b mod world, so
        each batch is the same windows (the same sums) on any process count."""
        size = self.micro_batch
        starts = range(rank * size, len(self.indices), world * size)
        for i in starts:
            yield self.windows.batch(self.indices[i : i + size])


def validate(
    model: nn.Module,
    val: ValidationSet,
    *,
    device: torch.device,
    dtype: str,
    rank: int = 0,
    world: int = 1,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    in_order: Callable[[list[torch.Tensor]], torch.Tensor] | None = None,
) -> EvalResult:
    """Score `val` (this rank's share of it; `reduce_sum` adds the ranks' totals). With
    `in_order` (the tree reduction) each rank scores whole batches and the batches' losses
    are added in batch order on every rank: the same bits as one process."""
    return evaluate_batches(
        model,
        val.whole_batches(rank, world) if in_order else val.batches(rank, world),
        token_bytes=val.token_bytes,
        device=device,
        dtype=dtype,
        reduce_sum=reduce_sum,
        in_order=in_order,
    )


def evaluate_split(
    model: GPT,
    dataset: ShardDataset,
    token_bytes: np.ndarray,
    *,
    split: str = "val",
    batches: int = 40,
    micro_batch: int = 16,
    dtype: str = "fp32",
) -> EvalResult:
    """The first `batches` micro-batches of non-overlapping windows of a split (0: the whole
    split), at the model's context, on the model's device."""
    val = split_set(dataset, token_bytes, split, model.config.context, batches, micro_batch)
    return validate(model, val, device=next(model.parameters()).device, dtype=dtype)


def split_set(
    dataset: ShardDataset,
    token_bytes: np.ndarray,
    split: str,
    context: int,
    batches: int,
    micro_batch: int,
) -> ValidationSet:
    """The first `batches` micro-batches (0: all) of a split's windows at `context`: the
    validation split's are the windows a run of that context validates on."""
    windows: Windows
    if dataset.masked:  # prompt/completion: the split's packed windows, prompts unscored
        windows = PackedWindows.of_split(dataset, split, context)
    else:  # disjoint targets: window j starts at token j * context
        stream = dataset.val if split == "val" else dataset.train
        windows = StreamWindows(stream, context, context, dataset.fingerprint)
    return first_batches(windows, token_bytes, batches, micro_batch)


def first_batches(
    windows: Windows, token_bytes: np.ndarray, batches: int, micro_batch: int
) -> ValidationSet:
    """The first `batches` micro-batches of `micro_batch` of `windows` (0: all of them)."""
    checks.check("--batches", batches, checks.Int(0), "use 0 (the whole split) or more")
    checks.check("--micro-batch", micro_batch, checks.Int(1), "use 1 or more")
    n = batches * micro_batch if batches else len(windows)
    return ValidationSet(windows, first_windows(windows, n), micro_batch, token_bytes)


def validate_run(
    val: ValidationSet,
    sources: dict[str, ValidationSet],
    score: Callable[[ValidationSet], EvalResult],
) -> EvalResult:
    """A run's validation numbers, each set scored by `score`: a mixture's per dataset
    (`sources`) and over all of them, else `val`'s. The loop's, and `octlm eval`'s."""
    if sources:
        return combine({name: score(s) for name, s in sources.items()})
    return score(val)


@torch.no_grad()
def evaluate_batches(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    token_bytes: np.ndarray,
    device: torch.device,
    dtype: str = "fp32",
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    in_order: Callable[[list[torch.Tensor]], torch.Tensor] | None = None,
) -> EvalResult:
    """Loss, perplexity and bits per byte over (inputs, targets) batches; IGNORE targets skip.
    With several ranks each evaluates its share and `reduce_sum` adds the totals; with
    `in_order`, the nats are every rank's per-batch sums added in batch order instead."""
    was_training = model.training
    model.eval()
    table = torch.from_numpy(token_bytes.astype(np.int64))
    # Totals stay on the device until the end: no host sync per micro-batch, so a GPU is fed
    # the next forward while it runs this one. float64 sums in the same order give the same
    # bits on either side.
    nats = torch.zeros((), dtype=torch.float64, device=device)
    count_total = torch.zeros((), dtype=torch.int64, device=device)
    n_bytes, parts = 0, []
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for batch in batches:  # (inputs, targets[, segments])
            y = batch[1]
            with autocast(device, dtype):
                loss_sum, count = model(*(t.to(device) for t in batch))
            nats += loss_sum.double()
            parts.append(loss_sum.double())
            count_total += count
            n_bytes += int(table[y[y != IGNORE_INDEX]].sum())  # y is on the host: no sync
    model.train(was_training)
    nats, n_tokens = nats.cpu(), int(count_total)
    if reduce_sum is not None:
        totals = torch.tensor([float(nats), n_tokens, n_bytes], dtype=torch.float64)
        nats_t, tokens_t, bytes_t = reduce_sum(totals.to(device)).cpu().tolist()
        nats, n_tokens, n_bytes = torch.tensor(nats_t), int(tokens_t), int(bytes_t)
        if in_order is not None:
            nats = in_order(parts).cpu()
    loss = float(nats) / max(1, n_tokens)
    bpb = float(nats) / (math.log(2) * n_bytes) if n_bytes else float("nan")
    return EvalResult(loss, math.exp(min(loss, 700.0)), bpb, n_tokens, n_bytes)
