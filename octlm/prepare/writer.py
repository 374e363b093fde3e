"""The last pass of `prepare`: documents encoded (in worker processes) and written to their
split's shards, in input order.

Documents go to the workers in chunks of about 1 MB of text and come back in the order they
were sent, so each split's stream is the same bytes for any number of workers. A split under a
token limit cannot be settled before its candidates are encoded: they wait in a spool file (on
disk, not in memory) until the end, then validation takes its share of them in rank order and
the rest go to training, each in input order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from octlm.data.shards import ShardWriter
from octlm.prepare.pool import ordered_map
from octlm.prepare.sources import Document
from octlm.prepare.split import CANDIDATE, VAL, Plan, take_tokens
from octlm.prepare.workers import ChunkEncoder, encode_in_worker, init_worker

CHUNK_CHARS = 1 << 20
"""Text per task sent to a worker: big enough to amortise the hand-over, small enough to keep
memory flat and the progress bar moving."""
SPOOL_NAME = ".candidates.tmp"


class IdsDigest:
    """sha256 of the canonical JSON of a list of ids (`hashing.sha256_json(ids)`), fed one id
    at a time so the list is never held."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256(b"[")
        self._first = True

    def add(self, doc_id: str) -> None:
        self._hash.update((("" if self._first else ",") + json.dumps(doc_id)).encode("ascii"))
        self._first = False

    def hexdigest(self) -> str:
        final = self._hash.copy()
        final.update(b"]")
        return final.hexdigest()


@dataclass
class SplitOut:
    writer: ShardWriter
    ids: IdsDigest = field(default_factory=IdsDigest)
    documents: int = 0
    text_bytes: int = 0

    def add(self, doc_ids: list[str], text_bytes: int, tokens: np.ndarray) -> None:
        """Documents that follow one another in the split: their ids, bytes and tokens."""
        self.writer.add(tokens)
        for doc_id in doc_ids:
            self.ids.add(doc_id)
        self.documents += len(doc_ids)
        self.text_bytes += text_bytes

    def summary(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "tokens": self.writer.tokens,
            "text_bytes": self.text_bytes,
            "document_ids_sha256": self.ids.hexdigest(),
            "shards": self.writer.close(),
        }


class Spool:
    """Candidates' tokens in a file, with what is needed to place them later."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype = path, dtype
        self.entries: list[tuple[str, int, int]] = []  # id, text bytes, length
        self.ranks: list[int] = []
        self._file: Any = None

    def add(self, rank: int, doc_id: str, text_bytes: int, tokens: np.ndarray) -> None:
        if self._file is None:
            self._file = open(self.path, "wb")  # noqa: SIM115 (closed in read_back)
        self._file.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self.entries.append((doc_id, text_bytes, len(tokens)))
        self.ranks.append(rank)

    def read_back(self) -> Iterator[tuple[int, str, int, np.ndarray]]:
        """(position, id, text bytes, tokens) of each candidate, in input order."""
        if self._file is None:
            return
        self._file.close()
        # Plain reads, in the order written: a memmap's pages would count in the resident set.
        with open(self.path, "rb") as f:
            for position, (doc_id, text_bytes, length) in enumerate(self.entries):
                yield position, doc_id, text_bytes, np.fromfile(f, self.dtype, count=length)
        self.path.unlink()


def write_splits(
    docs: Iterable[Document],
    plan: Plan,
    *,
    val_tokens: int | None,
    encoder: ChunkEncoder,
    workers: int,
    outs: dict[str, SplitOut],
    spool: Spool,
) -> bool:
    """Encode `docs` (the corpus in input order, as scanned) into `outs`; candidates of a token
    limit go through `spool` and are placed at the end. True when validation ran out of
    candidates before its token limit (the text beat the characters-per-token bound)."""
    results = ordered_map(
        encode_in_worker,
        _chunks(docs, plan),
        workers=workers,
        initializer=init_worker,
        initargs=encoder.initargs(),
        local=encoder.encode_here,
        on_exit=encoder.worker_peaks,
    )
    for meta, (flat, lengths, text_bytes, counts) in results:
        encoder.add_counts(counts)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        i = 0
        while i < len(meta):
            label, rank, doc_id = meta[i]
            if label == CANDIDATE:
                spool.add(rank, doc_id, int(text_bytes[i]), flat[starts[i] : ends[i]])
                i += 1
                continue
            j = i + 1  # a run of documents bound for the same split: one write
            while j < len(meta) and meta[j][0] == label:
                j += 1
            ids = [m[2] for m in meta[i:j]]
            run_bytes = int(text_bytes[i:j].sum())
            outs["val" if label == VAL else "train"].add(
                ids, run_bytes, flat[starts[i] : ends[j - 1]]
            )
            i = j
    if not spool.entries:
        return False
    lengths_of = [length for _, _, length in spool.entries]
    chosen = take_tokens(spool.ranks, lengths_of, val_tokens or 0)
    short = plan.cut_by_chars and sum(lengths_of[i] for i in chosen) < (val_tokens or 0)
    for position, doc_id, text_bytes, tokens in spool.read_back():
        # A candidate validation does not take goes after the rest of training (input order).
        outs["val" if position in chosen else "train"].add([doc_id], text_bytes, tokens)
    return short


def _chunks(
    docs: Iterable[Document], plan: Plan
) -> Iterator[tuple[list[tuple[int, int, str]], list[str]]]:
    """(meta, texts) of about CHUNK_CHARS characters each: meta is (label, rank, id)."""
    meta: list[tuple[int, int, str]] = []
    texts: list[str] = []
    size = 0
    for index, doc in enumerate(docs):
        label = int(plan.labels[index])
        rank = plan.ranks.get(index, -1) if label == CANDIDATE else -1
        meta.append((label, rank, doc.id))
        texts.append(doc.text)
        size += len(doc.text)
        if size >= CHUNK_CHARS:
            yield meta, texts
            meta, texts, size = [], [], 0
    if texts:
        yield meta, texts
