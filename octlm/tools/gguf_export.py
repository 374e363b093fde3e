"""`octlm export RUN OUT.gguf --format gguf`: one GGUF file llama.cpp (and Ollama, LM Studio) runs.

The file is what llama.cpp's convert_hf_to_gguf.py writes for the `--format hf` folder: arch
`llama` (`qwen3` for a model with qk_norm), its tensor names (`token_embd`, `blk.N.attn_q`, ...,
`output_norm`; no `output`, the head being tied, as for any tied model), its hyperparameters,
and the tokenizer as GGUF's `gpt2` BPE (the byte-level tokens, merges and token types of the
run's tokenizer.json, pre-tokenizer `gpt-2`: octlm's regex), BOS/EOS/PAD ids and, for a model
trained on chat data, the chat format's Jinja template.

RoPE: octlm pairs head dimension i with i + head_dim/2 (HF's rotate_half, llama.cpp's NEOX
rotation). llama.cpp's `qwen3` rotates that way, so its q/k are written as they are; its
`llama` rotates adjacent pairs (2j, 2j+1), so q and k rows are permuted per head as convert's
`permute` does (`rope_interleaved`): row 2j + s of a head takes row s * head_dim/2 + j.

Tensor types: f32, f16 (2-D weights; norms stay f32, as convert writes them) or q8_0 (2-D
weights whose rows split into blocks of 32; others f16). The file is written beside OUT and
renamed into place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from octlm.config.checks import shown, shown_path
from octlm.data.chat_format import JINJA_TEMPLATE, trained_on_chat
from octlm.errors import OctlmError

if TYPE_CHECKING:
    import numpy as np
    import torch

    from octlm.config.shape import ModelConfig
    from octlm.tokenizer.core import Tokenizer

OUTTYPES = ("f32", "f16", "q8_0")
DEFAULT_OUTTYPE = "f16"  # llama.cpp's converter's default
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7}  # gguf.LlamaFileType: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0
Q8_BLOCK = 32
TOP_NAMES = {"tok_embeddings.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
LAYER_NAMES = {
    "attention.wq.weight": "attn_q.weight",
    "attention.wk.weight": "attn_k.weight",
    "attention.wv.weight": "attn_v.weight",
    "attention.wo.weight": "attn_output.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
    "attention_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "attention.q_norm.weight": "attn_q_norm.weight",
    "attention.k_norm.weight": "attn_k_norm.weight",
}
GPT2_PRE = "gpt-2"
"""llama.cpp's name for GPT-2's pre-tokenizer regex, the one octlm's ByteLevel(use_regex) uses."""
# gguf.TokenType: NORMAL 1, CONTROL 3, USER_DEFINED 4, UNUSED 5.
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


def gguf_name(name: str) -> str:
    """The GGUF name of an octlm weight: `layers.3.attention.wq.weight` -> `blk.3.attn_q.weight`."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    _, index, rest = name.split(".", 2)
    return f"blk.{index}.{LAYER_NAMES[rest]}"


def rope_interleaved(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k rows from octlm's half-split RoPE layout to llama.cpp's adjacent pairs (per head),
    as convert_hf_to_gguf.py's `permute` does for Llama."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).transpose(1, 2).reshape(weight.shape)


def gguf_tensors(weights: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """octlm weights under GGUF's names, q/k permuted for `llama` (not for `qwen3`)."""
    out = {}
    for name, weight in weights.items():
        weight = weight.detach().float()
        if not config.qk_norm and name.endswith(("attention.wq.weight", "attention.wk.weight")):
            heads = config.n_heads if name.endswith("wq.weight") else config.n_kv_heads
            weight = rope_interleaved(weight, heads)
        out[gguf_name(name)] = weight.contiguous()
    return out


def check_outtype(outtype: str | None, fmt: str) -> str:
    """The tensor type to write: `--outtype` only with --format gguf, one of OUTTYPES."""
    if outtype is not None and fmt != "gguf":
        raise OctlmError(f"--outtype is for --format gguf, not {fmt}", "drop --outtype")
    outtype = outtype or DEFAULT_OUTTYPE
    if outtype not in OUTTYPES:
        fix = f"use one of: {', '.join(OUTTYPES)}"
        raise OctlmError(f"unknown --outtype {shown(outtype)}", fix)
    return outtype


def check_gguf_out(out: Path, force: bool) -> None:
    """OUT: a file ending in .gguf, outside any run, new unless --force."""
    from octlm.tools.outputs import check_folder_out, check_no_file_above

    if out.suffix.lower() != ".gguf" or out.is_dir():
        what = "is a folder" if out.is_dir() else "does not end in .gguf"
        raise OctlmError(f"{shown_path(out)} {what}", "name a file ending in .gguf for OUT")
    check_no_file_above("OUT", out)
    check_folder_out("OUT", out.parent, force=True)  # not a run's folder nor inside one
    if out.exists() and not force:
        raise OctlmError(f"{shown_path(out)} already exists", "choose another OUT, or --force")


def check_byte_level(tokenizer_json: dict[str, Any], path: Path) -> None:
    """GGUF's gpt2 tokenizer is byte-level BPE with GPT-2's regex: octlm's. A tokenizer.json
    that splits or normalises text otherwise would tokenize differently in llama.cpp."""
    model = tokenizer_json.get("model") or {}
    pre = tokenizer_json.get("pre_tokenizer") or {}
    octlms = (
        model.get("type") == "BPE"
        and tokenizer_json.get("normalizer") is None
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True)
        and not pre.get("add_prefix_space", False)
    )
    if not octlms:
        raise OctlmError(
            f"{shown_path(path)} is not byte-level BPE with GPT-2's pre-tokenizer (octlm's), "
            "the only tokenizer this GGUF export writes",
            "use --format hf, whose tokenizer.json keeps it as it is",
        )


def token_types(tok: Tokenizer, vocab: int) -> list[int]:
    added = tok.hf.get_added_tokens_decoder()
    types = [NORMAL] * vocab
    for idx, token in added.items():
        if idx < vocab:
            types[idx] = CONTROL if token.special else USER_DEFINED
    return types


def tokenizer_metadata(tok: Tokenizer, tok_path: Path, vocab: int) -> dict[str, list[Any]]:
    """GGUF's `gpt2` tokens, types and merges of the run's tokenizer (ids past the tokenizer's,
    if the model has any, as unused `[PAD{i}]`); a tokenizer GGUF's gpt2 would read otherwise
    is refused."""
    tokenizer_json = json.loads(tok_path.read_text(encoding="utf-8"))
    check_byte_level(tokenizer_json, tok_path)
    if vocab < tok.vocab_size:
        raise OctlmError(
            f"the model's vocabulary of {vocab} is smaller than its tokenizer's {tok.vocab_size}",
            "name the tokenizer the run trained with (--tokenizer)",
        )
    tokens = [tok.id_to_token(i) or f"[PAD{i}]" for i in range(tok.vocab_size)]
    tokens += [f"[PAD{i}]" for i in range(tok.vocab_size, vocab)]
    types = token_types(tok, tok.vocab_size) + [UNUSED] * (vocab - tok.vocab_size)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer_json["model"]["merges"]]
    return {"tokens": tokens, "types": types, "merges": merges}


def add_tokenizer(writer: Any, tok: Tokenizer, vocab: dict[str, list[Any]], chat: bool) -> None:
    """GGUF's tokenizer metadata: `gpt2` BPE with `vocab` (`tokenizer_metadata`), the special
    ids and, for a chat run, the chat format's Jinja template."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(GPT2_PRE)
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    if tok.bos_id is not None:
        writer.add_bos_token_id(tok.bos_id)
    writer.add_eos_token_id(tok.eos_id)
    writer.add_pad_token_id(tok.pad_id)
    # llama.cpp then prompts BOS + text, as `octlm generate` does; EOS ends a reply.
    writer.add_add_bos_token(tok.bos_id is not None)
    writer.add_add_eos_token(False)
    if chat:
        writer.add_chat_template(JINJA_TEMPLATE)


def add_hparams(writer: Any, config: ModelConfig, name: str, outtype: str) -> None:
    writer.add_name(name)
    writer.add_context_length(config.context)
    writer.add_embedding_length(config.d_model)
    writer.add_block_count(config.n_layers)
    writer.add_feed_forward_length(config.d_ff)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(float(config.rope_base))
    writer.add_layer_norm_rms_eps(float(config.norm_eps))
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(FILE_TYPES[outtype])


def typed(gguf: Any, tensor: torch.Tensor, outtype: str) -> tuple[np.ndarray, Any]:
    """(data, raw type) as convert writes it: 1-D tensors f32; 2-D ones f16, or q8_0 where
    their rows split into blocks of 32 (f16 otherwise)."""
    data = tensor.numpy()
    if outtype == "f32" or data.ndim == 1:
        return data, gguf.GGMLQuantizationType.F32
    if outtype == "q8_0" and data.shape[-1] % Q8_BLOCK == 0:
        kind = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(data, kind), kind
    return data.astype("float16"), gguf.GGMLQuantizationType.F16


def export_gguf(
    run_or_ckpt: str | Path,
    out: str | Path,
    *,
    force: bool = False,
    tokenizer: str | Path | None = None,
    outtype: str | None = None,
) -> Path:
    """Write OUT.gguf (see the module's doc); a model llama.cpp's llama and qwen3 cannot compute
    is refused before anything is written."""
    from octlm.config.shape import ModelConfig
    from octlm.data.dataset_tokenizer import tokenizer_at
    from octlm.extras import require
    from octlm.fsutil import atomic_write
    from octlm.generation.trained import load_weights, tokenizer_file
    from octlm.model.hf import check_exportable
    from octlm.tools.outputs import check_finite

    out = Path(out)
    outtype = check_outtype(outtype, "gguf")
    check_gguf_out(out, force)
    gguf = require("gguf", "octlm export --format gguf")
    info, weights = load_weights(run_or_ckpt)
    config = ModelConfig.from_dict(info.model_config)  # type: ignore[arg-type]
    check_exportable(config, "llama.cpp")
    check_finite(weights, "the exported weights")
    tok_path = tokenizer_file(info, tokenizer)
    tok = tokenizer_at(tok_path)
    vocab = tokenizer_metadata(tok, tok_path, config.vocab_size)
    chat = trained_on_chat(info.data_dir)
    tensors = gguf_tensors(weights, config)
    arch = "qwen3" if config.qk_norm else "llama"

    def write(tmp: Path) -> None:
        writer = gguf.GGUFWriter(str(tmp), arch)
        try:
            add_hparams(writer, config, out.stem, outtype)
            add_tokenizer(writer, tok, vocab, chat)
            for tensor_name, tensor in tensors.items():
                data, kind = typed(gguf, tensor, outtype)
                writer.add_tensor(tensor_name, data, raw_dtype=kind)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, write)
    return out
