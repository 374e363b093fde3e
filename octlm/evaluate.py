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
from octlm.data.order import windows
from octlm.data.shards import TokenStream
from octlm.model import IGNORE_INDEX
from octlm.train.step import autocast


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


@torch.no_grad()
def evaluate_batches(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
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
        for x, y in batches:
            with autocast(device, dtype):
                loss_sum, count = model(x.to(device), y.to(device))
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
