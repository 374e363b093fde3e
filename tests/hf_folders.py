"""Hugging Face tokenizer folders built in a test, with real `tokenizers` + `transformers`.

Two kinds, as on the Hub: a GPT-2-style ByteLevel BPE whose `<s>`/`</s>` are appended at the end
of the vocabulary (no PAD; transformers adds no BOS: no post-processor), and a Llama-style
Metaspace BPE with byte fallback, `<unk>`/`<s>`/`</s>` at ids 0-2, no PAD, BOS added.
Also a random `LlamaForCausalLM` and `Qwen3ForCausalLM` saved by transformers, and copies of
such a folder with its config.json changed (the `--init-from` refusals). Test modules import
from here, never from each other.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

METASPACE = "\u2581"
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "to",
    "be",
    "or",
    "not",
    "that",
    "is",
    "question",
    "whether",
    "tis",
    "nobler",
    "in",
    "mind",
    "suffer",
    "slings",
    "arrows",
    "outrageous",
    "fortune",
    "café",
    "naïve",
    "über",
    "straße",
]
# Beyond the training text: the byte-level alphabet / byte fallback must carry these.
VARIED = (
    "Plain ASCII, punctuation!? (brackets) [and] {braces}; numbers 12,345.67 & tabs\there.\n"
    "Ünïcödé: café, naïve, Straße, Ελληνικά, русский, 日本語のテキスト, 中文, 한국어.\n"
    "Emoji 🎭👋🏽 and combining e\u0301, a non-breaking\u00a0space, CRLF\r\nend."
)


def corpus_texts(n: int, seed: int = 0) -> list[str]:
    """`n` generated documents of a few sentences each (deterministic for a seed)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        sentences = [" ".join(rng.choices(WORDS, k=rng.randint(4, 12))) for _ in range(3)]
        docs.append(". ".join(s.capitalize() for s in sentences) + ".\n")
    return docs


def _save(tok: Tokenizer, folder: Path, **specials: object) -> Path:
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tok, **specials).save_pretrained(str(folder))
    return folder


def byte_level_folder(folder: Path, vocab_size: int = 400) -> Path:
    """GPT-2 style: specials appended after the trained vocabulary, so not at ids 0-2."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_texts(200), trainer)
    tok.add_special_tokens(["<s>", "</s>"])
    return _save(tok, folder, bos_token="<s>", eos_token="</s>")


def llama_folder(folder: Path, vocab_size: int = 512) -> Path:
    """Llama/Mistral style: Metaspace "▁", byte fallback `<0x00>`..`<0xFF>` at ids 3-258."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace(METASPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 256,
        special_tokens=["<unk>", "<s>", "</s>"],
        show_progress=False,
    )
    tok.train_from_iterator(corpus_texts(200), trainer)
    # The trainer knows no byte fallback: put the 256 byte tokens after the specials, as Llama's.
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    order = sorted(vocab, key=vocab.get)
    order = order[:3] + byte_tokens + [t for t in order[3:] if t not in set(byte_tokens)]
    spec["model"]["vocab"] = {t: i for i, t in enumerate(order)}
    tok = Tokenizer.from_str(json.dumps(spec))
    return _save(
        tok, folder, bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_bos_token=True
    )


DROP = object()
"""In a `config_variant` change: remove the key."""


def _small(vocab_size: int, config: dict[str, object]) -> dict[str, object]:
    """The config of the random models: 2 layers, d 32, 4 heads / 2 kv, context 64, tied."""
    return {
        "vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": True, **config,
    }  # fmt: skip


def random_llama(folder: Path, vocab_size: int = 512, **config: object):
    """A random tied `LlamaForCausalLM` (2 layers, d 32, 4 heads / 2 kv, context 64; seed 0)
    saved in `folder` with transformers' own save_pretrained; returns the model."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_small(vocab_size, config)))
    model.eval().save_pretrained(folder)
    return model


def random_qwen3(folder: Path, vocab_size: int = 512, **config: object):
    """A random tied `Qwen3ForCausalLM` of `random_llama`'s shape (head_dim 8, no sliding
    window; seed 0) whose norm gains, q/k norms included, are drawn in [0.5, 2] (transformers
    initialises them to 1), saved with transformers' own save_pretrained; returns the model."""
    import torch
    import transformers

    torch.manual_seed(0)
    settings = _small(vocab_size, {"head_dim": 8, **config})
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**settings)).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("norm.weight"):
                weight.uniform_(0.5, 2.0)
    model.save_pretrained(folder)
    return model


def config_variant(base: Path, folder: Path, change: dict[str, object] | str) -> Path:
    """A copy of the Llama folder `base` whose config.json has `change` merged in (a key set
    to DROP removed), or, given a string, is that text."""
    shutil.copytree(base, folder)
    if isinstance(change, str):
        text = change
    else:
        merged = {**json.loads((base / "config.json").read_text()), **change}
        text = json.dumps({k: v for k, v in merged.items() if v is not DROP})
    (folder / "config.json").write_text(text, encoding="utf-8")
    return folder
