"""A dataset's tokenizer entry in its manifest: written by `prepare`, read by whoever loads the
dataset's tokenizer, so both see the same BOS/EOS/PAD ids.

The ids are recorded (`"specials": {"bos": 1, "eos": 2, "pad": 2}`) only when they are not
octlm's own tokens' ids: a dataset made with an octlm tokenizer keeps the manifest, and the
fingerprint, it had before Hugging Face tokenizers were read. A Hugging Face tokenizer's ids
come from its folder's config files, which the dataset does not copy: the manifest is where
they are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from octlm.data.shards import MANIFEST_NAME, TOKENIZER_NAME, ShardDataset, load_manifest
from octlm.hashing import file_sha256
from octlm.tokenizer.core import Specials, Tokenizer, octlm_specials
from octlm.tokenizer.hf_folder import open_tokenizer


def tokenizer_entry(tokenizer: Tokenizer) -> dict[str, Any]:
    """The manifest's "tokenizer" entry."""
    entry: dict[str, Any] = {
        "file": TOKENIZER_NAME,
        "fingerprint": tokenizer.fingerprint,
        "vocab_size": tokenizer.vocab_size,
    }
    if tokenizer.specials != octlm_specials(tokenizer.hf):
        entry["specials"] = tokenizer.specials.to_dict()
    return entry


def entry_specials(entry: dict[str, Any]) -> Specials | None:
    """The specials a manifest's tokenizer entry records; None: octlm's own tokens."""
    return Specials.from_dict(entry["specials"]) if "specials" in entry else None


def dataset_tokenizer(dataset: ShardDataset) -> Tokenizer:
    """The dataset's tokenizer.json with the special ids it was prepared with."""
    return Tokenizer.load(dataset.tokenizer_path, entry_specials(dataset.manifest["tokenizer"]))


def tokenizer_at(path: Path) -> Tokenizer:
    """A tokenizer.json given by path: a dataset's (its manifest's specials, when the manifest is
    of this file) or any other (`open_tokenizer`: the config files beside it)."""
    if path.name == TOKENIZER_NAME and (path.parent / MANIFEST_NAME).is_file():
        entry = load_manifest(path.parent)["tokenizer"]
        if entry["fingerprint"] == file_sha256(path):
            return Tokenizer.load(path, entry_specials(entry))
    return open_tokenizer(path)
