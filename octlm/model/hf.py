"""octlm <-> Hugging Face Llama and Qwen3: tensor names both ways, and config.json both ways.

octlm's model is Llama's architecture with Llama's RoPE layout (dimension i pairs with
i + head_dim/2, as transformers' rotate_half does), so a conversion is a renaming of tensors:
none is permuted. With `qk_norm` it is Qwen3's (Llama plus an RMSNorm of head_dim on each
head's queries and keys before RoPE, eps rms_norm_eps), so such a model maps to
Qwen3ForCausalLM, the same names plus `self_attn.q_norm`/`k_norm`. A logit soft-cap has no
counterpart in either (Gemma 2 has one, in an architecture that differs otherwise), so such a
model is not exported. `octlm export` writes with these tables and `--init-from` reads with
them; only json is needed here, torch is imported by the callers (the CLI parser must stay
quick).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from octlm.errors import OctlmError

if TYPE_CHECKING:
    import torch

    from octlm.config.shape import ModelConfig

# octlm name inside each block -> Llama name (w1 = gate, w3 = up, w2 = down in SwiGLU).
LAYER_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
TOP_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
}
# Qwen3's per-head norms of q and k: octlm's `qk_norm` (a Llama model has neither).
QK_NORM_NAMES = {
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
}
LM_HEAD = "lm_head.weight"  # the tied output layer: octlm has no tensor of its own for it
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
"""model_type -> the architecture octlm maps to it (Qwen3 for a model with qk_norm)."""


class LlamaError(OctlmError):
    """Weights or a config.json that octlm's model cannot hold, or a model that no config.json
    octlm writes can describe."""


def name_table(n_layers: int, qk_norm: bool = False) -> dict[str, str]:
    """octlm name -> Llama name (Qwen3 name, with `qk_norm`) for every weight of an `n_layers`
    model."""
    table = dict(TOP_NAMES)
    layer_names = {**LAYER_NAMES, **QK_NORM_NAMES} if qk_norm else LAYER_NAMES
    for i in range(n_layers):
        for ours, theirs in layer_names.items():
            table[f"layers.{i}.{ours}"] = f"model.layers.{i}.{theirs}"
    return table


def renamed(
    weights: dict[str, torch.Tensor], table: dict[str, str], what: str
) -> dict[str, torch.Tensor]:
    """`weights` under `table`'s names; a one-line error when the names are not the table's."""
    if set(weights) != set(table):
        extra, missing = sorted(set(weights) - set(table)), sorted(set(table) - set(weights))
        raise LlamaError(
            f"the {what} weights do not fit the model (extra {extra[:3]}, missing {missing[:3]})",
            "name an octlm checkpoint or a LlamaForCausalLM or Qwen3ForCausalLM folder",
        )
    return {table[name]: t.detach().contiguous() for name, t in weights.items()}


def layers_held(names: Iterable[str], prefix: str) -> int:
    """How many blocks `names` hold weights of (`prefix` + block index + ...)."""
    return len({name[len(prefix) :].split(".")[0] for name in names if name.startswith(prefix)})


def hf_state_dict(
    weights: dict[str, torch.Tensor], n_layers: int, qk_norm: bool = False
) -> dict[str, torch.Tensor]:
    """octlm weights under Llama's names (Qwen3's, with `qk_norm`); the tied output layer gets
    no `lm_head` entry."""
    return renamed(weights, name_table(n_layers, qk_norm), "checkpoint's")


def octlm_state_dict(
    hf: dict[str, torch.Tensor], n_layers: int, qk_norm: bool = False
) -> dict[str, torch.Tensor]:
    """Llama (or, with `qk_norm`, Qwen3) weights under octlm's names (the inverse of
    `hf_state_dict`). An `lm_head.weight` is accepted only as a copy of the embedding (tied),
    since octlm has no separate head."""
    hf = dict(hf)
    held = layers_held(hf, "model.layers.")
    if held != n_layers:  # before a name table of n_layers blocks is built
        raise LlamaError(
            f"config.json: num_hidden_layers={n_layers}, but the weights hold {held} layers",
            FIX_WEIGHTS,
        )
    head, embedding = hf.pop(LM_HEAD, None), hf.get(TOP_NAMES["tok_embeddings.weight"])
    if head is not None and embedding is not None and not head.equal(embedding):
        raise LlamaError(
            f"{LM_HEAD} differs from the embedding (untied)",
            "octlm ties the output layer to the embedding: use a model with tied embeddings",
        )
    inverse = {theirs: ours for ours, theirs in name_table(n_layers, qk_norm).items()}
    return renamed(hf, inverse, "Qwen3" if qk_norm else "Llama")


def check_exportable(config: ModelConfig, target: str = "Hugging Face") -> None:
    """Refuse a model that no architecture octlm writes computes: one with a logit soft-cap
    (transformers' Llama and Qwen3 read no `final_logit_softcapping`; only Gemma 2/3 do, and
    llama.cpp's llama and qwen3 none), or with a value residual (no transformers or llama.cpp
    architecture mixes values across layers). `target`: whose architectures (for the line)."""
    if config.logit_softcap > 0:
        raise LlamaError(
            f"the model uses --logit-softcap {config.logit_softcap:g}, which no {target} "
            "architecture octlm exports to has (Gemma 2's also scales the embeddings, adds norms "
            "and uses GELU)",
            "export a model trained without it (or use --format safetensors, octlm's own)",
        )
    if config.value_residual:
        raise LlamaError(
            "the model uses --value-residual (each block attends with the mean of its values "
            f"and the first block's), which no {target} architecture octlm exports to has",
            "export a model trained without it (or use --format safetensors, octlm's own)",
        )


def hf_config(config: ModelConfig, dtype: torch.dtype | str = "float32") -> dict[str, Any]:
    """config.json for LlamaForCausalLM, or Qwen3ForCausalLM for a model with qk_norm
    (special-token ids are added by the caller); a soft-capped model is refused."""
    check_exportable(config)
    dtype_name = str(dtype).removeprefix("torch.")  # the checkpoint's: float32 unless edited
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.context,
        "hidden_act": "silu",
        "rms_norm_eps": config.norm_eps,
        # transformers 4 reads rope_theta, 5 reads rope_parameters; both hold the same base.
        "rope_theta": config.rope_base,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_base},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "initializer_range": config.init_std,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        "use_cache": True,
    }
    return _qwen3_config(llama, config.n_layers) if config.qk_norm else llama


def _qwen3_config(llama: dict[str, Any], n_layers: int) -> dict[str, Any]:
    """Llama's config.json as Qwen3's: the same fields (Qwen3's MLP has no bias option), no
    sliding window on any layer (transformers 5 writes layer_types; 4 derives them)."""
    cfg = {key: value for key, value in llama.items() if key != "mlp_bias"}
    cfg.update(architectures=[ARCHITECTURES["qwen3"]], model_type="qwen3")
    cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=n_layers)
    cfg["layer_types"] = ["full_attention"] * n_layers
    return cfg


# What octlm's model is, for the config.json fields that could say otherwise; a field that is
# absent takes transformers' LlamaConfig (Qwen3Config) default, which for tie_word_embeddings
# is False. Qwen3 has no mlp_bias nor pretraining_tp: its MLP has no bias, and no TP split.
_SHARED = {"tie_word_embeddings": (True, False), "attention_bias": (False, False)}
_SHARED["hidden_act"] = ("silu", "silu")
_REQUIRED = {
    "llama": {"model_type": ("llama", "llama"), **_SHARED, "mlp_bias": (False, False)},
    "qwen3": {"model_type": ("qwen3", "qwen3"), **_SHARED, "use_sliding_window": (False, False)},
}
_REQUIRED["llama"]["pretraining_tp"] = (1, 1)
FIX_KIND = {
    "llama": "use a LlamaForCausalLM with tied embeddings, no biases and silu",
    "qwen3": "use a Qwen3ForCausalLM with tied embeddings, no biases, silu and no sliding window",
}
QWEN3_HEAD_DIM = 128  # Qwen3Config's head_dim when config.json gives none (not hidden / heads)
FIX_CONFIG = "fix config.json (transformers' save_pretrained writes a complete one)"
FIX_WEIGHTS = "name a folder whose config.json describes its weights"
FIX_ROPE = "octlm's RoPE is plain (unscaled, on every dimension): use a model with default RoPE"
# config.json integer -> ModelConfig field; transformers' default where the key may be absent.
_SIZES = {
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "d_ff",
    "max_position_embeddings": "context",
}
_SIZE_DEFAULTS = {
    "llama": {"max_position_embeddings": 2048},
    "qwen3": {"max_position_embeddings": 32768},
}
_NUMBERS = {"rms_norm_eps": ("norm_eps", 1e-6), "initializer_range": ("init_std", 0.02)}
DEFAULT_ROPE_THETA = 10000.0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _size(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    """A positive integer field; absent (or null, where transformers reads null as absent)
    gives `default`, and without one it is an error."""
    value = cfg.get(key)
    if value is None and default is not None:
        return default
    if value is None:
        raise LlamaError(f"config.json gives no {key}", FIX_CONFIG)
    if not _is_int(value) or value <= 0:
        raise LlamaError(f"config.json: {key}={value!r} must be a positive integer", FIX_CONFIG)
    return value


def _number(value: Any, key: str) -> float:
    """A positive finite number (JSON allows NaN and Infinity in Python's reading)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LlamaError(f"config.json: {key}={value!r} must be a positive number", FIX_CONFIG)
    if not 0 < value < math.inf:
        raise LlamaError(f"config.json: {key}={value!r} must be positive and finite", FIX_CONFIG)
    return float(value)


def _rope_dict(cfg: dict[str, Any], key: str) -> dict[str, Any]:
    """`rope_scaling` (transformers 4) or `rope_parameters` (5): {} when null or absent; any
    RoPE type but plain ("default") is refused, naming it."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LlamaError(f"config.json: {key}={value!r} must be null or an object", FIX_CONFIG)
    if any(isinstance(v, dict) for v in value.values()):
        raise LlamaError(f"config.json: {key} is given per layer type ({sorted(value)})", FIX_ROPE)
    # transformers 5 reads rope_parameters without a type as "default"; transformers 4 finds no
    # RoPE for a rope_scaling without one, so that names nothing octlm could follow.
    untyped = "default" if key == "rope_parameters" else None
    kind = value.get("rope_type", value.get("type", untyped))
    if value and kind != "default":
        what = f"rope_type {kind!r}" if kind is not None else f"no rope_type ({value})"
        raise LlamaError(f"config.json: {key} has {what}, which octlm cannot reproduce", FIX_ROPE)
    return value


def _rope_base(cfg: dict[str, Any]) -> float:
    """The RoPE base of a config.json: its rope_theta, wherever transformers 4 or 5 reads it
    (they must agree); any scaling (llama3, yarn, linear, dynamic, ...) is refused."""
    places = {"": cfg, "rope_scaling.": _rope_dict(cfg, "rope_scaling")}
    places["rope_parameters."] = _rope_dict(cfg, "rope_parameters")
    for where, d in places.items():
        if d.get("partial_rotary_factor") not in (None, 1):
            factor = d["partial_rotary_factor"]
            raise LlamaError(f"config.json: {where}partial_rotary_factor={factor!r}", FIX_ROPE)
    thetas = {
        f"{where}rope_theta": _number(d["rope_theta"], f"{where}rope_theta")
        for where, d in places.items()
        if d.get("rope_theta") is not None
    }
    if len(set(thetas.values())) > 1:
        given = ", ".join(f"{k}={v!r}" for k, v in thetas.items())
        raise LlamaError(
            f"config.json: {given} disagree (transformers 4 and 5 would read different ones)",
            "keep one rope_theta",
        )
    return next(iter(thetas.values()), DEFAULT_ROPE_THETA)


def _check_kind(cfg: dict[str, Any]) -> str:
    """The kind, "llama" or "qwen3", of a LlamaForCausalLM or Qwen3ForCausalLM whose every
    option octlm's model has (tied, no biases, silu, no sliding window, ...). Without
    architectures, model_type decides (as it does for transformers' AutoModel)."""
    arch = cfg.get("architectures")
    kinds = {name: kind for kind, name in ARCHITECTURES.items()}
    if not arch:
        kind = "qwen3" if cfg.get("model_type") == "qwen3" else "llama"
    elif arch not in [[name] for name in kinds]:
        raise LlamaError(
            f'config.json: architectures={arch!r} is not ["LlamaForCausalLM"] or '
            '["Qwen3ForCausalLM"]',
            "octlm reads Llama and Qwen3 causal LMs only",
        )
    else:
        kind = kinds[arch[0]]
    for key, (want, default) in _REQUIRED[kind].items():
        if cfg.get(key, default) != want:
            raise LlamaError(
                f"config.json: {key}={cfg.get(key, default)!r} (octlm's model needs {want!r})",
                FIX_KIND[kind],
            )
    layer_types = cfg.get("layer_types") or []
    full = isinstance(layer_types, list) and all(t == "full_attention" for t in layer_types)
    if kind == "qwen3" and not full:
        raise LlamaError(
            f"config.json: layer_types={layer_types!r} (octlm's model needs full_attention on "
            "every layer)",
            FIX_KIND[kind],
        )
    return kind


def _head_dim(cfg: dict[str, Any], kind: str, d_model: int, heads: int) -> int | None:
    """config.json's head_dim (None: hidden_size / heads); a Qwen3 one without it has 128."""
    if cfg.get("head_dim") is not None:
        return _size(cfg, "head_dim")
    if kind == "qwen3" and QWEN3_HEAD_DIM * heads != d_model:
        raise LlamaError(
            f"config.json gives no head_dim, and Qwen3's default {QWEN3_HEAD_DIM} x {heads} "
            f"heads is not hidden_size={d_model}",
            "octlm's heads split the width: set head_dim = hidden_size / num_attention_heads",
        )
    return None


def _check_heads(d_model: int, heads: int, kv_heads: int, head_dim: int | None) -> None:
    """Heads that split the width evenly, into an even head size, in groups of key/value heads."""
    if head_dim is None and d_model % heads:
        raise LlamaError(
            f"config.json: hidden_size {d_model} is not divisible by num_attention_heads {heads}",
            "octlm's heads split the width evenly: name a model whose heads divide hidden_size",
        )
    if head_dim is not None and head_dim * heads != d_model:
        raise LlamaError(
            f"config.json: head_dim={head_dim} x {heads} heads is not hidden_size={d_model}",
            "octlm's heads split the width: use head_dim = hidden_size / num_attention_heads",
        )
    if heads % kv_heads:
        raise LlamaError(
            f"config.json: num_attention_heads {heads} is not divisible by num_key_value_heads "
            f"{kv_heads}",
            "each key/value head serves a group of heads: name a model where they divide",
        )
    if (d_model // heads) % 2:
        raise LlamaError(
            f"config.json: the head size hidden_size / num_attention_heads = {d_model // heads} "
            "is odd (RoPE rotates pairs of dimensions)",
            "name a model with an even head size",
        )


def model_config_from_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig fields of a LlamaForCausalLM or Qwen3ForCausalLM config.json (Qwen3: with
    qk_norm); a one-line error naming the first field whose value octlm's model cannot express."""
    kind = _check_kind(cfg)
    defaults = _SIZE_DEFAULTS[kind]
    fields: dict[str, Any] = {
        ours: _size(cfg, key, defaults.get(key)) for key, ours in _SIZES.items()
    }
    heads = fields["n_heads"]
    fields["n_kv_heads"] = _size(cfg, "num_key_value_heads", heads)  # transformers: null = heads
    head_dim = _head_dim(cfg, kind, fields["d_model"], heads)
    _check_heads(fields["d_model"], heads, fields["n_kv_heads"], head_dim)
    fields["rope_base"] = _rope_base(cfg)
    for key, (ours, default) in _NUMBERS.items():
        fields[ours] = default if key not in cfg else _number(cfg[key], key)
    fields["qk_norm"] = kind == "qwen3"
    return fields
