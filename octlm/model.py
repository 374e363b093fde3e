"""Llama-style decoder-only transformer: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Two options of the current small-LM recipe, off by default (an unset option builds the model,
and draws the init, exactly as before it existed): `qk_norm`, an RMSNorm with a learned gain on
each head's queries and keys before RoPE (Qwen3's layout), and `logit_softcap`, the logits
squashed to (-C, C) by C * tanh(logits / C) (Gemma 2, modded-nanogpt). A z-loss is asked of
the forward pass by the trainer (`z_loss`), not built into the model.

Parameter names follow Llama (`layers.{i}.attention.wq.weight`, ...) so that exporting to
Hugging Face is a lookup table. The output layer is tied to `tok_embeddings`, and with targets
the forward pass returns a masked loss *sum* plus a target count for exact gradient accumulation.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask
from torch.utils.checkpoint import checkpoint

from octlm.positions import (
    RotaryEmbedding,
    apply_rope,
    flex_attention_for,
    segment_attention,
    segment_block_mask,
    segment_positions,
)

IGNORE_INDEX = -100
"""Targets equal to this are excluded from the loss (the data layer maps PAD targets to it)."""

_INT_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "context")
_FLOAT_FIELDS = ("rope_base", "norm_eps", "init_std")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """Shape and init hyperparameters of a GPT; validated on construction."""

    vocab_size: int
    """Number of token ids; also the width of the (tied) output layer."""
    d_model: int
    """Width of the residual stream."""
    n_layers: int
    """Number of transformer blocks."""
    n_heads: int
    """Number of query heads."""
    n_kv_heads: int
    """Number of key/value heads (grouped-query attention); must divide n_heads."""
    d_ff: int
    """Hidden width of the SwiGLU feed-forward."""
    context: int
    """Maximum sequence length; RoPE tables are precomputed for this many positions."""
    rope_base: float = 10000.0
    """RoPE frequency base (theta)."""
    norm_eps: float = 1e-5
    """Epsilon inside RMSNorm."""
    dropout: float = 0.0
    """Attention and residual dropout probability in training mode."""
    init_std: float = 0.02
    """Std of the normal init; residual output projections are scaled down by sqrt(2 * n_layers)."""
    qk_norm: bool = False
    """RMSNorm (learned gain of head_dim, shared by the heads) on queries and keys before RoPE."""
    logit_softcap: float = 0.0
    """If > 0, logits become C * tanh(logits / C) with C this value; 0 leaves them as they are."""
    zero_init_residual: bool = False
    """Start each block's output projections (wo, w2) at zero: every block begins as identity."""

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name}={value!r}: must be a positive int")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name}={value!r}: must be a positive number")
        for name in ("qk_norm", "zero_init_residual"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"ModelConfig.{name}={getattr(self, name)!r}: must be true or false"
                )
        cap = self.logit_softcap
        if not isinstance(cap, (int, float)) or isinstance(cap, bool) or not 0 <= cap < math.inf:
            raise ValueError(f"ModelConfig.logit_softcap={cap!r}: must be 0 (off) or positive")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ModelConfig.dropout={self.dropout!r}: must be in [0, 1)")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"ModelConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                "pick n_heads dividing d_model"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_heads={self.n_heads} is not divisible by "
                f"n_kv_heads={self.n_kv_heads}: pick n_kv_heads dividing n_heads"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"ModelConfig.head_dim={self.head_dim} (d_model // n_heads) is odd: RoPE needs an "
                "even head_dim, change d_model or n_heads"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"ModelConfig.from_dict: unknown keys {unknown}; valid keys: {sorted(known)}"
            )
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        missing = sorted(required - set(d))
        if missing:
            raise ValueError(f"ModelConfig.from_dict: missing required keys {missing}")
        return cls(**d)


PRESETS: dict[str, ModelConfig] = {
    # A test-sized model (about 30k parameters at vocabulary 300): the committed golden run
    # folder and quick smoke runs, where a checkpoint must stay a few hundred KB.
    "micro": ModelConfig(
        vocab_size=300, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, context=64
    ),
    # Fast enough for CPU tests and demos (2.36M parameters at vocabulary 4096), yet big enough
    # to memorise a block at the first seed's 3e-4 within its 200 steps.
    "tiny": ModelConfig(
        vocab_size=4096, d_model=192, n_layers=4, n_heads=6, n_kv_heads=2, d_ff=512, context=256
    ),
    # The seed's 22.0M model: 9.44M non-embedding parameters.
    "small": ModelConfig(
        vocab_size=32768, d_model=384, n_layers=6, n_heads=6, n_kv_heads=2, d_ff=1024, context=1024
    ),
    # About 4x small: 88.1M parameters.
    "main": ModelConfig(
        vocab_size=32768,
        d_model=768,
        n_layers=10,
        n_heads=12,
        n_kv_heads=4,
        d_ff=2048,
        context=1024,
    ),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """Return the named preset, with fields replaced by `overrides` (re-validated)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid: {sorted(PRESETS)}")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown ModelConfig overrides {unknown}; valid: {sorted(known)}")
    return dataclasses.replace(PRESETS[name], **overrides)


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

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, T, D), keys and values (B, KV, T, D) of `x`, q and k normed (with
        qk_norm) and rotated: what the forward and the cached decoding (kvcache.py) attend with."""
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, D)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, D)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None = None) -> Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
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
        return self.resid_dropout(self.wo(y))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.w2 = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.w3 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.resid_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None = None) -> Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return x + self.feed_forward(self.ffn_norm(x))


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
        for layer in self.layers:
            if recompute:
                h = checkpoint(layer, h, cos, sin, mask, use_reentrant=False)
            else:
                h = layer(h, cos, sin, mask)
        logits = self.output(h)
        if targets is None:
            return logits
        if targets.shape != inputs.shape:
            raise ValueError(
                f"targets shape {tuple(targets.shape)} != inputs shape {tuple(inputs.shape)}"
            )
        return lm_loss(logits, targets, z_loss)

    def output(self, h: Tensor) -> Tensor:
        """Logits (B, T, V) of the last block's hidden states: the final norm, the tied output
        layer, and the soft cap when set."""
        logits = F.linear(self.norm(h), self.tok_embeddings.weight)  # tied output layer
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
