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

from octlm.data.blocks import TokenBlocks
from octlm.data.order import validation_starts, windows
from octlm.data.packed import PackedWindows
from octlm.data.shards import ShardDataset, TokenStream
from octlm.device import autocast
from octlm.model import GPT, IGNORE_INDEX


@dataclass(frozen=True)
class EvalResult:
    loss: float
    ppl: float
    bpb: float
    tokens: int
    bytes: int


def stream_batches(
    stream: TokenStream, starts: np.ndarray, context: int, micro_batch: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, targets) of the windows starting at `starts`, `micro_batch` at a time."""
    for i in range(0, len(starts), micro_batch):
        block = windows(stream, starts[i : i + micro_batch], context + 1)
        yield block[:, :-1], block[:, 1:]


def packed_batches(
    packed: PackedWindows, ks: np.ndarray, micro_batch: int
) -> Iterator[tuple[torch.Tensor, ...]]:
    """(inputs, targets, segments) of packed windows `ks`, `micro_batch` at a time."""
    for i in range(0, len(ks), micro_batch):
        yield packed.batch(ks[i : i + micro_batch])


def block_batches(
    blocks: TokenBlocks, micro_batch: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for i in range(0, len(blocks), micro_batch):
        yield blocks.inputs[i : i + micro_batch], blocks.targets[i : i + micro_batch]


def evaluate(
    model: nn.Module,
    stream: TokenStream,
    starts: np.ndarray,
    *,
    context: int,
    micro_batch: int,
    token_bytes: np.ndarray,
    device: torch.device,
    dtype: str = "fp32",
) -> EvalResult:
    """Mean loss over the windows starting at `starts` (each context + 1 tokens)."""
    batches = stream_batches(stream, starts, context, micro_batch)
    return evaluate_batches(model, batches, token_bytes=token_bytes, device=device, dtype=dtype)


@dataclass(frozen=True)
class ValidationSet:
    """The fixed windows a run validates on: the validation stream's first non-overlapping
    windows, the memorised blocks of an overfit run, or the in-memory blocks themselves."""

    context: int
    micro_batch: int
    token_bytes: np.ndarray
    stream: TokenStream | None = None
    starts: np.ndarray | None = None
    blocks: TokenBlocks | None = None
    packed: PackedWindows | None = None
    """Packed prompt/completion windows: `starts` then numbers the windows to score."""

    def batches(self, rank: int = 0, world: int = 1) -> Iterator[tuple[torch.Tensor, ...]]:
        """This rank's share: every world-th window (or block), from the rank-th."""
        if self.packed is not None:
            assert self.starts is not None
            return packed_batches(self.packed, self.starts[rank::world], self.micro_batch)
        if self.blocks is not None:
            return block_batches(self.blocks.shard(rank, world), self.micro_batch)
        assert self.stream is not None and self.starts is not None
        return stream_batches(self.stream, self.starts[rank::world], self.context, self.micro_batch)


def validate(
    model: nn.Module,
    val: ValidationSet,
    *,
    device: torch.device,
    dtype: str,
    rank: int = 0,
    world: int = 1,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> EvalResult:
    """Score `val` (this rank's share of it; `reduce_sum` adds the ranks' totals)."""
    return evaluate_batches(
        model,
        val.batches(rank, world),
        token_bytes=val.token_bytes,
        device=device,
        dtype=dtype,
        reduce_sum=reduce_sum,
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
    """`octlm eval`: the first `batches` micro-batches of non-overlapping windows of a split
    (0: the whole split), at the model's context, on the model's device."""
    context = model.config.context
    stream = dataset.val if split == "val" else dataset.train
    device = next(model.parameters()).device
    if dataset.masked:  # prompt/completion: the split's packed windows, prompts unscored
        mask = dataset.val_mask if split == "val" else dataset.train_mask
        assert mask is not None
        packed = PackedWindows.build(stream, mask, context)
        n = min(batches * micro_batch, len(packed)) if batches else len(packed)
        return evaluate_batches(
            model,
            packed_batches(packed, np.arange(n), micro_batch),
            token_bytes=token_bytes,
            device=device,
            dtype=dtype,
        )
    n = batches * micro_batch if batches else len(stream)
    starts = validation_starts(len(stream), context, n)
    return evaluate(
        model,
        stream,
        np.asarray(starts),
        context=context,
        micro_batch=micro_batch,
        token_bytes=token_bytes,
        device=device,
        dtype=dtype,
    )


@torch.no_grad()
def evaluate_batches(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, ...]],
    *,
    token_bytes: np.ndarray,
    device: torch.device,
    dtype: str = "fp32",
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> EvalResult:
    """Loss, perplexity and bits per byte over (inputs, targets) batches; IGNORE targets skip.
    With several ranks each evaluates its share and `reduce_sum` adds the totals."""
    was_training = model.training
    model.eval()
    table = torch.from_numpy(token_bytes.astype(np.int64))
    # Totals stay on the device until the end: no host sync per micro-batch, so a GPU is fed
    # the next forward while it runs this one. float64 sums in the same order give the same
    # bits on either side.
    nats = torch.zeros((), dtype=torch.float64, device=device)
    count_total = torch.zeros((), dtype=torch.int64, device=device)
    n_bytes = 0
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for batch in batches:  # (inputs, targets[, segments])
            y = batch[1]
            with autocast(device, dtype):
                loss_sum, count = model(*(t.to(device) for t in batch))
            nats += loss_sum.double()
            count_total += count
            n_bytes += int(table[y[y != IGNORE_INDEX]].sum())  # y is on the host: no sync
    model.train(was_training)
    nats, n_tokens = nats.cpu(), int(count_total)
    if reduce_sum is not None:
        totals = torch.tensor([float(nats), n_tokens, n_bytes], dtype=torch.float64)
        nats_t, tokens_t, bytes_t = reduce_sum(totals.to(device)).cpu().tolist()
        nats, n_tokens, n_bytes = torch.tensor(nats_t), int(tokens_t), int(bytes_t)
    loss = float(nats) / max(1, n_tokens)
    bpb = float(nats) / (math.log(2) * n_bytes) if n_bytes else float("nan")
    return EvalResult(loss, math.exp(min(loss, 700.0)), bpb, n_tokens, n_bytes)
