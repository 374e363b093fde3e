"""Exact fast encoding for `octlm prepare`: split each text once, run BPE once per distinct piece.

HF's byte-level BPE encodes a text in two steps: the ByteLevel pre-tokenizer cuts it into
pieces with the GPT-2 pattern, then the BPE model encodes each piece on its own. On the embedded
corpus the cut is nearly all of HF's time (`pre_tokenize_str` alone takes about as long as
`encode_batch`), and 1.36 M pieces hold only 36,351 distinct ones. So this encoder:

1. splits with Python's `re`, using the GPT-2 pattern with each class (\\p{L}, \\p{N}, \\s)
   written out as the ASCII characters that HF's own pre-tokenizer puts in it, and each
   non-ASCII character matched through an ASCII stand-in of the class HF gives it (`Splitter`).
   The pattern sees a character only through those classes (and a few ASCII literals), so on
   text made of classified characters the split is HF's, whatever Unicode tables HF's regex
   engine has (`regex` 2026.11.19 disagrees with `tokenizers` 0.23.3 on 17,480 code points);
2. encodes each distinct piece once with HF's own model, through a copy of the tokenizer whose
   pre-tokenizer maps bytes without splitting: the ids are HF's by construction (no second BPE,
   so no question of merge order against merge rank);
3. assembles each document's ids from its pieces'.

A character's class comes from four probes: "a"+c, "0"+c, "!"+c and "\\t"+c are one piece
exactly when c is a letter, a number, other, white space. A character that does not land in
exactly one class, or that HF refuses (a lone surrogate), sends its document to HF's
encode_batch. A tokenizer of another shape (a normalizer, another pre-tokenizer, non-special
added tokens, truncation, padding, dropout), or one where a test text that uses every
alternative of the pattern is not split or encoded exactly as HF does, uses HF's encode_batch
for every document.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from itertools import accumulate, chain
from typing import Any

import numpy as np
import tokenizers
from tokenizers import models, pre_tokenizers, processors

from octlm.errors import DataError
from octlm.tokenizer.core import Tokenizer

ENCODER_ENV = "OCTLM_ENCODER"
"""`OCTLM_ENCODER=hf` encodes every document with HF's encode_batch (the reference path)."""

# (class, base): base + c is one piece exactly when c is in the class.
_PROBES = (("L", "a"), ("N", "0"), ("O", "!"), ("S", "\t"))
# Each alternative of the pattern, in and out of context, in ASCII and beyond.
_WITNESS = (
    "Don't DON'T it's IT'S we're we've I'm you'll he'd 'x ''s 's\n a  b\t\tc \n\n d 12 3.5 "
    "ab12cd !!x ?? ,, \r\n  \t end café naïve — “quoted” 日本語の ١٢٣ ½ e\u0301 \u00a0x\u2003y "
    "\u3000z 🎭 \x00\x1f\x85 \u2028 done   "
)
_MAX_CACHED_PIECES = 1 << 20  # about 150 MB of piece -> ids; only speed depends on what is kept


def use_fast_path() -> bool:
    """False when OCTLM_ENCODER=hf; an unknown value is an error, not a silent default."""
    value = os.environ.get(ENCODER_ENV, "").strip().lower()
    if value not in ("", "auto", "hf"):
        raise DataError(
            f"{ENCODER_ENV}={value!r} is not 'auto' or 'hf'",
            f"unset {ENCODER_ENV}, or set it to hf to encode with HF's encode_batch only",
        )
    return value != "hf"


def unsupported(hf: tokenizers.Tokenizer) -> str | None:
    """Why this tokenizer's ids may not be "split, then BPE each piece alone"; None if they are."""
    pre, post = hf.pre_tokenizer, hf.post_processor
    if hf.normalizer is not None:
        return "the tokenizer has a normalizer"
    if not hf.encode_special_tokens:
        return "HF would cut special tokens out of the text"
    if not isinstance(pre, pre_tokenizers.ByteLevel) or pre.add_prefix_space or not pre.use_regex:
        return "the pre-tokenizer is not ByteLevel(add_prefix_space=False, use_regex=True)"
    if not isinstance(hf.model, models.BPE) or hf.model.dropout is not None:
        return "the model is not a BPE without dropout"
    if not all(t.special for t in hf.get_added_tokens_decoder().values()):
        return "the tokenizer has non-special added tokens (HF cuts them out of the text)"
    if hf.truncation is not None or hf.padding is not None:
        return "the tokenizer truncates or pads"
    if post is not None and not isinstance(post, processors.ByteLevel):
        return "the post-processor is not ByteLevel"
    return None


def classify(pre: pre_tokenizers.PreTokenizer, chars: Iterable[str]) -> dict[str, str | None]:
    """Each character's class under HF's pre-tokenizer: "L", "N", "O", "S", or None if unclear."""
    out: dict[str, str | None] = {}
    for c in chars:
        try:
            hits = [k for k, base in _PROBES if len(pre.pre_tokenize_str(base + c)) == 1]
        except Exception:  # HF refuses the character (a lone surrogate): HF decides the document
            hits = []
        out[c] = hits[0] if len(hits) == 1 else None
    return out


def _char_set(chars: Iterable[str], negate: bool = False) -> str:
    """A `re` character class of exactly `chars`, as escaped code point ranges."""
    ranges: list[list[int]] = []
    for cp in sorted(map(ord, chars)):
        if ranges and cp == ranges[-1][1] + 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    body = "".join(rf"\U{a:08x}" if a == b else rf"\U{a:08x}-\U{b:08x}" for a, b in ranges)
    return f"[{'^' if negate else ''}{body}]"


def split_pattern(classes: dict[str, str | None]) -> re.Pattern[str]:
    """HF's ByteLevel pattern, exact on text made of characters `classes` gives a class."""
    sets = {k: _char_set(c for c, cls in classes.items() if cls == k) for k, _ in _PROBES}
    not_space = _char_set((c for c, cls in classes.items() if cls == "S"), negate=True)
    letter, number, other, space = sets["L"], sets["N"], sets["O"], sets["S"]
    # HF: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    return re.compile(
        rf"'s|'t|'re|'ve|'m|'ll|'d| ?{letter}+| ?{number}+| ?{other}+"
        rf"|{space}+(?!{not_space})|{space}+"
    )


class Splitter:
    """HF's ByteLevel split of a text, with Python's `re` on ASCII.

    The pattern is built from HF's classes of the 128 ASCII characters. A non-ASCII character
    is replaced by the ASCII probe base of its class ("a", "0", "!", "\\t") before matching: the
    pattern looks at a character only for its class and for equality with ASCII literals, which
    no non-ASCII character and no base passes, so the matches cover the same spans.
    """

    def __init__(self, pre: pre_tokenizers.PreTokenizer) -> None:
        self._pre = pre
        ascii_classes = classify(pre, map(chr, range(128)))
        self.ok = None not in ascii_classes.values() and all(
            ascii_classes[base] == k for k, base in _PROBES
        )
        if not self.ok:
            return
        self._pattern = split_pattern(ascii_classes)
        self._base = {k: ord(base) for k, base in _PROBES}
        self._stand_in: dict[int, int | None] = {i: i for i in range(128)}
        # Guard against an HF whose ByteLevel pattern is no longer GPT-2's: every alternative.
        expected = [_WITNESS[a:b] for _, (a, b) in pre.pre_tokenize_str(_WITNESS)]
        self.ok = self.split(_WITNESS) == expected

    def split(self, text: str) -> list[str] | None:
        """The pieces HF cuts `text` into; None when a character has no class (HF decides)."""
        if text.isascii():
            pieces = self._pattern.findall(text)
        else:
            chars = set(text)
            new = {c for c in chars if ord(c) not in self._stand_in}
            for c, cls in classify(self._pre, new).items():
                self._stand_in[ord(c)] = None if cls is None else self._base[cls]
            if any(self._stand_in[ord(c)] is None for c in chars):
                return None
            ends = list(accumulate(map(len, self._pattern.findall(text.translate(self._stand_in)))))
            pieces = [text[a:b] for a, b in zip([0, *ends], ends, strict=False)]
        # Every character is in a class, so the matches tile the text; check it all the same.
        return pieces if sum(map(len, pieces)) == len(text) else None


class DocumentEncoder:
    """`Tokenizer.encode_batch` (BOS + ids + EOS per text, no BOS when the tokenizer has none),
    by split-and-dedupe where exact."""

    def __init__(self, tokenizer: Tokenizer, fast: bool = True) -> None:
        self.tokenizer = tokenizer
        self.counts = {"piecewise": 0, "hf": 0}
        self.hf_because = unsupported(tokenizer.hf) if fast else f"{ENCODER_ENV}=hf"
        if self.hf_because is not None:
            return
        self._splitter = Splitter(tokenizer.hf.pre_tokenizer)
        if not self._splitter.ok:
            self.hf_because = "HF's pre-tokenizer does not split like the GPT-2 pattern"
            return
        # The same model, fed one piece at a time: bytes mapped, no split.
        self._model = tokenizers.Tokenizer.from_str(tokenizer.hf.to_str())
        self._model.pre_tokenizer = pre_tokenizers.ByteLevel(
            add_prefix_space=False, use_regex=False
        )
        self._model.encode_special_tokens = True
        self._cache: dict[str, list[int]] = {}
        # And end to end: split, the copy's ids per piece, assembly.
        witness = self._encode_pieces([self._splitter.split(_WITNESS) or []])[0].tolist()
        if witness != tokenizer.encode(_WITNESS):
            self.hf_because = "the piecewise ids of a test text differ from HF's"

    def note(self) -> dict[str, Any]:
        """For the manifest: how many documents went each way (the ids are the same)."""
        return {**self.counts, **({"hf_because": self.hf_because} if self.hf_because else {})}

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        if self.hf_because:
            pieces: list[list[str] | None] = [None] * len(texts)
        else:
            pieces = [self._splitter.split(t) for t in texts]
        fast = [i for i, p in enumerate(pieces) if p is not None]
        slow = [i for i, p in enumerate(pieces) if p is None]
        out: list[np.ndarray] = [np.empty(0, np.int64)] * len(texts)
        if fast:
            fast_ids = self._encode_pieces([pieces[i] for i in fast])
            for i, ids in zip(fast, fast_ids, strict=True):
                out[i] = ids
        if slow:
            slow_ids = self.tokenizer.encode_batch([texts[i] for i in slow])
            for i, ids in zip(slow, slow_ids, strict=True):
                out[i] = np.asarray(ids, dtype=np.int64)
        self.counts["piecewise"] += len(fast)
        self.counts["hf"] += len(slow)
        return out

    def _encode_pieces(self, pieces: list[list[str]]) -> list[np.ndarray]:
        distinct = set().union(*pieces)
        if len(self._cache) + len(distinct) > _MAX_CACHED_PIECES:
            self._cache.clear()
        new = [p for p in distinct if p not in self._cache]
        encoded = self._model.encode_batch(new, add_special_tokens=False)
        self._cache.update(zip(new, (e.ids for e in encoded), strict=True))
        ids_of, head, tail = (
            self._cache.__getitem__,
            tuple(self.tokenizer.start_ids),
            (self.tokenizer.eos_id,),
        )
        return [
            np.fromiter(chain(head, chain.from_iterable(map(ids_of, doc)), tail), np.int64)
            for doc in pieces
        ]
