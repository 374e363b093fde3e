"""A BPE tokenizer (HF `tokenizers`) and the ids of its BOS, EOS and PAD.

octlm trains byte-level BPE with its three special tokens `<|bos|>`, `<|eos|>`, `<|pad|>` (ids
0-2); a Hugging Face tokenizer has its own, found in its folder's config files
(`octlm.tokenizer.hf_folder`) and handed in as `Specials`. User text is never parsed for special
tokens: a literal "<|eos|>" (or "</s>") inside a document is encoded as ordinary text, so only
`encode(..., add_special_tokens=True)` can emit BOS/EOS. The saved file is a standard
`tokenizer.json`; `fingerprint` is the sha256 of its bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from octlm.errors import TokenizerError
from octlm.hashing import file_sha256, sha256_bytes
from octlm.tokenizer.token_bytes import token_bytes_table

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, PAD)  # ids 0, 1, 2 in every octlm tokenizer
DEFAULT_VOCAB_SIZE = 32768
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # every byte must stay encodable


@dataclass(frozen=True, slots=True)
class Specials:
    """The ids octlm frames documents with: `[bos] + text + [eos]`, padded with `pad`."""

    bos: int | None
    """None: documents start with no BOS (the tokenizer has none, or its config says not to
    add one); the previous document's EOS is then all that separates them."""
    eos: int
    pad: int
    """Input id of padding; its targets are masked by position, never by id, so PAD may be EOS."""

    def to_dict(self) -> dict[str, Any]:
        return {"bos": self.bos, "eos": self.eos, "pad": self.pad}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Specials:
        bos = d["bos"]
        return cls(bos=None if bos is None else int(bos), eos=int(d["eos"]), pad=int(d["pad"]))


OCTLM_SPECIALS = Specials(bos=0, eos=1, pad=2)


def octlm_specials(hf: tokenizers.Tokenizer) -> Specials | None:
    """The ids of `<|bos|>`, `<|eos|>`, `<|pad|>` in `hf`; None if one is missing."""
    bos, eos, pad = (hf.token_to_id(t) for t in SPECIAL_TOKENS)
    return None if None in (bos, eos, pad) else Specials(bos=bos, eos=eos, pad=pad)


class Tokenizer:
    """A trained tokenizer plus the per-token byte lengths that bits-per-byte needs."""

    def __init__(
        self, hf: tokenizers.Tokenizer, fingerprint: str, specials: Specials | None = None
    ) -> None:
        """`specials` None: octlm's own special tokens, wherever they are (ids 0-2 when octlm
        trained it)."""
        if specials is None:
            specials = octlm_specials(hf)
            if specials is None:
                raise TokenizerError(
                    f"tokenizer lacks octlm's special tokens {SPECIAL_TOKENS} "
                    f"(found ids {[hf.token_to_id(t) for t in SPECIAL_TOKENS]})",
                    "train one with `octlm tokenizer train`, or pass the Hugging Face folder "
                    "whose config files name its BOS/EOS/PAD (`--tokenizer DIR`)",
                )
        vocab_size = hf.get_vocab_size()
        for name, idx in specials.to_dict().items():
            if idx is not None and not 0 <= idx < vocab_size:
                raise TokenizerError(
                    f"{name} id {idx} is outside the tokenizer's vocabulary of {vocab_size}",
                    "fix the id in the tokenizer's config files",
                )
        hf.encode_special_tokens = True  # literal "<|eos|>" in text stays text
        self._hf = hf
        self.fingerprint = fingerprint
        self.specials = specials
        self.bos_id, self.eos_id, self.pad_id = specials.bos, specials.eos, specials.pad
        self.vocab_size = vocab_size
        ids = [i for i in (specials.bos, specials.eos, specials.pad) if i is not None]
        self.token_bytes_table = token_bytes_table(hf, ids)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
        """Train on `texts` (deterministic: same texts in the same order -> same file)."""
        check_vocab_size(vocab_size)
        hf = tokenizers.Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        hf.train_from_iterator(texts, trainer)
        return cls(hf, sha256_bytes(hf.to_str(pretty=True).encode("utf-8")))

    @classmethod
    def load(cls, path: str | Path, specials: Specials | None = None) -> Tokenizer:
        """A tokenizer.json; `specials` None: octlm's own special tokens (see `__init__`)."""
        return cls(read_tokenizer_json(path), file_sha256(path), specials)

    def save(self, path: str | Path) -> None:
        """Write atomically; the file's sha256 is `self.fingerprint`."""
        path = Path(path)
        data = self._hf.to_str(pretty=True).encode("utf-8")
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # e.g. `path` is a folder, or the disk is full
            raise

    # -- use ----------------------------------------------------------------------------------
    @property
    def start_ids(self) -> list[int]:
        """What a document starts with: `[bos]`, or nothing when there is no BOS."""
        return [] if self.bos_id is None else [self.bos_id]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`add_special_tokens`: the document framing, `[bos] + ids + [eos]` (no BOS if None)."""
        ids = self._hf.encode(text, add_special_tokens=False).ids
        return [*self.start_ids, *ids, self.eos_id] if add_special_tokens else ids

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        """Encode many documents on all cores (the Rust side parallelises)."""
        out = [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]
        if add_special_tokens:
            out = [[*self.start_ids, *ids, self.eos_id] for ids in out]
        return out

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> int:
        """UTF-8 bytes the token decodes to; 0 for special tokens."""
        return int(self.token_bytes_table[token_id])

    def id_to_token(self, token_id: int) -> str | None:
        return self._hf.id_to_token(token_id)

    @property
    def hf(self) -> tokenizers.Tokenizer:
        """The HF tokenizer inside, to read its settings (`fastbpe`); never change it."""
        return self._hf


def read_tokenizer_json(path: str | Path) -> tokenizers.Tokenizer:
    """The HF tokenizer in a tokenizer.json file; a missing or bad file is a one-line error."""
    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"tokenizer file not found: {path}", "check the path")
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception on bad JSON
        raise TokenizerError(
            f"{path} is not a tokenizer.json ({str(exc).splitlines()[0]})",
            "pass a file written by `octlm tokenizer train` or `octlm prepare`, or a Hugging "
            "Face tokenizer.json",
        ) from None


def check_vocab_size(vocab_size: int) -> None:
    if vocab_size < MIN_VOCAB_SIZE:
        raise TokenizerError(
            f"vocabulary size {vocab_size} cannot hold 256 byte tokens plus "
            f"{len(SPECIAL_TOKENS)} special tokens",
            f"use --vocab-size {MIN_VOCAB_SIZE} or more",
        )
    if vocab_size > 2**32:
        raise TokenizerError(f"vocabulary size {vocab_size} is too large", "use at most 2**32")


def capped_sample(texts: Iterable[str], max_chars: int, doc_cap: int) -> Iterator[str]:
    """A tokenizer's sample: each text cut to `doc_cap` characters, until `max_chars` are taken
    (the last one cut to fit). `octlm prepare` and `octlm tokenizer train` share it."""
    left = max_chars
    for text in texts:
        text = text[: min(doc_cap, left)]
        left -= len(text)
        yield text
        if left <= 0:
            return
