"""Llama-style decoder-only transformer: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Options of the current small-LM recipe, off by default (an unset option builds the model,
and draws the init, exactly as before it existed): `qk_norm`, an RMSNorm with a learned gain on
each head's queries and keys before RoPE (Qwen3's layout); `logit_softcap`, the logits
squashed to (-C, C) by C * tanh(logits / C) (Gemma 2, modded-nanogpt); `value_residual`, every
block after the first attending with the mean of its values and the first block's (ResFormer,
modded-nanogpt's value residual); `zero_init_residual`, the blocks' output projections starting
at zero. A z-loss is asked of the forward pass by the trainer (`z_loss`), not built into it.

Parameter names follow Llama (`layers.{i}.attention.wq.weight`, ...) so that exporting to
Hugging Face is a lookup table. The output layer is tied to `tok_embeddings`, and with targets
the forward pass returns a masked loss *sum* plus a target count for exact gradient accumulation.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask
from torch.utils.checkpoint import checkpoint

from octlm.config.shape import ModelConfig
from octlm.model.positions import (
    RotaryEmbedding,
    apply_rope,
    flex_attention_for,
    segment_attention,
    segment_block_mask,
    segment_positions,
)

IGNORE_INDEX = -100
"""Targets equal to this are excluded from the loss (the data layer maps PAD targets to it)."""


Linear = Callable[[Tensor, Tensor], Tensor]
"""x @ weight.T computed another way than each `nn.Linear`'s forward (a decode's packed weights,
`octlm/model/packed.py`); where a product is given as None, the module runs itself."""


def project(module: nn.Linear, x: Tensor, linear: Linear | None) -> Tensor:
    return module(x) if linear is None else linear(x, module.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in float32 even under bf16 autocast; the mean of squares is precision-sensitive.
        out = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return out.to(x.dtype)


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE on q and k."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.dropout_p = config.dropout
        d, kv_dim = config.d_model, config.n_kv_heads * config.head_dim
        self.wq = nn.Linear(d, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(d, kv_dim, bias=False)
        self.wv = nn.Linear(d, kv_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, d, bias=False)
        self.resid_dropout = nn.Dropout(config.dropout)
        if config.qk_norm:  # registered only when set: a plain model keeps its parameter list
            self.q_norm = RMSNorm(config.head_dim, config.norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.norm_eps)
        self.qk_norm = config.qk_norm

    def qkv(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        first_values: Tensor | None = None,
        linear: Linear | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, T, D), keys and values (B, KV, T, D) of `x`, q and k normed (with
        qk_norm) and rotated: what the forward and the cached decoding (kvcache.py) attend with.
        With `first_values` (value_residual, every block after the first) the values are the
        mean of this block's and the first block's."""
        B, T, _ = x.shape
        H, KV, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = project(self.wq, x, linear).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = project(self.wk, x, linear).view(B, T, KV, D).transpose(1, 2)  # (B, KV, T, D)
        v = project(self.wv, x, linear).view(B, T, KV, D).transpose(1, 2)  # (B, KV, T, D)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if first_values is not None:
            v = 0.5 * (v + first_values)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | None = None,
        first_values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The block's attention output (B, T, C) and the values it attended (B, KV, T, D)."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x, cos, sin, first_values)
        dropout_p = self.dropout_p if self.training else 0.0
        # enable_gqa lets sdpa share each kv head across n_heads // n_kv_heads query heads.
        if mask is None:
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=dropout_p, enable_gqa=True
            )  # (B, H, T, D)
        elif isinstance(mask, BlockMask):  # FlexAttention (`GPT.flex_segments`)
            y = flex_attention_for(q)(q, k, v, block_mask=mask, enable_gqa=True)
        else:  # packed examples: causal within each segment (`segment_attention`)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=True
            )
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, C)
        return self.resid_dropout(self.wo(y)), v


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.w2 = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.w3 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, linear: Linear | None = None) -> Tensor:
        hidden = F.silu(project(self.w1, x, linear)) * project(self.w3, x, linear)
        return self.resid_dropout(project(self.w2, hidden, linear))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | None = None,
        first_values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The block's output and its attention's values (for value_residual's later blocks)."""
        attended, values = self.attention(self.attention_norm(x), cos, sin, mask, first_values)
        x = x + attended
        return x + self.feed_forward(self.ffn_norm(x)), values


class GPT(nn.Module):
    """Decoder-only language model with the output layer tied to the token embedding."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.rope = RotaryEmbedding(config.head_dim, config.context, config.rope_base)
        self.flex_segments = False
        """Attend within segments through FlexAttention's block mask instead of SDPA with a
        dense mask (set for --doc-mask on CUDA, without dropout: flex has none)."""
        self.activation_checkpointing = False
        """Recompute each block's activations in the backward pass instead of keeping them
        (less memory, about one more forward); the RNG state is replayed, so dropout draws the
        same masks and the bits stay those of a plain run (tests/e2e/test_memory.py)."""
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) everywhere; residual output projections scaled by 1/sqrt(2L), or
        zero with `zero_init_residual` (modded-nanogpt record #5, nanochat)."""
        std = self.config.init_std
        # Each block adds two residual branches; shrinking their outputs keeps the stream's
        # variance roughly independent of depth at init (GPT-2 style).
        resid_std = std / math.sqrt(2 * self.config.n_layers)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std, generator=generator)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for layer in self.layers:
            for proj in (layer.attention.wo, layer.feed_forward.w2):
                if self.config.zero_init_residual:
                    nn.init.zeros_(proj.weight)
                else:
                    nn.init.normal_(proj.weight, mean=0.0, std=resid_std, generator=generator)

    def forward(
        self,
        inputs: Tensor,
        targets: Tensor | None = None,
        segments: Tensor | None = None,
        *,
        z_loss: bool = False,
    ) -> Tensor | tuple[Tensor, ...]:
        """Logits (B, T, V) without targets; with targets, (loss_sum, n_targets), and with
        `z_loss` also z_sum: (loss_sum, n_targets, z_sum).

        loss_sum is the float32 SUM of token cross-entropies over targets != IGNORE_INDEX and
        n_targets the int64 count of those targets. The caller divides the summed loss by the
        step's total count, so gradient accumulation yields the true masked mean. z_sum is the
        sum over the same targets of log(Z)^2, Z the softmax's normaliser (PaLM's z-loss): the
        caller weighs it and adds it to the objective, so the logged loss stays the
        cross-entropy. `segments` (B, T), for rows of packed examples, keeps each example's
        attention and RoPE positions to itself; without it every row is one causal sequence
        (the pretraining path).
        """
        if inputs.ndim != 2:
            raise ValueError(f"inputs must have shape (B, T), got {tuple(inputs.shape)}")
        seq_len = inputs.shape[1]
        if seq_len > self.config.context:
            raise ValueError(
                f"sequence length {seq_len} exceeds context {self.config.context}: truncate the "
                "input or build the model with a larger context"
            )
        h = self.tok_embeddings(inputs)  # (B, T, C)
        mask = None
        if segments is None:
            cos, sin = self.rope(seq_len)
        else:
            if segments.shape != inputs.shape:
                raise ValueError(
                    f"segments shape {tuple(segments.shape)} != inputs shape {tuple(inputs.shape)}"
                )
            if self.flex_segments:
                mask, positions = segment_block_mask(segments), segment_positions(segments)
            else:
                mask, positions = segment_attention(segments)
            cos, sin = self.rope.at(positions)
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        first: Tensor | None = None  # the first block's values, with value_residual
        for layer in self.layers:
            if recompute:
                h, values = checkpoint(layer, h, cos, sin, mask, first, use_reentrant=False)
            else:
                h, values = layer(h, cos, sin, mask, first)
            if self.config.value_residual and first is None:
                first = values
        logits = self.output(h)
        if targets is None:
            return logits
        if targets.shape != inputs.shape:
            raise ValueError(
                f"targets shape {tuple(targets.shape)} != inputs shape {tuple(inputs.shape)}"
            )
        return lm_loss(logits, targets, z_loss)

    def output(self, h: Tensor, linear: Linear | None = None) -> Tensor:
        """Logits (B, T, V) of the last block's hidden states: the final norm, the tied output
        layer, and the soft cap when set."""
        logits = (linear or F.linear)(self.norm(h), self.tok_embeddings.weight)  # tied output
        if self.config.logit_softcap > 0:
            cap = self.config.logit_softcap  # in float32: tanh near its knee wants the precision
            logits = cap * torch.tanh(logits.float() / cap)
        return logits

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count; the tied embedding/output matrix is counted once."""
        total = sum(p.numel() for p in self.parameters())  # parameters() de-duplicates
        if non_embedding:
            total -= self.tok_embeddings.weight.numel()
        return total

    def num_linear_layers(self) -> int:
        return sum(isinstance(m, nn.Linear) for m in self.modules())

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token: 6N for the weights plus 12 * L * d * T for attention."""
        T = self.config.context if seq_len is None else seq_len
        if T <= 0:
            raise ValueError(f"seq_len={T}: must be positive")
        cfg = self.config
        return 6 * self.num_params() + 12 * cfg.n_layers * cfg.d_model * T


def lm_loss(logits: Tensor, targets: Tensor, z_loss: bool) -> tuple[Tensor, ...]:
    """(loss_sum, n_targets) of `GPT.forward`, and z_sum with `z_loss`."""
    # float32 logits: a bf16 log-softmax over a 32k vocab loses too much precision.
    flat_logits = logits.float().flatten(0, 1)  # (B * T, V)
    loss_sum = F.cross_entropy(
        flat_logits, targets.flatten(), reduction="sum", ignore_index=IGNORE_INDEX
    )
    n_targets = (targets != IGNORE_INDEX).sum()
    if not z_loss:
        return loss_sum, n_targets
    log_z = torch.logsumexp(flat_logits, dim=-1)  # (B * T,)
    z_sum = torch.where(targets.flatten() != IGNORE_INDEX, log_z.square(), 0.0).sum()
    return loss_sum, n_targets, z_sum
