"""Decoding with a key/value cache: each new token runs the model once over itself, not over
the whole context again.

`KVCache` holds, per layer, the keys and values (after q/k norm and RoPE) of every position
seen so far, preallocated to the model's context. `forward_cached` is `GPT.forward` without
targets for the next `T` tokens of each row: the same modules in the same order (the
projections are `Attention.qkv`, the head `GPT.output`, as in the full forward), the queries
of the new positions attending over the cached keys. The arithmetic is the full forward's
with other matrix shapes, so logits agree to float rounding, not bit for bit; greedy and
seeded sampled tokens match the uncached path (tests/model/test_kvcache.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from octlm.model.gpt import GPT, Attention, Linear, project


class KVCache:
    """Keys and values of the positions seen so far: per layer (B, KV heads, context, D)."""

    def __init__(self, model: GPT, batch: int) -> None:
        cfg = model.config
        weight = model.tok_embeddings.weight
        shape = (batch, cfg.n_kv_heads, cfg.context, cfg.head_dim)
        self.keys = [weight.new_zeros(shape) for _ in range(cfg.n_layers)]
        self.values = [weight.new_zeros(shape) for _ in range(cfg.n_layers)]
        self.length = 0
        """Positions filled (the same for every row)."""
        self.capacity = cfg.context

    def room(self) -> int:
        """How many more positions fit."""
        return self.capacity - self.length


@torch.no_grad()
def forward_cached(
    model: GPT,
    ids: Tensor,
    cache: KVCache,
    last_only: bool = True,
    pad: Tensor | None = None,
    linear: Linear | None = None,
) -> Tensor:
    """Logits for `ids` (B, T), the next T positions of each row in `cache`, which then holds
    them too: (B, 1, V) for the last position with `last_only`, else (B, T, V).

    `pad` (B,), for a batch of prompts of different lengths: row b's first pad[b] positions
    are left padding, which no real position attends to and which RoPE does not count, so
    each row is computed as it would be alone (up to the rounding of a masked kernel).
    `linear`, where given, computes every weight product (`octlm/model/packed.py`)."""
    n = ids.shape[1]
    if n > cache.room():
        raise ValueError(f"{n} more positions do not fit: the cache has room for {cache.room()}")
    start, end = cache.length, cache.length + n
    if pad is None:
        cos, sin, mask = model.rope.cos[start:end], model.rope.sin[start:end], None
    else:
        slots = torch.arange(start, end, device=ids.device)
        cos, sin = model.rope.at((slots - pad.unsqueeze(1)).clamp(min=0))
        mask = padded_causal_mask(pad, start, end)
    h = model.tok_embeddings(ids)
    first: Tensor | None = None  # the first block's values of these positions (value_residual)
    for i, layer in enumerate(model.layers):
        x = layer.attention_norm(h)
        attended, values = _attend(
            layer.attention, x, (cos, sin), cache, i, start, mask, first, linear
        )
        if model.config.value_residual and first is None:
            first = values
        h = h + attended
        h = h + layer.feed_forward(layer.ffn_norm(h), linear)
    cache.length = end
    return model.output(h[:, -1:] if last_only else h, linear)


def left_padded(prompts: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """The prompts as one batch (B, longest), each left-padded with id 0, and each row's padding
    (B,): what `forward_cached` takes as `ids` and `pad` to prefill them together."""
    longest = max(len(p) for p in prompts)
    pad = [longest - len(p) for p in prompts]
    rows = [[0] * n + p for n, p in zip(pad, prompts, strict=True)]
    return torch.tensor(rows, dtype=torch.long, device=device), torch.tensor(pad, device=device)


def padded_causal_mask(pad: Tensor, start: int, end: int) -> Tensor:
    """(B, 1, end - start, end), True where the query at each position start..end-1 may attend:
    itself and the earlier positions that are not padding. A padding query attends to itself
    only (a row of no True would make attention NaN); nothing real reads it."""
    queries = torch.arange(start, end, device=pad.device).view(1, -1, 1)
    keys = torch.arange(end, device=pad.device).view(1, 1, -1)
    real = keys >= pad.view(-1, 1, 1)
    return ((keys <= queries) & real | (keys == queries)).unsqueeze(1)


def _attend(
    attn: Attention,
    x: Tensor,
    rope: tuple[Tensor, Tensor],
    cache: KVCache,
    layer: int,
    start: int,
    mask: Tensor | None,
    first_values: Tensor | None,
    linear: Linear | None,
) -> tuple[Tensor, Tensor]:
    """`Attention.forward` for positions start.. of each row, over the cached ones before: its
    output and the new positions' values."""
    B, T, _ = x.shape
    q, k, v = attn.qkv(x, *rope, first_values, linear)
    end = start + T
    cache.keys[layer][:, :, start:end] = k
    cache.values[layer][:, :, start:end] = v
    keys, values = cache.keys[layer][:, :, :end], cache.values[layer][:, :, :end]
    if mask is not None:  # left-padded rows
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    elif start == 0:  # the prompt: the full forward's causal attention
        y = F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True)
    elif T == 1:  # one new token sees every position before it
        y = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
    else:  # a later chunk: causal, offset by the positions already cached
        mask = torch.ones(T, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    y = y.transpose(1, 2).reshape(B, T, attn.n_heads * attn.head_dim)
    return project(attn.wo, y, linear), v
