"""The encoding `prepare` spreads over worker processes (`pool.py` runs them).

Only the encoding runs in the workers; the reading, the split and every write stay in the main
process, in input order, so the shards are the same bytes for any number of workers.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tokenizers

from octlm.errors import DataError
from octlm.tokenizer.core import Specials, Tokenizer
from octlm.tokenizer.fastbpe import DocumentEncoder

_STATE: dict[str, Any] = {}


def default_workers() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_workers(workers: int) -> None:
    if workers < 1:
        raise DataError(f"--workers {workers} is not positive", "pass --workers 1 or more")


class ChunkEncoder:
    """Encodes lists of texts to (tokens, lengths, text bytes, counts): one flat array of `dtype`,
    each text's token count and UTF-8 size (computed here, off the main process). The
    encoder's counts (fast path vs HF) are summed over every process."""

    def __init__(self, tokenizer: Tokenizer, *, fast: bool, dtype: np.dtype) -> None:
        self.tokenizer, self.fast, self.dtype = tokenizer, fast, dtype
        self.local = DocumentEncoder(tokenizer, fast=fast)
        self.counts = {"piecewise": 0, "hf": 0}
        self.worker_peak_mb = 0.0

    def note(self) -> dict[str, Any]:
        why = self.local.hf_because
        return {**self.counts, **({"hf_because": why} if why else {})}

    def initargs(self) -> tuple[Any, ...]:
        tok = self.tokenizer  # its specials too: a Hugging Face tokenizer's are not in its JSON
        return (tok.hf.to_str(), tok.fingerprint, tok.specials.to_dict(), self.fast, self.dtype.str)

    def worker_peaks(self, peaks: list[float]) -> None:
        self.worker_peak_mb = max([self.worker_peak_mb, *peaks])

    def add_counts(self, counts: dict[str, int]) -> None:
        for key, value in counts.items():
            self.counts[key] += value

    def encode_here(
        self, texts: list[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
        return _encode_with(self.local, texts, self.dtype)


def init_worker(
    tokenizer_json: str, fingerprint: str, specials: dict[str, Any], fast: bool, dtype: str
) -> None:
    hf = tokenizers.Tokenizer.from_str(tokenizer_json)
    tokenizer = Tokenizer(hf, fingerprint, Specials.from_dict(specials))
    _STATE["encoder"] = DocumentEncoder(tokenizer, fast=fast)
    _STATE["dtype"] = np.dtype(dtype)


def encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    return _encode_with(_STATE["encoder"], texts, _STATE["dtype"])


def _encode_with(
    encoder: DocumentEncoder, texts: list[str], dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    before = dict(encoder.counts)
    ids = encoder.encode_batch(texts)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    text_bytes = np.fromiter((len(t.encode("utf-8")) for t in texts), np.int64, len(texts))
    flat = np.concatenate(ids).astype(dtype) if ids else np.empty(0, dtype)
    return flat, lengths, text_bytes, {k: encoder.counts[k] - before[k] for k in before}
