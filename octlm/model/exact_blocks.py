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
grouped once per call (`blocks`) by width and by their run of positions in each row, and each
group is one product per key/value head of a row: all its positions' query rows against the
row's keys, where this machine's batched product gives each row the bits of its own tile
(`rows_agree`, checked once per shape), else one tile per position (the keys copied per
position)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from octlm.model.exact_tiles import KEYS

SCORES = 1 << 23
"""Score elements a group of rows computes at once (bounds memory; changes no bit)."""


@dataclass(frozen=True)
class Block:
    """Queries that reduce over the same width: rows `rows` (None: every row) at their steps
    lo..hi of the call (each row's positions are its start + step), and their bias, (n or B, 1,
    hi - lo, 1, width): 0 where a query reads a key, -inf past it."""

    width: int
    rows: Tensor | None
    lo: int
    hi: int
    bias: Tensor


def width_of(positions: Tensor) -> Tensor:
    """Each position's width, `KEYS` x its block count."""
    return torch.div(positions, KEYS, rounding_mode="floor").add_(1).mul_(KEYS)


@functools.cache
def slots(width: int, device: torch.device) -> Tensor:
    """0..width-1, made once per width and device (a decode step's bias is per-op overhead)."""
    return torch.arange(width, device=device)


def bias_of(positions: Tensor, width: int) -> Tensor:
    """(n, 1, m, 1, width) for positions (n, m): 0 up to each position, -inf past it."""
    n, m = positions.shape
    past = slots(width, positions.device) > positions.view(n, 1, m, 1, 1)
    return torch.where(past, float("-inf"), 0.0)


def blocks(positions: Tensor) -> list[Block]:
    """The call's queries (positions (B, T), each row's consecutive) grouped by width and, within
    a width, by the run of steps each row has there: rows with the same run are one block."""
    B, T = positions.shape
    if T == 1:  # a decode step: its widths in Python (a few ops fewer a step)
        each = {(p // KEYS + 1) * KEYS for p in positions.view(B).tolist()}
        if len(each) == 1:
            width = each.pop()
            return [Block(width, None, 0, 1, bias_of(positions, width))]
    widths = width_of(positions)
    if bool((widths == widths[:1]).all()):  # every row's width runs alike: one block a width
        cuts = [0, *(t for t in range(1, T) if widths[0, t] != widths[0, t - 1]), T]
        return [
            Block(
                int(widths[0, lo]), None, lo, hi, bias_of(positions[:, lo:hi], int(widths[0, lo]))
            )
            for lo, hi in zip(cuts, cuts[1:], strict=False)
        ]
    runs: dict[tuple[int, int, int], list[int]] = {}
    for b in range(B):
        row = widths[b].tolist()
        lo = 0
        for t in range(1, T + 1):
            if t == T or row[t] != row[lo]:
                runs.setdefault((row[lo], lo, t), []).append(b)
                lo = t
    out = []
    for (width, lo, hi), rows in sorted(runs.items()):
        index = torch.tensor(rows, device=positions.device)
        out.append(Block(width, index, lo, hi, bias_of(positions[index, lo:hi], width)))
    return out


@functools.cache
def rows_agree(
    steps: int, group: int, depth: int, width: int, threads: int, device: str = "cpu"
) -> bool:
    """Whether this machine's batched product of `steps` positions' query rows at once (steps x
    group rows) gives each row the bits of its own (group, depth) tile, for the scores (against
    `width` keys, read transposed as from a cache) and the values' product, at `threads`
    threads, on `device`. MKL picks its kernel by the row count, so this is measured, not
    assumed: one random draw per shape decides (orders that differ differ on it), once per
    process."""
    generator = torch.Generator().manual_seed(steps * 7919 + group * 131 + width)

    def draw(*shape: int, uniform: bool = False) -> Tensor:
        made = (torch.rand if uniform else torch.randn)(*shape, generator=generator)
        return made.to(device)

    left = draw(2, steps * group, depth)
    keys = draw(2, width, depth)
    weights = draw(2, steps * group, width, uniform=True)
    values = draw(2, width, depth)
    whole = (torch.bmm(left, keys.transpose(1, 2)), torch.bmm(weights, values))
    each = per_position(left, keys, steps), per_position(weights, values, steps, transpose=False)
    return all(torch.equal(a, b) for a, b in zip(whole, each, strict=True))


def per_position(left: Tensor, right: Tensor, steps: int, transpose: bool = True) -> Tensor:
    """bmm(left, right (transposed)) of left (N, steps * group, X), right (N, L, Y) as one tile
    per position: right copied per position (each tile its own product of one shape)."""
    N, rows, X = left.shape
    group = rows // steps
    tiles = (
        right.unsqueeze(1).expand(N, steps, *right.shape[1:]).reshape(N * steps, *right.shape[1:])
    )
    got = torch.bmm(
        left.reshape(N * steps, group, X), tiles.transpose(1, 2) if transpose else tiles
    )
    return got.view(N, rows, -1)


def softmax_values(
    left: Tensor, kt: Tensor, vt: Tensor, bias: Tensor, out: Tensor | None
) -> Tensor:
    """Queries (N, R, D) over keys (N, L, D) and values (N, L, D), bias broadcast to (N, R, L)
    (as given, viewed): the attention's output (N, R, D), by one batched product each where the
    rows agree with their tiles (`rows_agree`), else a tile per position; into `out` where given
    (no autograd)."""
    N, R, D = left.shape
    bias_shape = bias.shape
    steps = bias_shape[2]  # positions in the rows: (n, 1, steps, 1, L)
    group = R // steps
    scale = 1.0 / math.sqrt(D)
    threads = torch.get_num_threads()
    whole = steps == 1 or rows_agree(steps, group, D, kt.shape[1], threads, str(kt.device))
    scores = torch.bmm(left, kt.transpose(1, 2)) if whole else per_position(left, kt, steps)
    n = bias_shape[0]
    scores = scores.view(n, N // n, steps, group, kt.shape[1])
    weights = torch.softmax(torch.add(bias, scores, alpha=scale), -1).view(N, R, kt.shape[1])
    if not whole:
        return per_position(weights, vt, steps, transpose=False)
    return torch.bmm(weights, vt) if out is None else torch.bmm(weights, vt, out=out)


def attend_blocks(
    q: Tensor, keys: Tensor, values: Tensor, parts: list[Block], into: Tensor | None
) -> Tensor:
    """Causal attention of q (B, H, T, D) over keys and values (B, KV, W, D) (row b's key at
    position j in slot j, W at least every query's width), for the call's `blocks`:
    (B, KV, H // KV, T, D) float32. `into`: where a decode step of one block writes (no
    autograd; (B * KV, group, D) contiguous float32)."""
    B, H, T, D = q.shape
    KV = keys.shape[1]
    group = H // KV
    if T == 1 and len(parts) == 1 and parts[0].rows is None:  # the cache read in place
        width = parts[0].width
        kv = keys[:, :, :width].reshape(B * KV, width, D)
        vv = values[:, :, :width].reshape(B * KV, width, D)
        got = softmax_values(q.reshape(B * KV, group, D), kv, vv, parts[0].bias, into)
        return got.view(B, KV, group, T, D)
    by_step = q.view(B, KV, group, T, D).transpose(2, 3)  # (B, KV, T, group, D)
    out = q.new_zeros(B, KV, T, group, D)
    for part in parts:
        width, m = part.width, part.hi - part.lo
        count = B if part.rows is None else len(part.rows)
        chunk = max(1, SCORES // (KV * m * group * width))
        for at in range(0, count, chunk):
            # Every row: a slice, so the keys are read in place (an index would copy them).
            some = slice(at, at + chunk) if part.rows is None else part.rows[at : at + chunk]
            n = min(count, at + chunk) - at
            left = by_step[some, :, part.lo : part.hi].reshape(n * KV, m * group, D)
            kv = keys[some, :, :width].reshape(n * KV, width, D)
            vv = values[some, :, :width].reshape(n * KV, width, D)
            bias = part.bias[at : at + chunk]
            got = softmax_values(left, kv, vv, bias, None).view(n, KV, m, group, D)
            out[some, :, part.lo : part.hi] = got.to(out.dtype)  # (bfloat16 under autocast)
    return out.transpose(2, 3)
