"""The model's shape: `ModelConfig` (what a `GPT` is built from), the presets, and the shape a
run asks for (a preset's values under the ones its config sets), checked.

Pure and torch-free, so the config can check a shape in one line per problem before anything
is built (`ModelConfig` checks again, as a backstop, with less friendly messages), and refuse a
model this machine cannot train from its parameter count before anything is allocated
(`memory_problem`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from octlm.config import checks
from octlm.config.rules import check_section, declared_rules, new_trajectory, require, trajectory

SHAPE_KEYS = (
    "n_layers",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "d_ff",
    "rope_base",
    "norm_eps",
    "init_std",
    "qk_norm",
    "logit_softcap",
    "value_residual",
    "zero_init_residual",
)
"""The `ModelConfig` fields a user sets (vocabulary: the data's; context and dropout: the run's).
The last four are architecture options; every preset leaves them off."""
MAX_SOFTCAP = 1e4
"""Past this a cap changes no logit a float32 model produces (tanh(x / C) * C == x)."""
ROPE_BASE = checks.Number(2, 1e30)
"""RoPE rotates dim pair i at the frequency base^(-2i/d) (d the head size, computed in float32).
Below 1 the frequencies grow with i instead of falling; at 1 they are all one frequency; near 1
they are indistinct in float32 (neighbours differ by base^(2/d) - 1, under float32's 6e-8 for
d = 4096 once base < 1.0001), and a base under float32's smallest normal (1e-38) becomes 0, whose
powers give inf and 0 * inf = NaN at position 0: a run that trains to NaN. From 2 every pair
has its own falling frequency at any head size. Above, 1e30 keeps base and its powers float32
numbers (its largest is 3.4e38) far past what is used: nanoGPT and Llama 2 take 1e4, Llama 3
5e5, long-context models up to 1e7-1e8; octlm's recipe 1024. The `_RULES` entry stays (0, inf)
so a non-finite value reads as before; this range is checked after it."""
INT_KEYS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff")
_RULES = {
    **dict.fromkeys(INT_KEYS, checks.Int(1)),
    "rope_base": checks.Number(0, lo_open=True),
    "norm_eps": checks.Number(0, 1, lo_open=True),
    "init_std": checks.Number(0, 1, lo_open=True),
    "qk_norm": checks.Bool(),
    # 0 is off; a cap under 1 would squash every logit into a near-uniform softmax.
    "logit_softcap": checks.Number(0, MAX_SOFTCAP),
    "value_residual": checks.Bool(),
    "zero_init_residual": checks.Bool(),
}
TRAIN_BYTES_PER_PARAMETER = {"ddp": 16, "fsdp": 4}
"""Bytes of memory each parameter needs at the least, per process. ddp: fp32 weights, gradients
and AdamW's two moments, 4 bytes each, all held by every process (on a GPU the copy the async
checkpoint makes on the host is 12 of them again). fsdp: the full fp32 weights every process
builds on the host before they are sharded."""
ACTIVATION_BYTES = 4
"""Bytes per float of the activations a micro-batch keeps for the backward pass: at the least
each block's fp32 input (even recomputed, `activation_checkpointing` keeps that one) and the
fp32 logits."""


def resolve_shape(preset: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Every shape key: the override where one is given (not None), else the preset's value."""
    return {k: preset[k] if overrides.get(k) is None else overrides[k] for k in SHAPE_KEYS}


def shape_problem(shape: dict[str, Any]) -> tuple[str, str] | None:
    """The first thing wrong with a resolved shape, as (problem, fix); None when it can be built."""
    for key in SHAPE_KEYS:
        found = checks.problem(key, shape[key], _RULES[key])
        if found is not None:
            return found, f"set --{key.replace('_', '-')} within that range"
    if not ROPE_BASE.ok(shape["rope_base"]):
        return (
            f"rope_base={checks.shown(shape['rope_base'])} must be {ROPE_BASE}: RoPE's "
            "frequencies base^(-2i/d) must fall, each its own, as float32 numbers",
            "use --rope-base 10000 (nanoGPT, Llama 2) to 500000 (Llama 3), or 1024 for short "
            "contexts",
        )
    if 0 < shape["logit_softcap"] < 1:
        return (
            f"logit_softcap {shape['logit_softcap']} squashes every logit into (-1, 1)",
            "use 0 (off) or a cap of at least 1 (15 to 30 is usual)",
        )
    d, heads, kv = shape["d_model"], shape["n_heads"], shape["n_kv_heads"]
    if d % heads:
        return (
            f"d_model {d} is not divisible by n_heads {heads}",
            "use --n-heads dividing --d-model (d_model = n_heads * head size)",
        )
    if heads % kv:
        return (
            f"n_heads {heads} is not divisible by n_kv_heads {kv}",
            "use --n-kv-heads dividing --n-heads (each key/value head serves a group of heads)",
        )
    if (d // heads) % 2:
        return (
            f"the head size d_model / n_heads = {d // heads} is odd (RoPE rotates pairs of dims)",
            "use --d-model and --n-heads giving an even head size",
        )
    return None


def parameter_count(shape: dict[str, Any], vocab_size: int) -> int:
    """The parameters of a GPT of this (checked) shape, counted as `GPT.num_params` counts them:
    the tied embedding once, each block's attention, SwiGLU and two norms, the final norm."""
    d, heads, kv, ff = shape["d_model"], shape["n_heads"], shape["n_kv_heads"], shape["d_ff"]
    kv_dim = kv * (d // heads)
    block = 2 * d * d + 2 * d * kv_dim + 3 * d * ff + 2 * d
    block += 2 * (d // heads) if shape["qk_norm"] else 0
    return vocab_size * d + shape["n_layers"] * block + d


def memory_problem(
    shape: dict[str, Any], *, vocab_size: int, micro_batch: int, context: int, parallel: str
) -> tuple[str, str] | None:
    """(problem, fix) when training this shape needs more memory than the machine has, counted
    from the parameters and the micro-batch alone: a lower bound (no allocator slack, no
    attention scores, no temporaries), so it refuses only what cannot fit; None when it may."""
    memory = checks.machine_memory()
    if memory is None:
        return None
    params = parameter_count(shape, vocab_size)
    per_param = TRAIN_BYTES_PER_PARAMETER[parallel]
    floats = shape["d_model"] * shape["n_layers"] + vocab_size
    activations = micro_batch * context * floats * ACTIVATION_BYTES
    if params * per_param + activations <= memory:
        return None
    return (
        f"training this model needs at least {_gb(params * per_param + activations)}, more than "
        f"this machine's {_gb(memory)}: {params:,} parameters x {per_param} bytes ({parallel}) "
        f"and {_gb(activations)} of activations for micro_batch {micro_batch} x context {context}",
        "make the model smaller (--n-layers, --d-model, --d-ff), or lower --micro-batch "
        "(and raise --accum to keep the batch)",
    )


def _gb(n_bytes: int) -> str:
    if n_bytes < 1e9:
        return f"{n_bytes / 1e6:,.1f} MB"
    gb = n_bytes / 1e9
    return f"{gb:,.1f} GB" if gb < 1e6 else f"{gb:.3g} GB"


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
    value_residual: bool = False
    """Every block after the first attends with the mean of its values and the first block's."""
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
        for name in ("qk_norm", "value_residual", "zero_init_residual"):
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


@dataclass(frozen=True, kw_only=True, slots=True)
class ShapeSettings:
    """The network a run trains: a preset and the shape keys that override it (each None: the
    preset's value), and dropout. Checked once resolved against the preset (`shape_problem`)."""

    model: str = trajectory("small")
    """Model preset: micro, tiny, small or main; the base the shape settings below override."""
    # The shape: None is the preset's value. Each joins the trajectory only where it differs
    # from the preset's, so runs written before these keys, and a key set to the preset's own
    # value, keep the fingerprint of the plain preset.
    n_layers: int | None = new_trajectory(None)
    """Transformer blocks (default: the preset's)."""
    d_model: int | None = new_trajectory(None)
    """Width of the residual stream (default: the preset's)."""
    n_heads: int | None = new_trajectory(None)
    """Query heads; must divide d_model into an even head size (default: the preset's)."""
    n_kv_heads: int | None = new_trajectory(None)
    """Key/value heads (grouped-query attention); must divide n_heads (default: the preset's)."""
    d_ff: int | None = new_trajectory(None)
    """Hidden width of the SwiGLU feed-forward (default: the preset's)."""
    rope_base: float | None = new_trajectory(None)
    """RoPE frequency base, theta (default: the preset's)."""
    norm_eps: float | None = new_trajectory(None)
    """Epsilon inside RMSNorm (default: the preset's)."""
    init_std: float | None = new_trajectory(None)
    """Std of the normal init, residual projections scaled by 1/sqrt(2 n_layers) (default: the
    preset's)."""
    qk_norm: bool | None = new_trajectory(None)
    """RMSNorm with a learned gain on each head's queries and keys, before RoPE (default: off)."""
    logit_softcap: float | None = new_trajectory(None)
    """Cap the logits smoothly to (-C, C): C * tanh(logits / C); 0 is off (default: off)."""
    value_residual: bool | None = new_trajectory(None)
    """Every block after the first attends with the mean of its own values and the first
    block's: ResFormer's value residual, as in modded-nanogpt (default: off)."""
    zero_init_residual: bool | None = new_trajectory(None)
    """Start the blocks' output projections (wo, w2) at zero instead of the scaled normal, so
    each block begins as the identity (default: off)."""
    dropout: float = trajectory(0.0, checks.Number(0, 1, hi_open=True))
    """Model dropout (attention and residual)."""

    def __post_init__(self) -> None:
        check_section(self, skip=SHAPE_KEYS)
        require(self.model in PRESETS, f"model {self.model!r} is unknown", f"use {sorted(PRESETS)}")

    def resolved(self) -> dict[str, Any]:
        """The shape keys as the model will be built: the preset's values under the ones set."""
        return resolve_shape(PRESETS[self.model].to_dict(), dataclasses.asdict(self))


RULES = declared_rules(ShapeSettings, skip=SHAPE_KEYS)
