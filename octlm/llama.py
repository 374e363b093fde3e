"""octlm <-> Hugging Face Llama: tensor names both ways, and config.json both ways.

octlm's model is Llama's architecture with Llama's RoPE layout (dimension i pairs with
i + head_dim/2, as transformers' rotate_half does), so a conversion is a renaming of tensors:
none is permuted. `octlm export` writes with this table and `--init-from` reads with it; only
json is needed here, torch is imported by the callers (the CLI parser must stay quick).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from octlm.errors import OctlmError

if TYPE_CHECKING:
    import torch

    from octlm.model import ModelConfig

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
LM_HEAD = "lm_head.weight"  # the tied output layer: octlm has no tensor of its own for it


class LlamaError(OctlmError):
    """Weights or a config.json that octlm's model cannot hold."""


def name_table(n_layers: int) -> dict[str, str]:
    """octlm name -> Llama name for every weight of an `n_layers` model."""
    table = dict(TOP_NAMES)
    for i in range(n_layers):
        for ours, theirs in LAYER_NAMES.items():
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
            "name an octlm checkpoint or a LlamaForCausalLM folder",
        )
    return {table[name]: t.detach().contiguous() for name, t in weights.items()}


def hf_state_dict(weights: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """octlm weights under Llama's names; the tied output layer gets no `lm_head` entry."""
    return renamed(weights, name_table(n_layers), "checkpoint's")


def octlm_state_dict(hf: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Llama weights under octlm's names (the inverse of `hf_state_dict`). An `lm_head.weight`
    is accepted only as a copy of the embedding (tied), since octlm has no separate head."""
    hf = dict(hf)
    head, embedding = hf.pop(LM_HEAD, None), hf.get(TOP_NAMES["tok_embeddings.weight"])
    if head is not None and embedding is not None and not head.equal(embedding):
        raise LlamaError(
            f"{LM_HEAD} differs from the embedding (untied)",
            "octlm ties the output layer to the embedding: use a model with tied embeddings",
        )
    inverse = {theirs: ours for ours, theirs in name_table(n_layers).items()}
    return renamed(hf, inverse, "Llama")


def hf_config(config: ModelConfig, dtype: torch.dtype | str = "float32") -> dict[str, Any]:
    """config.json for LlamaForCausalLM (special-token ids are added by the caller)."""
    dtype_name = str(dtype).removeprefix("torch.")  # the checkpoint's: float32 unless edited
    return {
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


# What octlm's model is, for the config.json fields that could say otherwise; a field that is
# absent takes transformers' LlamaConfig default (which for tie_word_embeddings is False).
_REQUIRED = {
    "model_type": ("llama", "llama"),
    "tie_word_embeddings": (True, False),
    "attention_bias": (False, False),
    "mlp_bias": (False, False),
    "hidden_act": ("silu", "silu"),
    "pretraining_tp": (1, 1),
}


def _rope_base(cfg: dict[str, Any]) -> float:
    """The RoPE base of a config.json; any scaling (llama3, yarn, linear, ...) is refused."""
    scaling = cfg.get("rope_scaling")
    params = cfg.get("rope_parameters") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if scaling not in (None, {}) and (scaling.get("rope_type", scaling.get("type")) != "default"):
        raise LlamaError(f"config.json: rope_scaling {scaling} is not supported", "use plain RoPE")
    if kind != "default":
        raise LlamaError(f"config.json: rope_parameters.rope_type {kind!r} is not supported")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def model_config_from_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig fields of a LlamaForCausalLM config.json; a one-line error naming the first
    field whose value octlm's model cannot express."""
    arch = cfg.get("architectures") or ["LlamaForCausalLM"]
    if arch != ["LlamaForCausalLM"]:
        raise LlamaError(f"config.json: architectures {arch} is not LlamaForCausalLM")
    for key, (want, default) in _REQUIRED.items():
        if cfg.get(key, default) != want:
            raise LlamaError(
                f"config.json: {key}={cfg.get(key, default)!r} (octlm's model needs {want!r})",
                "use a LlamaForCausalLM with tied embeddings, no biases and silu",
            )
    try:
        heads = int(cfg["num_attention_heads"])
        fields = {
            "vocab_size": int(cfg["vocab_size"]),
            "d_model": int(cfg["hidden_size"]),
            "n_layers": int(cfg["num_hidden_layers"]),
            "n_heads": heads,
            "n_kv_heads": int(cfg.get("num_key_value_heads") or heads),
            "d_ff": int(cfg["intermediate_size"]),
            "context": int(cfg.get("max_position_embeddings", 2048)),
            "rope_base": _rope_base(cfg),
            "norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
            "init_std": float(cfg.get("initializer_range", 0.02)),
        }
    except KeyError as exc:
        raise LlamaError(
            f"config.json has no {exc.args[0]}", "name a LlamaForCausalLM folder"
        ) from None
    except (TypeError, ValueError) as exc:
        raise LlamaError(f"config.json has a bad value ({exc})", "fix config.json") from None
    head_dim = cfg.get("head_dim") or fields["d_model"] // heads
    if head_dim * heads != fields["d_model"]:
        raise LlamaError(
            f"config.json: head_dim={head_dim} x {heads} heads is not hidden_size="
            f"{fields['d_model']}",
            "octlm's heads split the width: use head_dim = hidden_size / num_attention_heads",
        )
    return fields
