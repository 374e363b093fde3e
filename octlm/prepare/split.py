"""The train/validation split: by whole document, decided by document ids alone.

Documents are ranked by the sha256 of their UTF-8 id (its first 16 bytes, as two u64: the same
order as the hex digests, with no tie a corpus will meet); validation takes them from the
smallest, while every limit the rule sets still has room:

- a document count: `val_docs`, or `val_fraction` x n rounded half up (at least 1 each side);
- a token count: `val_tokens`; the document that reaches it is the last one taken.

A token limit cannot be settled before the documents are encoded, so the ranked documents that
could be needed (up to the count limit, and until their characters reach
`CHARS_PER_TOKEN_BOUND` x `val_tokens`) are marked CANDIDATE: `prepare` encodes them to a spool
and `take_tokens` picks validation among them once their tokens are known. Candidates left over
go to training (after the rest of it, in input order).
"""

from __future__ import annotations

import hashlib
import math
from array import array
from dataclasses import dataclass

import numpy as np

from octlm.errors import DataError

TRAIN, VAL, CANDIDATE = 0, 1, 2
DEFAULT_VAL_FRACTION = 0.1
DEFAULT_VAL_TOKENS = 10_000_000
CHARS_PER_TOKEN_BOUND = 8
"""Candidates for a token limit hold at least this many characters per token asked for: twice
what byte-level BPE gets on prose (3-5 characters a token at 4k-65k vocabularies). Should a
corpus beat it, validation ends short of the limit and `prepare` says so."""


@dataclass(frozen=True, slots=True)
class SplitRule:
    """Limits on validation; None is no limit of that kind. The default: 10% of the documents,
    at most about 10M tokens (what a validation loss needs to read to ±0.001, and what keeps a
    50 GB corpus from holding 5 GB out)."""

    val_fraction: float | None = DEFAULT_VAL_FRACTION
    val_docs: int | None = None
    val_tokens: int | None = DEFAULT_VAL_TOKENS

    def __post_init__(self) -> None:
        if self.val_fraction is not None and self.val_docs is not None:
            raise DataError(
                "--val-fraction and --val-docs both set the number of validation documents",
                "pass one of them",
            )
        if self.val_fraction is not None and not 0.0 < self.val_fraction < 1.0:
            raise DataError(
                f"validation fraction {self.val_fraction} is not in (0, 1)", "use e.g. 0.1"
            )
        for name, value in (("--val-docs", self.val_docs), ("--val-tokens", self.val_tokens)):
            if value is not None and value < 1:
                raise DataError(f"{name} {value} is not positive", f"pass {name} 1 or more")
        if self.val_fraction is None and self.val_docs is None and self.val_tokens is None:
            raise DataError(
                "the split rule sets no limit", "pass --val-fraction, --val-docs or --val-tokens"
            )

    def doc_limit(self, n_docs: int) -> int:
        """Most validation documents for a corpus of `n_docs` (at least one stays in training)."""
        if n_docs < 2:
            raise DataError(
                f"the corpus has {n_docs} document; a train/validation split needs at least 2",
                "cut the text into documents with --split-on SEPARATOR, use several files, "
                "or JSONL with one document per line",
            )
        if self.val_docs is not None:
            if self.val_docs >= n_docs:
                raise DataError(
                    f"--val-docs {self.val_docs} leaves no training document of {n_docs}",
                    f"pass at most {n_docs - 1}",
                )
            return self.val_docs
        if self.val_fraction is not None:
            return min(n_docs - 1, max(1, math.floor(n_docs * self.val_fraction + 0.5)))
        return n_docs - 1

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "val_fraction": self.val_fraction,
            "val_docs": self.val_docs,
            "val_tokens": self.val_tokens,
        }


def id_key(doc_id: str) -> tuple[int, int]:
    digest = hashlib.sha256(doc_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:16], "big")


class KeyTable:
    """Per document, in input order: its id's key and its length. The one thing `prepare` keeps
    for every document (24 bytes each)."""

    def __init__(self) -> None:
        self.hi, self.lo, self.chars = array("Q"), array("Q"), array("Q")

    def __len__(self) -> int:
        return len(self.hi)

    def add(self, doc_id: str, chars: int) -> None:
        hi, lo = id_key(doc_id)
        self.hi.append(hi)
        self.lo.append(lo)
        self.chars.append(chars)

    def extend(self, other: KeyTable) -> None:
        self.hi.extend(other.hi)
        self.lo.extend(other.lo)
        self.chars.extend(other.chars)

    def ranking(self) -> np.ndarray:
        """Document indices from the smallest key up."""
        hi = np.frombuffer(self.hi, dtype=np.uint64)
        lo = np.frombuffer(self.lo, dtype=np.uint64)
        return np.lexsort((lo, hi))

    def duplicate(self, ranking: np.ndarray) -> tuple[int, int] | None:
        """Two document indices whose ids have the same key (the same id), if any."""
        hi = np.frombuffer(self.hi, dtype=np.uint64)[ranking]
        lo = np.frombuffer(self.lo, dtype=np.uint64)[ranking]
        same = np.flatnonzero((hi[1:] == hi[:-1]) & (lo[1:] == lo[:-1]))
        if len(same) == 0:
            return None
        a, b = sorted((int(ranking[same[0]]), int(ranking[same[0] + 1])))
        return a, b


@dataclass(frozen=True, slots=True)
class Plan:
    labels: np.ndarray
    """TRAIN, VAL or CANDIDATE per document, in input order (uint8)."""
    ranks: dict[int, int]
    """Each candidate's rank (0 = smallest key): the order `take_tokens` takes them in."""
    cut_by_chars: bool = False
    """The character bound, not the document limit, ended the candidates."""


def plan_split(keys: KeyTable, rule: SplitRule) -> Plan:
    n = len(keys)
    limit = rule.doc_limit(n)
    ranking = keys.ranking()
    taken = ranking[:limit]
    labels = np.full(n, TRAIN, dtype=np.uint8)
    if rule.val_tokens is None:
        labels[taken] = VAL
        return Plan(labels, {})
    all_chars = np.frombuffer(keys.chars, dtype=np.uint64).astype(np.int64)
    chars = all_chars[taken]
    before = np.cumsum(chars) - chars  # characters of the candidates ranked ahead of each
    kept = before < CHARS_PER_TOKEN_BOUND * rule.val_tokens
    if 2 * int(chars[kept].sum()) > int(all_chars.sum()):
        # The tokenizer never sees a candidate: half the corpus or more would starve it.
        raise DataError(
            f"--val-tokens {rule.val_tokens:,} could need half of this corpus "
            f"({int(all_chars.sum()):,} characters) for validation",
            "pass a smaller --val-tokens, or --val-docs / --val-fraction",
        )
    labels[taken[kept]] = CANDIDATE
    ranks = {int(doc): rank for rank, doc in enumerate(taken[kept])}
    return Plan(labels, ranks, cut_by_chars=not kept.all())


def take_tokens(ranks: list[int], tokens: list[int], val_tokens: int) -> set[int]:
    """Of candidates with these ranks and token counts: the positions validation takes (from the
    smallest rank, until `val_tokens` is reached)."""
    taken, total = set(), 0
    for position in sorted(range(len(ranks)), key=ranks.__getitem__):
        if total >= val_tokens:
            break
        taken.add(position)
        total += tokens[position]
    return taken
