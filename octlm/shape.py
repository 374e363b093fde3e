"""The model shape a run asks for: a preset's values under the ones its config sets, checked.

Pure and torch-free, so the config can check a shape in one line per problem before anything
is built (`ModelConfig` checks again, as a backstop, with less friendly messages).
"""

from __future__ import annotations

import math
from typing import Any

SHAPE_KEYS = (
    "n_layers",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "d_ff",
    "rope_base",
    "norm_eps",
    "init_std",
)
"""The `ModelConfig` fields a user sets (vocabulary: the data's; context and dropout: the run's)."""
INT_KEYS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff")


def resolve_shape(preset: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Every shape key: the override where one is given (not None), else the preset's value."""
    return {k: preset[k] if overrides.get(k) is None else overrides[k] for k in SHAPE_KEYS}


def shape_problem(shape: dict[str, Any]) -> tuple[str, str] | None:
    """The first thing wrong with a resolved shape, as (problem, fix); None when it can be built."""
    for key in SHAPE_KEYS:
        value, flag = shape[key], "--" + key.replace("_", "-")
        if key in INT_KEYS and not (_is_int(value) and value > 0):
            return f"{key}={value!r} must be a positive integer", f"set {flag} to 1 or more"
        if key not in INT_KEYS and not (_is_number(value) and 0 < value < math.inf):
            return f"{key}={value!r} must be a positive number", f"set {flag} above 0"
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
