"""Kernel 3's attention (`octlm/model/exact.py`, kernel 3 and later): each query reduces over
its own key blocks in one softmax.

Kernels 1 and 2 reduce every query over key tiles of 64 and add the tiles in key order (a
cumulative sum), about ten small ops a layer, and a decode step of a small model pays per op
more than per multiply. Here a query at position p reduces over its width, L(p): its position
rounded up to whole blocks of `KEYS` (p = 0..63: 64 keys, 64..127: 128, ...), keys past p
masked by an additive bias of -inf. A query's tile is its key/value head's `group` query heads
at its position, a (group, D) x (D, L) product for the scores and a (group, L) x (L, D) one for
the values: shapes that follow the position only, never the row count, the batch or the cache,
so each product's reduction order (and the softmax's, PyTorch's vectorized one over L) is the
row's own. Keys past the query add exact zeros (0 x value). The scale is folded into the bias's
add (`add(bias, scores, alpha=scale)`: one rounding of scale x score, what a product and a
masked fill give).

A decode step whose rows share a width (the usual case: rows of one length, or of lengths in one
block of 64) runs as four ops a layer, the cache's keys and values read in place: the scores'
batched product, the bias's add, the softmax, the values' product written into the output
projection's input. Otherwise (a prefill, a scored batch, rows of other widths) the queries are
grouped by width (`blocks`, once per call) and each group's keys and values are gathered per
query (at most `GATHER` elements a group at a time)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from octlm.model.exact_tiles import KEYS

GATHER = 1 << 22
"""Elements of gathered keys a group of queries holds at once (bounds memory; changes no bit)."""


@dataclass(frozen=True)
class Block:
    """Queries that reduce over the same width: their rows and positions in the call, or None
    for every row at its one position (a decode step of one width), and their bias."""

    width: int
    rows: Tensor | None  # (n,): each query's row b
    steps: Tensor | None  # (n,): each query's index t among the call's positions
    bias: Tensor  # (n or B, KV, group, width): 0 where a query reads a key, -inf past it


def width_of(positions: Tensor) -> Tensor:
    """Each position's width, `KEYS` x its block count."""
    return torch.div(positions, KEYS, rounding_mode="floor").add_(1).mul_(KEYS)


def bias_of(positions: Tensor, width: int, kv: int, group: int) -> Tensor:
    """(n, KV, group, width): 0 up to each position, -inf past it, for positions (n,)."""
    slot = torch.arange(width, device=positions.device)
    past = slot.view(1, width) > positions.view(-1, 1)  # (n, width)
    bias = torch.zeros(past.shape, device=positions.device).masked_fill_(past, float("-inf"))
    return bias.view(-1, 1, 1, width).expand(-1, kv, group, width).contiguous()


def blocks(positions: Tensor, kv: int, group: int) -> list[Block]:
    """The call's queries grouped by width, for positions (B, T): one block of every row where
    T is 1 and the rows share a width, else a block per width present."""
    widths = width_of(positions)
    B, T = positions.shape
    if T == 1 and int(widths.min()) == int(widths.max()):
        width = int(widths[0, 0])
        return [Block(width, None, None, bias_of(positions.view(B), width, kv, group))]
    out = []
    for width in sorted({int(w) for w in widths.unique()}):
        rows, steps = (widths == width).nonzero(as_tuple=True)
        out.append(Block(width, rows, steps, bias_of(positions[rows, steps], width, kv, group)))
    return out


def softmax_values(
    left: Tensor, kt: Tensor, vt: Tensor, bias: Tensor, out: Tensor | None
) -> Tensor:
    """Queries (N, group, D) over keys (N, D, L) and values (N, L, D), bias (N, group, L): the
    attention's output (N, group, D), each tile its own (group, D) x (D, L) and (group, L) x
    (L, D) products (one batched product of one shape each), written into `out` where given
    (no autograd)."""
    scores = torch.bmm(left, kt)
    weights = torch.softmax(torch.add(bias, scores, alpha=1.0 / math.sqrt(left.shape[-1])), -1)
    return torch.bmm(weights, vt) if out is None else torch.bmm(weights, vt, out=out)


def attend_blocks(
    q: Tensor, keys: Tensor, values: Tensor, parts: list[Block], into: Tensor | None
) -> Tensor:
    """Causal attention of q (B, H, T, D) over keys and values (B, KV, W, D) (row b's key at
    position j in slot j, W at least every query's width), for the call's `blocks`:
    (B, KV, H // KV, T, D) float32, or written into `into` (a decode step of one width, no
    autograd: `into` (B * KV, group, D) contiguous) and returned as None."""
    B, H, T, D = q.shape
    KV = keys.shape[1]
    group = H // KV
    if parts[0].rows is None:  # a decode step of one width: the cache read in place
        width = parts[0].width
        left = q.reshape(B * KV, group, D)
        kt = keys[:, :, :width].reshape(B * KV, width, D).transpose(1, 2)
        vt = values[:, :, :width].reshape(B * KV, width, D)
        bias = parts[0].bias.view(B * KV, group, width)
        got = softmax_values(left, kt, vt, bias, into)
        return got.view(B, KV, group, T, D)
    by_step = q.view(B, KV, group, T, D).permute(0, 3, 1, 2, 4)  # (B, T, KV, group, D)
    out = q.new_zeros(B, T, KV, group, D)
    for part in parts:
        width = part.width
        step = max(1, GATHER // (KV * width * D))
        for lo in range(0, len(part.rows), step):
            rows, steps = part.rows[lo : lo + step], part.steps[lo : lo + step]
            n = len(rows)
            left = by_step[rows, steps].reshape(n * KV, group, D)
            kt = keys[rows, :, :width].reshape(n * KV, width, D).transpose(1, 2)
            vt = values[rows, :, :width].reshape(n * KV, width, D)
            bias = part.bias[lo : lo + step].view(n * KV, group, width)
            got = softmax_values(left, kt, vt, bias, None)  # (bfloat16 under autocast)
            out[rows, steps] = got.view(n, KV, group, D).to(out.dtype)
    return out.permute(0, 2, 3, 1, 4)
