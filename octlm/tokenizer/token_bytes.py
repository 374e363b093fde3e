"""Bytes of text per token id, for bits per byte: one table per tokenizer, read from its JSON.

Three kinds of token string, told apart by the tokenizer's own settings:

- ByteLevel (GPT-2 style, octlm's own): each character of a token stands for one byte through
  the byte-level alphabet, so a token is `len(token)` bytes;
- sentencepiece-style BPE (Llama/Mistral: Metaspace "▁" or a Replace normalizer, byte fallback):
  "▁" is one space, a byte-fallback token `<0x0A>` is one byte, the rest is UTF-8;
- special tokens (the resolved BOS/EOS/PAD and every added token marked special): 0 bytes.

The table is per token, not per position, so the "▁" a Metaspace tokenizer prepends to each
text counts as one byte although the text never had it: one byte per document over the text's
UTF-8 size (`octlm prepare`'s `text_bytes`), about 0.1% of a 1 kB document (none for a text
that starts with a space: Metaspace prepends nothing there). Counting it 0 would
make every other "▁" (the spaces between words) wrong instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import tokenizers
from tokenizers import pre_tokenizers

METASPACE = "\u2581"
_BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _types(node: Any) -> set[str]:
    """Every "type" in a (possibly nested, e.g. Sequence) component of tokenizer.json."""
    if isinstance(node, dict):
        return {str(node.get("type", ""))}.union(*(_types(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_types(v) for v in node))
    return set()


def token_bytes_table(hf: tokenizers.Tokenizer, special_ids: Iterable[int]) -> np.ndarray:
    """int32 array of vocab size: the UTF-8 bytes each token id decodes to (0 for specials)."""
    spec = json.loads(hf.to_str())
    byte_level = "ByteLevel" in _types(spec.get("decoder")) | _types(spec.get("pre_tokenizer"))
    byte_fallback = bool((spec.get("model") or {}).get("byte_fallback"))
    added = {t["content"] for t in spec.get("added_tokens", [])}  # stored as raw text
    special = {int(i) for i in special_ids}
    special |= {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    table = np.zeros(hf.get_vocab_size(), dtype=np.int32)
    for token, idx in hf.get_vocab().items():
        if idx in special:
            continue
        if byte_fallback and _BYTE_FALLBACK.fullmatch(token):
            table[idx] = 1
        elif byte_level and token not in added:
            table[idx] = sum(1 if c in alphabet else len(c.encode("utf-8")) for c in token)
        else:
            table[idx] = len(token.replace(METASPACE, " ").encode("utf-8"))
    return table
