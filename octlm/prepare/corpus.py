"""Whole corpora in memory, for small jobs: the embedded Shakespeare, a list of documents read
from files, and their train/validation split (`prepare` streams instead; the rules are the
same functions, in `sources.py` and `split.py`).
"""

from __future__ import annotations

import lzma
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from octlm.errors import DataError
from octlm.prepare.scan import documents
from octlm.prepare.sources import EMBEDDED_NAME, Document, ReadOptions, find_sources
from octlm.prepare.split import VAL, KeyTable, SplitRule, plan_split

# sha256 of the uncompressed JSONL, as printed by scripts/build_corpus.py.
CORPUS_SHA256 = "7d1dc0f402e1e20f6a0a0c90220a18da4ee43eea88e7165e9c6c2ca1cda39be0"


def embedded_bytes() -> bytes:
    """The uncompressed JSONL of the embedded corpus (42 works of Shakespeare)."""
    blob = resources.files("octlm").joinpath("assets").joinpath(EMBEDDED_NAME).read_bytes()
    return lzma.decompress(blob)


def embedded_documents() -> list[Document]:
    return read_documents(())


def read_documents(inputs: Sequence[str | Path], opts: ReadOptions | None = None) -> list[Document]:
    """Every non-blank document of the inputs, in input order (no inputs: the embedded corpus);
    ids must be unique."""
    docs = list(documents(find_sources(inputs), opts or ReadOptions()))
    if not docs:
        raise DataError("the corpus is empty: no document holds any text", "add text to the inputs")
    seen: set[str] = set()
    for doc in docs:
        if doc.id in seen:
            raise DataError(
                f"two documents share the id {doc.id!r}",
                "give each JSONL line a unique id, and each input file a unique name",
            )
        seen.add(doc.id)
    return docs


def split_documents(
    docs: Sequence[Document], val_fraction: float = 0.1
) -> tuple[list[Document], list[Document]]:
    """The split `prepare` makes by a document fraction: the ids with the smallest sha256 go to
    validation; each split keeps the input order."""
    keys = KeyTable()
    for doc in docs:
        keys.add(doc.id, len(doc.text))
    labels = plan_split(keys, SplitRule(val_fraction=val_fraction, val_tokens=None)).labels
    val = np.asarray(labels) == VAL
    return [d for d, v in zip(docs, val, strict=True) if not v], [
        d for d, v in zip(docs, val, strict=True) if v
    ]
