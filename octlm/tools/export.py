"""Export a run's model: a Hugging Face Llama (or Qwen3) folder, or one plain safetensors file.

octlm's model is Llama's architecture with Llama's RoPE layout (Qwen3's with --qk-norm), so the
`hf` export is a renaming of tensors (`octlm.model.hf`'s table) plus config and tokenizer files; no
tensor is permuted. A model with --logit-softcap has no such architecture and is refused. Only
safetensors and json are needed here: `transformers` is for whoever loads the result, never
imported by octlm.
Importing this module imports no torch (the CLI parser reads FORMATS); exporting does.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from octlm.config.checks import shown, shown_path
from octlm.data.chat_format import JINJA_TEMPLATE, trained_on_chat
from octlm.data.shards import TOKENIZER_NAME
from octlm.errors import OctlmError
from octlm.fsutil import atomic_write, tmp_path
from octlm.model.hf import hf_config, hf_state_dict
from octlm.tokenizer.core import Tokenizer
from octlm.tools.gguf_export import check_outtype, export_gguf
from octlm.tools.outputs import check_finite, check_folder_out

FORMATS = ("hf", "safetensors", "gguf")
SAFETENSORS_NAME = "model.safetensors"


def special_tokens(tok: Tokenizer) -> dict[str, str | None]:
    """The BOS/EOS/PAD token strings of the ids the run's data used (no BOS: null)."""
    return {
        f"{role}_token": None if idx is None else tok.id_to_token(idx)
        for role, idx in tok.specials.to_dict().items()
    }


def tokenizer_config(context: int, tok: Tokenizer, chat: bool = False) -> dict[str, Any]:
    """tokenizer_config.json: the copied tokenizer.json as is, encoding like octlm's encode.

    No BOS/EOS is added (octlm's tokenizer.json has no post-processor; a Hugging Face one's is
    switched off by the explicit flags), so `tok(text).input_ids == encode(text,
    add_special_tokens=False)`. split_special_tokens keeps a literal "<|eos|>" in text as text,
    as octlm does; decoding keeps spaces as they are.

    `chat` (a chat fine-tune): the chat format's Jinja template, so `apply_chat_template`
    gives `octlm.data.chat_format`'s ids. Its rendered string holds BOS/EOS as text, which the
    tokenizer must read as the tokens: split_special_tokens is off. The two agree on any text
    without a special token's string in it, which `prepare --format chat` refuses in turns.
    """
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_tokens(tok),
        "add_bos_token": False,
        "add_eos_token": False,
        "split_special_tokens": not chat,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
    }
    if chat:
        config["chat_template"] = JINJA_TEMPLATE
    return config


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _umask_mode(path: Path) -> None:
    """Give `path` the mode of an ordinary new file: safetensors creates its files 0600."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def check_out(out: Path, fmt: str, force: bool) -> None:
    """OUT before any work: never a run folder nor inside one (a file as much as a folder: a
    checkpoint there is the run's), no file among its parents, and new or empty unless
    --force; `--format safetensors` writes a file where OUT ends in .safetensors."""
    if fmt != "safetensors" or out.suffix != ".safetensors":
        if out.exists() and not out.is_dir():
            fix = "name a folder for --format hf"
            if fmt != "hf":
                fix = "name a folder, or a file ending in .safetensors"
            raise OctlmError(f"{shown_path(out)} is a file", fix)
        check_folder_out("OUT", out, force)
        return
    if out.is_dir():
        raise OctlmError(f"{shown_path(out)} is a folder", "name a file ending in .safetensors")
    check_folder_out("OUT", out.parent, force=True)  # a run's folder, a file above
    if out.exists() and not force:
        raise OctlmError(
            f"{shown_path(out)} already exists and is not empty", "choose another OUT, or --force"
        )


def _publish(staging: Path, out: Path) -> None:
    """Move the finished files into `out`: one rename when it is new, file by file otherwise."""
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        os.replace(staging, out)
        return
    for item in staging.iterdir():  # --force: replace our files, leave any others alone
        os.replace(item, out / item.name)


def export_hf(
    run_or_ckpt: str | Path,
    out: str | Path,
    *,
    force: bool = False,
    tokenizer: str | Path | None = None,
) -> Path:
    """Write a LlamaForCausalLM folder (Qwen3ForCausalLM for a model with qk_norm): config,
    weights, tokenizer and generation config. A soft-capped model is refused before anything
    is written."""
    from safetensors.torch import save_file

    from octlm.config.shape import ModelConfig
    from octlm.data.dataset_tokenizer import tokenizer_at
    from octlm.generation.trained import load_weights, tokenizer_file

    out = Path(out)
    check_out(out, "hf", force)
    info, weights = load_weights(run_or_ckpt)
    check_finite(weights, "the exported weights")
    config = ModelConfig.from_dict(info.model_config)  # type: ignore[arg-type]
    model_json = hf_config(config, weights["tok_embeddings.weight"].dtype)  # or refused
    tensors = hf_state_dict(weights, config.n_layers, config.qk_norm)
    tok_path = tokenizer_file(info, tokenizer)
    tok = tokenizer_at(tok_path)  # with the BOS/EOS/PAD ids the data was prepared with
    ids = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
    # Everything goes into a sibling folder first, so a failure leaves OUT as it was.
    staging = tmp_path(out)
    shutil.rmtree(staging, ignore_errors=True)  # left by a killed export with our pid
    staging.mkdir(parents=True)
    try:
        save_file(tensors, str(staging / SAFETENSORS_NAME), metadata={"format": "pt"})
        _write_json(staging / "config.json", {**model_json, **ids})
        _write_json(staging / "generation_config.json", {**ids, "do_sample": False})
        shutil.copyfile(tok_path, staging / TOKENIZER_NAME)
        chat = trained_on_chat(info.data_dir)
        _write_json(staging / "tokenizer_config.json", tokenizer_config(config.context, tok, chat))
        _write_json(staging / "special_tokens_map.json", special_tokens(tok))
        _umask_mode(staging / SAFETENSORS_NAME)
        _publish(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def export_safetensors(run_or_ckpt: str | Path, out: str | Path, *, force: bool = False) -> Path:
    """Write octlm's weights to one file, with an octlm snapshot header in its metadata.

    The header makes the file a weights-only snapshot, so `octlm hash/eval/generate` accept it.
    OUT ending in .safetensors names the file; anything else is a folder for model.safetensors.
    """
    out = Path(out)
    check_out(out, "safetensors", force)
    from safetensors.torch import save_file

    from octlm.generation.trained import load_weights

    target = out if out.suffix == ".safetensors" else out / SAFETENSORS_NAME
    info, weights = load_weights(run_or_ckpt)
    check_finite(weights, "the exported weights")
    header = info.snapshot_header()
    tensors = {name: t.detach().contiguous() for name, t in weights.items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(
        target,
        lambda tmp: (
            save_file(tensors, str(tmp), metadata={"format": "pt", "octlm": json.dumps(header)}),
            _umask_mode(tmp),
        ),
    )
    return target


def export(
    run_or_ckpt: str | Path,
    fmt: str,
    out: str | Path,
    *,
    force: bool = False,
    tokenizer: str | Path | None = None,
    outtype: str | None = None,
) -> Path:
    """Export in `fmt` (one of FORMATS) to `out`; returns the folder or file written.
    `outtype` (gguf only): the tensor type, f32, f16 (default) or q8_0."""
    check_outtype(outtype, fmt)
    if fmt == "gguf":
        return export_gguf(run_or_ckpt, out, force=force, tokenizer=tokenizer, outtype=outtype)
    if fmt == "hf":
        return export_hf(run_or_ckpt, out, force=force, tokenizer=tokenizer)
    if fmt == "safetensors":
        return export_safetensors(run_or_ckpt, out, force=force)
    raise OctlmError(f"unknown export format {shown(fmt)}", f"use one of: {', '.join(FORMATS)}")
