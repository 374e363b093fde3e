"""The exact inference path: a token's logits are the same bits whichever way they are asked for.

`forward_exact` computes `GPT.forward`'s logits (same modules, same weights, same dtype) so that
a position's result depends on its own token and the tokens before it, nothing else: not on
how many rows share the batch, where the row sits in it, how it is padded, whether the earlier
positions come from a key/value cache or from this call (decode, prefill in chunks of any
size, the full forward), nor on the micro-batch an evaluation runs. Measured on this build
(PyTorch 2.13 CPU, MKL 2024.2, tests/model/test_exact.py), the plain path is not so:

- a matrix product's row depends on the number of rows: MKL runs 1 row as a matrix-vector
  product and picks other kernels by the row count (rows 1..15 of a (M, 384) x (384, 1024)
  product differ from the same rows in M = 300), so the KV-cache decode of one token (M = 1)
  differs from the full forward's row (2.4e-7 on a projection, 1.4e-6 on the logits of `tiny`);
- SDPA reduces over the keys it is given: one query over its p + 1 keys, or over keys of
  which some are masked (left padding), sums in another order than the causal kernel over the
  whole sequence (2e-8 on an attention output).

So here every matrix product gives a row the same bits whatever the other rows
(`octlm/model/exact_products.py`: oneDNN's product over a packed weight, or MKL's in fixed
tiles of 2 rows, by the kernel version asked for). Attention, kernel 3 (the default;
`octlm/model/exact_blocks.py`): each query over its own key blocks of `KEYS` in one softmax,
in tiles whose shapes follow its position only. Kernels 1-2 (kept for the RL runs that recorded
them) write it out: a query's scores against keys in tiles of `KEYS` (a (QUERIES, D) x (D,
KEYS) product per query tile and key tile), keys past the query masked to -inf, the max over
every key, the exponentials, each key tile's sum, and the tiles' partial sums and value products
added in key order (a cumulative sum: a left fold), so key tiles that lie wholly past the query
add exact zeros and change no bit. A row's keys sit at its own positions 0, 1, ... (a batch is
padded on the right, never on the left), so a row alone and in any batch reduce over the same
layout. Elementwise ops (norms, RoPE, SwiGLU, residual adds) act on each row alone.

A decode step of a small model costs its op count more than its arithmetic, so the path keeps
ops few without moving a bit (tests/model/test_exact_history.py holds the bits to an earlier
commit's): q and k rotated in one call, buffers zeroed once per call and reused by each layer,
the attention's last op writing the output projection's input, the cache's tile views kept.

The training forward (`GPT.forward`) is untouched: this path is for inference, asked for with
`exact=True` (`octlm/generation/sampling.py`, `octlm/evaluate/likelihood.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from octlm.config.rl import EXACT_KERNEL
from octlm.model.exact_blocks import Block, attend_blocks, blocks
from octlm.model.exact_kept import kept_packs
from octlm.model.exact_products import padded_rows, product, tiled_linear
from octlm.model.exact_tiles import (
    KEYS,
    QUERIES,
    QUERY_TILES,
    as_float,
    query_positions,
    tile_product,
)
from octlm.model.gpt import GPT, Attention
from octlm.model.positions import apply_rope


class ExactCache:
    """Keys and values per layer (B, KV heads, capacity, D), row b's position t at slot t; the
    capacity is the context rounded up to whole key tiles. Rows may hold different lengths:
    the caller says where each row's new tokens start (`forward_exact`'s `start`)."""

    def __init__(self, model: GPT, batch: int, kernel: int = EXACT_KERNEL) -> None:
        cfg = model.config
        self.kernel = kernel
        """The exact kernel version its products run (`octlm/model/exact_products.py`)."""
        weight = model.tok_embeddings.weight
        self.capacity = cfg.context
        shape = (batch, cfg.n_kv_heads, -(-cfg.context // KEYS) * KEYS, cfg.head_dim)
        self.keys = [weight.new_zeros(shape) for _ in range(cfg.n_layers)]
        self.values = [weight.new_zeros(shape) for _ in range(cfg.n_layers)]
        self.length = 0
        """Positions filled, kept by a caller whose rows all hold the same count (a chat)."""
        self.packs: dict[Any, Any] = {}
        """The weights packed for this decode (`product`): the model must not change during it."""
        self.checked = False
        """Whether a kept model's packings were checked against its weights for this decode
        (on its first call: `kept_packs`)."""
        self.tiled: dict[int, tuple[Tensor, int, Tensor, Tensor]] = {}
        """Per layer: the keys tensor, a key tile count and `key_tiles` of it (a decode step
        reuses its views of the cache until the tensors or the count change)."""


@dataclass(frozen=True)
class Layout:
    """What every layer of one `forward_exact` call shares: computed once per call (a decode
    step of a small model is per-op overhead, so nothing here is redone per layer)."""

    B: int
    T: int
    positions: Tensor  # (B, T)
    cos: Tensor  # (B, 1, T, D)
    sin: Tensor
    qpos: Tensor | None  # kernels 1-2: (B, nq * QUERIES), each query row's position
    width: int
    """Key slots up to the largest position's key tile (the keys a full forward pads to)."""
    masked: Tensor | list[Block]
    """Kernels 1-2: `future_keys`; kernel 3: the call's `blocks`."""
    rows: Tensor  # (B, 1): each row's index
    slots: Tensor  # (B, KV heads, T, D): each new key's slot in the cache, for its writes
    scratch: list[Tensor] = field(default_factory=list)
    """Buffers every layer reuses when no autograd records them (`scratch`)."""


def forward_exact(
    model: GPT,
    ids: Tensor,
    cache: ExactCache | None = None,
    start: Tensor | None = None,
    at: Tensor | None = None,
    kernel: int = EXACT_KERNEL,
) -> Tensor:
    """Logits (B, T, V) of `ids` (B, T), row b's tokens at positions start[b].. (default 0),
    after the positions before start[b] that `cache` holds (which then holds these too).
    Without a cache, start must be 0: the full forward. With `at` (B,), only position at[b] of
    each row (an index into T): logits (B, 1, V). Rows padded on the right are fine: a
    position never reads a later one. `kernel`: the products' version (a cache's own, if
    given)."""
    B, T = ids.shape
    device = ids.device
    if start is None:
        start = torch.zeros(B, dtype=torch.long, device=device)
    positions = start.view(B, 1) + torch.arange(T, device=device)  # (B, T)
    limit, last = model.config.context, int(positions.max())
    if last >= limit:
        raise ValueError(f"positions up to {last} do not fit context {limit}")
    if cache is None and bool(start.any()):
        raise ValueError("without a cache every row starts at position 0")
    kernel = kernel if cache is None else cache.kernel
    packs = kept_packs(model, kernel, check=cache is None or not cache.checked)
    if packs is None:
        packs = {} if cache is None else cache.packs
    if cache is not None:
        cache.checked = True
    layout = layout_of(model, positions, last, kernel)
    n, padded = B * T, padded_rows(B * T)
    h = F.pad(model.tok_embeddings(ids).reshape(n, -1), (0, 0, 0, padded - n))  # (M, C)
    first: Tensor | None = None
    for i, layer in enumerate(model.layers):
        x = layer.attention_norm(h)
        attended, values = _attend(layer.attention, x, layout, cache, (i, kernel), first, packs)
        if model.config.value_residual and first is None:
            first = values
        h = h + attended
        ffn = layer.feed_forward
        y = product(layer.ffn_norm(h), (ffn.w1.weight, ffn.w3.weight), packs, kernel)
        gate, up = y.chunk(2, dim=-1)
        h = h + tiled_linear(F.silu(gate) * up, ffn.w2.weight, packs, kernel)
    if at is not None:
        h = h[:n].view(B, T, -1)[layout.rows.view(B), at]  # (B, C)
        h, n, T = F.pad(h, (0, 0, 0, padded_rows(B) - B)), B, 1
    logits = tiled_linear(model.norm(h), model.tok_embeddings.weight, packs, kernel)
    if model.config.logit_softcap > 0:
        cap = model.config.logit_softcap
        logits = cap * torch.tanh(logits.float() / cap)
    return logits[:n].view(B, T, -1)


def layout_of(model: GPT, positions: Tensor, last: int, kernel: int) -> Layout:
    """The call's `Layout` for positions (B, T), `last` the largest."""
    B, T = positions.shape
    group, kv = model.config.n_heads // model.config.n_kv_heads, model.config.n_kv_heads
    qpos = None if kernel >= 3 else query_positions(positions, group)
    return Layout(
        B,
        T,
        positions,
        model.rope.cos[positions].unsqueeze(1),
        model.rope.sin[positions].unsqueeze(1),
        qpos,
        -(-(last + 1) // KEYS) * KEYS,
        blocks(positions) if qpos is None else future_keys(qpos, last, kv),
        torch.arange(B, device=positions.device).view(B, 1),
        positions.view(B, 1, T, 1).expand(B, kv, T, model.config.head_dim),
    )


def _attend(
    attn: Attention,
    x: Tensor,
    layout: Layout,
    cache: ExactCache | None,
    where: tuple[int, int],
    first_values: Tensor | None,
    packs: dict[Any, Any],
) -> tuple[Tensor, Tensor]:
    """`Attention.forward` of rows x (M, C) (the first B * T real): output (M, C), values.
    `where`: the layer's index and the products' kernel."""
    layer, kernel = where
    H, KV, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    B, T = layout.B, layout.T
    n = B * T
    qkv = product(x, (attn.wq.weight, attn.wk.weight, attn.wv.weight), packs, kernel)[:n]
    heads = qkv.view(B, T, H + 2 * KV, D).transpose(1, 2)  # (B, heads, T, D): q, k, v
    qk, v = heads[:, : H + KV], heads[:, H + KV :]
    if attn.qk_norm:
        qk = torch.cat((attn.q_norm(qk[:, :H]), attn.k_norm(qk[:, H:])), dim=1)
    if first_values is not None:
        v = 0.5 * (v + first_values)
    # RoPE is elementwise: q's and k's heads rotated in one call are the bits of one call each.
    qk = apply_rope(qk, layout.cos, layout.sin)
    q, k = qk[:, :H], qk[:, H:]
    width = layout.width
    if cache is None:  # positions are 0..T-1
        keys, values = F.pad(k, (0, 0, 0, width - T)), F.pad(v, (0, 0, 0, width - T))
    else:
        keys, values = cache.keys[layer], cache.values[layer]
        keys.scatter_(2, layout.slots, k.to(keys.dtype))  # (one op: cheaper than indexing)
        values.scatter_(2, layout.slots, v.to(values.dtype))
    out, into, tiles = scratch(layout, lambda: buffers(x, layout, (KV, H // KV, D)))
    if kernel >= 3:
        _blocks(q, as_float(keys), as_float(values), layout, (out, into))
    else:
        _tiles(q, keys, values, layout, cache, (layer, into, tiles))
    return tiled_linear(out, attn.wo.weight, packs, kernel), v


def _blocks(q: Tensor, keys: Tensor, values: Tensor, layout: Layout, dest: tuple) -> None:
    """Kernel 3's attention (`octlm/model/exact_blocks.py`) written into the output projection's
    input: in place by its last product for a float32 decode step of one width without autograd
    or autocast, else by one copy."""
    out, into = dest
    parts = layout.masked
    B, H, T, D = q.shape
    in_place = (
        T == 1
        and len(parts) == 1
        and parts[0].rows is None
        and out.dtype == torch.float32
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
    )
    if in_place:
        attend_blocks(q, keys, values, parts, out[:B].view(-1, H // keys.shape[1], D))
    else:
        into.copy_(attend_blocks(as_float(q), keys, values, parts, None))


def _tiles(
    q: Tensor, keys: Tensor, values: Tensor, layout: Layout, cache: ExactCache | None, at: tuple
) -> None:
    """Kernels 1-2's attention (`attention`) written into the output projection's input `into`:
    by its last op (an `out=`) where autograd allows, else by one copy. The key tiles of a cache
    are views kept between steps (`ExactCache.tiled`)."""
    layer, into, tiles = at
    nk = layout.width // KEYS
    if cache is None:
        kt, vt = key_tiles(keys, values)
    else:
        seen = cache.tiled.get(layer)
        if seen is None or seen[0] is not keys or seen[1] != nk:
            seen = (keys, nk, *key_tiles(keys[:, :, : nk * KEYS], values[:, :, : nk * KEYS]))
            if keys.dtype == torch.float32:  # views of the cache (else copies: not kept)
                cache.tiled[layer] = seen
        kt, vt = seen[2], seen[3]
    if torch.is_grad_enabled():
        into.copy_(attention(q, kt, vt, layout.masked, tiles))
    else:
        attention(q, kt, vt, layout.masked, tiles, into)


def future_keys(qpos: Tensor, last: int, kv: int) -> Tensor:
    """True where a query row may not read a key (kernels 1-2): (B, KV, nq, nk, QUERIES, KEYS)
    over the query tiles of positions `qpos` (`query_positions`) and the key tiles up to `last`,
    the largest position; the KV heads share one (a dimension of 1) past `QUERY_TILES` query
    tiles, else each has its copy (a mask of the scores' own shape is a cheaper op than one
    broadcast)."""
    B, nq = qpos.shape[0], qpos.shape[1] // QUERIES
    nk = -(-(last + 1) // KEYS)
    slot = torch.arange(nk * KEYS, device=qpos.device).view(1, 1, 1, nk, 1, KEYS)
    masked = slot > qpos.view(B, 1, nq, 1, QUERIES, 1)
    return masked if nq > QUERY_TILES else masked.expand(B, kv, nq, nk, QUERIES, KEYS).contiguous()


def scratch(layout: Layout, make: Callable[[], tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """`make()`'s zeroed buffers, made once per call and reused by every layer where autograd
    is off (each layer overwrites the same real rows, the padding rows stay 0), else afresh."""
    if torch.is_grad_enabled():
        return make()
    if not layout.scratch:
        layout.scratch.extend(make())
    return tuple(layout.scratch)


def buffers(x: Tensor, layout: Layout, heads: tuple[int, int, int]) -> tuple[Tensor, ...]:
    """For x (M, C): the output projection's input (M, H * D) zeroed, its real rows viewed as
    the attention's output (B, KV, group, T, D) (the heads back in (row, head) order, in x's
    dtype, with x's padding rows), and kernels 1-2's query tiles (`attention`'s `tiles`; None
    for kernel 3)."""
    B, T = layout.B, layout.T
    KV, group, D = heads
    out = x.new_zeros(x.shape[0], KV * group * D)
    into = out[: B * T].view(B, T, KV, group, D).permute(0, 2, 3, 1, 4)
    if layout.qpos is None:
        return out, into, None
    return out, into, x.new_zeros(B, KV, layout.qpos.shape[1], D, dtype=torch.float32)


def key_tiles(keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Keys (B, KV, W, D), W a multiple of KEYS, as (B * KV, 1, nk, D, KEYS) tiles, transposed
    for the scores' product, and values as (B * KV, 1, nk, KEYS, D)."""
    B, KV, W, D = keys.shape
    # (reshape: a view of a cache; a copy of a full forward's keys, strided when W is T)
    kt = as_float(keys).reshape(B * KV, 1, W // KEYS, KEYS, D).transpose(-1, -2)
    return kt, as_float(values).reshape(B * KV, 1, W // KEYS, KEYS, D)


def attention(
    q: Tensor,
    kt: Tensor,
    vt: Tensor,
    masked: Tensor,
    tiles: Tensor,
    into: Tensor | None = None,
) -> Tensor:
    """Causal attention of q (B, H, T, D) over the keys and values of `key_tiles` (key j at
    position j), `masked` from `future_keys`, `tiles` a zeroed float32 (B, KV, nq * QUERIES, D):
    (B, KV, H // KV, T, D) (the query heads of a key/value head are its rows), float32 or
    written into `into` (no autograd), computed in fixed tiles (the module's docstring)."""
    B, H, T, D = q.shape
    N, nk = kt.shape[0], kt.shape[2]
    KV = N // B
    group, rows = H // KV, H // KV * T
    nq = masked.shape[2]
    tiles[:, :, :rows].view(B, KV, group, T, D).copy_(q.view(B, KV, group, T, D))
    queries = tiles.view(N, nq, 1, QUERIES, D)  # the last tile's padding rows stay 0
    scale = 1.0 / math.sqrt(D)
    totals, sums = [], []
    for at in range(0, nq, QUERY_TILES):
        part = slice(at, at + QUERY_TILES)
        scores = tile_product(queries if nq <= QUERY_TILES else queries[:, part], kt) * scale
        nqp = scores.shape[1]  # (N, nq', nk, QUERIES, KEYS)
        scores = scores.view(B, KV, nqp, nk, QUERIES, KEYS).masked_fill(
            masked if nq <= QUERY_TILES else masked[:, :, part], float("-inf")
        )
        top = scores.amax(dim=(3, 5), keepdim=True)
        weights = torch.exp(scores - top).view(N, nqp, nk, QUERIES, KEYS)
        total, summed = weights.sum(dim=-1), tile_product(weights, vt)  # per key tile
        if nk > 1:  # the key tiles added in key order (one tile: already its sum, same bits)
            total, summed = total.cumsum(dim=2)[:, :, -1], summed.cumsum(dim=2)[:, :, -1]
        else:
            total, summed = total[:, :, 0], summed[:, :, 0]
        totals.append(total)  # (N, nq', QUERIES)
        sums.append(summed)  # (N, nq', QUERIES, D)
    total = totals[0] if len(totals) == 1 else torch.cat(totals, dim=1)
    summed = sums[0] if len(sums) == 1 else torch.cat(sums, dim=1)
    # (a view where one query tile or one key tile; else the key tiles' sums are copied out)
    total = total.reshape(B, KV, nq * QUERIES)[:, :, :rows].view(B, KV, group, T, 1)
    summed = summed.reshape(B, KV, nq * QUERIES, D)[:, :, :rows].view(B, KV, group, T, D)
    return summed / total if into is None else torch.div(summed, total, out=into)
