"""Work for `prepare` spread over processes, results handed back in submission order.

Only the encoding runs in the workers; the reading, the split and every write stay in the main
process, in input order, so the shards are the same bytes for any number of workers. Workers
ignore Ctrl-C (the main process decides, and cleans up); a worker that dies (killed, out of
memory) is a one-line error, not a hang.
"""

from __future__ import annotations

import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any, TypeVar

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from octlm.data.fastbpe import DocumentEncoder
from octlm.errors import DataError
from octlm.tokenizer import Tokenizer

M = TypeVar("M")
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

    def note(self) -> dict[str, Any]:
        why = self.local.hf_because
        return {**self.counts, **({"hf_because": why} if why else {})}

    def initargs(self) -> tuple[Any, ...]:
        return (self.tokenizer.hf.to_str(), self.tokenizer.fingerprint, self.fast, self.dtype.str)

    def add_counts(self, counts: dict[str, int]) -> None:
        for key, value in counts.items():
            self.counts[key] += value

    def encode_here(
        self, texts: list[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
        return _encode_with(self.local, texts, self.dtype)


def init_worker(tokenizer_json: str, fingerprint: str, fast: bool, dtype: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    tokenizer = Tokenizer(HFTokenizer.from_str(tokenizer_json), fingerprint)
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


def ordered_map(
    fn: Callable[[Any], Any],
    items: Iterable[tuple[M, Any]],
    *,
    workers: int,
    initializer: Callable[..., None] | None = None,
    initargs: tuple[Any, ...] = (),
    local: Callable[[Any], Any] | None = None,
) -> Iterator[tuple[M, Any]]:
    """(meta, fn(payload)) for each (meta, payload) of `items`, in order. One worker: `local`
    (or `fn`) runs here, with no pool. More: a pool, with at most 2 x workers items in flight, so
    memory stays bounded whatever the input size."""
    if workers <= 1:
        run = local or fn
        for meta, payload in items:
            yield meta, run(payload)
        return
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=get_context("spawn"),  # no fork of a process that may hold threads
        initializer=initializer,
        initargs=initargs,
    )
    pending: deque[tuple[M, Future[Any]]] = deque()
    try:
        for meta, payload in items:
            pending.append((meta, pool.submit(fn, payload)))
            if len(pending) >= 2 * workers:
                meta_done, future = pending.popleft()
                yield meta_done, _result(future)
        while pending:
            meta_done, future = pending.popleft()
            yield meta_done, _result(future)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _result(future: Future[Any]) -> Any:
    try:
        return future.result()
    except BrokenProcessPool:
        raise DataError(
            "a worker process of `octlm prepare` died (killed, or out of memory)",
            "run it again; with little memory, pass fewer --workers",
        ) from None
