"""The model shape a run asks for: a preset's values under the ones its config sets, checked.

Pure and torch-free, so the config can check a shape in one line per problem before anything
is built (`ModelConfig` checks again, as a backstop, with less friendly messages), and refuse a
model this machine cannot train from its parameter count before anything is allocated
(`memory_problem`).
"""

from __future__ import annotations

from typing import Any

from octlm import checks

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
    "zero_init_residual",
)
"""The `ModelConfig` fields a user sets (vocabulary: the data's; context and dropout: the run's).
The last three are architecture options; every preset leaves them off."""
MAX_SOFTCAP = 1e4
"""Past this a cap changes no logit a float32 model produces (tanh(x / C) * C == x)."""
INT_KEYS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff")
_RULES = {
    **dict.fromkeys(INT_KEYS, checks.Int(1)),
    "rope_base": checks.Number(0, lo_open=True),
    "norm_eps": checks.Number(0, 1, lo_open=True),
    "init_std": checks.Number(0, 1, lo_open=True),
    "qk_norm": checks.Bool(),
    # 0 is off; a cap under 1 would squash every logit into a near-uniform softmax.
    "logit_softcap": checks.Number(0, MAX_SOFTCAP),
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
