"""Documents -> token shards + manifest, built in a temporary folder and renamed into place.

Each document is encoded as <|bos|> text <|eos|>, documents are concatenated per split and cut
into shards of at most `shard_tokens`. The ids are `Tokenizer.encode_batch`'s: `fastbpe`
computes them faster where that is exact, HF's encode_batch elsewhere (OCTLM_ENCODER=hf:
everywhere). Nothing is visible at `out` until everything is written, so a failure (bad input,
full disk, Ctrl-C) leaves no partial dataset and loses no old one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from octlm.data.corpus import DEFAULT_VAL_FRACTION, Document, read_documents, split_documents
from octlm.data.fastbpe import DocumentEncoder, use_fast_path
from octlm.data.shards import (
    MANIFEST_NAME,
    MANIFEST_VERSION,
    SPLITS,
    TOKENIZER_NAME,
    dataset_fingerprint,
    token_dtype,
    write_shard,
)
from octlm.errors import DataError
from octlm.fsutil import fsync_path
from octlm.hashing import sha256_json
from octlm.tokenizer import DEFAULT_VOCAB_SIZE, Tokenizer, check_vocab_size

DEFAULT_SHARD_TOKENS = 100_000_000
_CHUNK_CHARS = 1 << 20  # documents per encode_batch call: ~1 MB of text, so the bar moves


@dataclass(frozen=True, kw_only=True, slots=True)
class PrepareConfig:
    out: Path
    """Folder to create: shards, manifest.json and tokenizer.json."""
    inputs: tuple[str, ...] = ()
    """Text files, folders, JSONL files; empty means the embedded corpus."""
    tokenizer: Path | None = None
    """Use this tokenizer.json instead of training one on the training documents."""
    vocab_size: int = DEFAULT_VOCAB_SIZE
    """Vocabulary size when training a tokenizer."""
    val_fraction: float = DEFAULT_VAL_FRACTION
    """Share of documents held out for validation (by document, deterministic)."""
    context: int = 1024
    """Block length the data must support: each split needs at least context + 1 tokens."""
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    """Maximum tokens per shard file."""
    force: bool = False
    """Replace an existing dataset at `out` (only once the new one is complete)."""


class _ShardWriter:
    def __init__(self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.folder, self.split, self.dtype, self.limit = folder, split, dtype, shard_tokens
        self.buffer: list[np.ndarray] = []
        self.buffered = 0
        self.shards: list[dict[str, Any]] = []

    def add(self, ids: Sequence[int] | np.ndarray) -> None:
        self.buffer.append(np.asarray(ids, dtype=self.dtype))
        self.buffered += len(ids)
        while self.buffered >= self.limit:
            self._flush(self.limit)

    def close(self) -> list[dict[str, Any]]:
        if self.buffered:
            self._flush(self.buffered)
        return self.shards

    def _flush(self, count: int) -> None:
        stream = np.concatenate(self.buffer)
        name = f"{self.split}_{len(self.shards):06d}.bin"
        digest = write_shard(self.folder / name, stream[:count])
        self.shards.append({"file": name, "tokens": int(count), "sha256": digest})
        rest = stream[count:]
        self.buffer, self.buffered = ([rest] if len(rest) else []), len(rest)


def _chunks(docs: Sequence[Document]) -> Iterator[list[Document]]:
    chunk: list[Document] = []
    size = 0
    for doc in docs:
        chunk.append(doc)
        size += len(doc.text)
        if size >= _CHUNK_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _check_out(cfg: PrepareConfig) -> None:
    if cfg.out.exists() and not cfg.out.is_dir():
        raise DataError(f"--out {cfg.out} is a file", "choose a folder path")
    if cfg.out.is_dir() and any(cfg.out.iterdir()):
        if not cfg.force:
            raise DataError(
                f"{cfg.out} already exists and is not empty",
                "choose another --out, or pass --force to replace it",
            )
        if not (cfg.out / MANIFEST_NAME).is_file():  # --force replaces datasets, nothing else
            raise DataError(
                f"{cfg.out} is not empty and holds no dataset (no {MANIFEST_NAME})",
                "choose another --out; --force only replaces a folder `octlm prepare` wrote",
            )
    if cfg.shard_tokens < 1:
        raise DataError(f"shard size {cfg.shard_tokens} is not positive", "use e.g. 100000000")
    if cfg.context < 1:
        raise DataError(f"context {cfg.context} is not positive", "use e.g. 1024")


def prepare(cfg: PrepareConfig, progress: bool | None = None) -> dict[str, Any]:
    """Build the dataset at `cfg.out` and return its manifest. `progress=None`: bar on a TTY."""
    _check_out(cfg)
    fast = use_fast_path()
    if cfg.tokenizer is None:
        check_vocab_size(cfg.vocab_size)
    docs = read_documents(cfg.inputs)
    train_docs, val_docs = split_documents(docs, cfg.val_fraction)
    if cfg.tokenizer is not None:
        tokenizer = Tokenizer.load(cfg.tokenizer)
    else:
        tokenizer = Tokenizer.train((d.text for d in train_docs), cfg.vocab_size)

    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = cfg.out.parent / f".{cfg.out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        encoder = DocumentEncoder(tokenizer, fast=fast)
        manifest = _write(cfg, encoder, {"train": train_docs, "val": val_docs}, tmp, progress)
        _swap_into_place(tmp, cfg.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _write(
    cfg: PrepareConfig,
    encoder: DocumentEncoder,
    splits: dict[str, list[Document]],
    folder: Path,
    progress: bool | None,
) -> dict[str, Any]:
    tokenizer = encoder.tokenizer
    dtype = token_dtype(tokenizer.vocab_size)
    total = sum(len(docs) for docs in splits.values())
    bar = tqdm(
        total=total,
        desc="tokenizing",
        unit="doc",
        disable=None if progress is None else not progress,
    )
    with bar:
        summary = {
            split: _write_split(cfg, encoder, split, splits[split], folder, bar) for split in SPLITS
        }
    tokenizer.save(folder / TOKENIZER_NAME)
    manifest: dict[str, Any] = {
        "format": "octlm-dataset",
        "manifest_version": MANIFEST_VERSION,
        "source": list(cfg.inputs) or "embedded:shakespeare",
        "val_fraction": cfg.val_fraction,
        "tokenizer": {
            "file": TOKENIZER_NAME,
            "fingerprint": tokenizer.fingerprint,
            "vocab_size": tokenizer.vocab_size,
        },
        "dtype": dtype.name,
        "splits": summary,
        "encoder": encoder.note(),  # a note, like `source`: the fingerprint does not cover it
    }
    manifest["fingerprint"] = dataset_fingerprint(manifest)
    path = folder / MANIFEST_NAME
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    return manifest


def _write_split(
    cfg: PrepareConfig,
    encoder: DocumentEncoder,
    split: str,
    docs: list[Document],
    folder: Path,
    bar: tqdm,
) -> dict[str, Any]:
    """Encode one split's documents in order into its shards; the split's manifest entry."""
    writer = _ShardWriter(
        folder, split, token_dtype(encoder.tokenizer.vocab_size), cfg.shard_tokens
    )
    n_tokens = n_bytes = 0
    for chunk in _chunks(docs):
        for ids in encoder.encode_batch([d.text for d in chunk]):
            writer.add(ids)
            n_tokens += len(ids)
        n_bytes += sum(len(d.text.encode("utf-8")) for d in chunk)
        bar.update(len(chunk))
    if n_tokens < cfg.context + 1:
        raise DataError(
            f"the {split} split has {n_tokens} tokens; one block of context {cfg.context} "
            f"needs {cfg.context + 1}",
            f"add text, {'raise' if split == 'val' else 'lower'} --val-fraction, "
            "or lower --context",
        )
    return {
        "documents": len(docs),
        "tokens": n_tokens,
        "text_bytes": n_bytes,
        "document_ids_sha256": sha256_json([d.id for d in docs]),
        "shards": writer.close(),
    }


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished folder to `out`; an old dataset there is removed only afterwards."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        if old is not None:  # put the old dataset back
            os.replace(old, out)
        raise
    fsync_path(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def summary_lines(manifest: dict[str, Any], out: Path) -> list[str]:
    """The human summary `octlm prepare` prints."""
    tok = manifest["tokenizer"]
    lines = [f"dataset {out}  (source: {manifest['source']})"]
    for split in SPLITS:
        s = manifest["splits"][split]
        specials = 2 * s["documents"]  # BOS and EOS carry no text bytes
        bpt = s["text_bytes"] / max(1, s["tokens"] - specials)
        lines.append(
            f"  {split:5s} {s['documents']:>7,} documents {s['tokens']:>13,} tokens "
            f"{s['text_bytes']:>13,} bytes  {bpt:.3f} bytes/token"
        )
        for shard in s["shards"]:
            lines.append(f"        {out / shard['file']}  sha256 {shard['sha256'][:16]}")
    lines.append(f"  vocabulary {tok['vocab_size']:,} ({manifest['dtype']} shards)")
    if "encoder" in manifest:
        enc = manifest["encoder"]
        why = f" ({enc['hf_because']})" if "hf_because" in enc else ""
        lines.append(
            f"  encoder    {enc['piecewise']:,} documents split-and-dedupe, {enc['hf']:,} HF "
            f"encode_batch{why}; same ids either way"
        )
    lines.append(f"  tokenizer  {out / tok['file']}  fingerprint {tok['fingerprint']}")
    lines.append(f"  dataset fingerprint {manifest['fingerprint']}")
    return lines


def embedded_dataset(vocab_size: int) -> Path:
    """The embedded corpus prepared at this vocabulary size, in octlm's cache (prepared on
    first use, then reused by every run, sweep and check that names no --data)."""
    from octlm.fsutil import cache_dir

    path = cache_dir() / f"shakespeare-v{vocab_size}"
    if not (path / "manifest.json").is_file():
        print(f"preparing the embedded corpus (vocabulary {vocab_size}) in {path}", file=sys.stderr)
        prepare(PrepareConfig(out=path, vocab_size=vocab_size, context=1024, force=True))
    return path
