"""Corpus files -> token shards + manifest, streamed, built in a temporary folder and renamed
into place.

Three passes, each reading the corpus in input order: a scan of every document's id (the
split needs the whole corpus), a tokenizer trained on a capped sample of the training documents
(skipped with --tokenizer), and the encoding, spread over worker processes and written in input
order (`writer.py`). Each document is `<|bos|> text <|eos|>` (a Hugging Face tokenizer's own
BOS and EOS, and no BOS where it has none); each split is one stream cut into
shards of at most `shard_tokens`. Memory holds per-document keys (24 bytes each) and a bounded
number of chunks, never the corpus. Nothing is visible at `out` until everything is written, so a
failure (bad input, full disk, Ctrl-C, a worker killed) leaves no partial dataset and loses no
old one.
"""

from __future__ import annotations

import resource
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm  # a widget in Jupyter, the terminal bar elsewhere

from octlm.config import checks
from octlm.data.dataset_tokenizer import tokenizer_entry
from octlm.data.shards import (
    MANIFEST_VERSION,
    SPLITS,
    TOKENIZER_NAME,
    ShardWriter,
    token_dtype,
)
from octlm.errors import DataError
from octlm.fsutil import fsync_path
from octlm.prepare.folder import check_out, staged, write_manifest
from octlm.prepare.pool import peak_rss_mb
from octlm.prepare.scan import Scan, documents, find_ids, scan_corpus
from octlm.prepare.sources import ReadOptions, Source, find_sources
from octlm.prepare.split import TRAIN, Plan, SplitRule, plan_split
from octlm.prepare.workers import ChunkEncoder, check_workers, default_workers
from octlm.prepare.writer import SPOOL_NAME, SplitOut, Spool, write_splits
from octlm.tokenizer.core import DEFAULT_VOCAB_SIZE, Tokenizer, capped_sample, check_vocab_size
from octlm.tokenizer.fastbpe import use_fast_path
from octlm.tokenizer.hf_folder import open_tokenizer, tokenizer_json

DEFAULT_SHARD_TOKENS = 100_000_000
DEFAULT_TOKENIZER_MAX_CHARS = 2_000_000_000
"""The tokenizer's sample: enough for a 32k-65k vocabulary's merges to settle, and an HF
training of minutes, not hours, however big the corpus."""
DEFAULT_TOKENIZER_DOC_CAP = 1_000_000
"""Characters taken from any one document: a whole book or a log dump cannot fill the sample,
while every ordinary document (the embedded corpus' longest work is 180k) stays whole."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PrepareConfig:
    out: Path
    """Folder to create: shards, manifest.json and tokenizer.json."""
    inputs: tuple[str, ...] = ()
    """Files and folders (text, JSONL, Parquet, Arrow, compressed); empty: the embedded corpus."""
    read: ReadOptions = field(default_factory=ReadOptions)
    """How files become documents: --text-field, --split-on."""
    split: SplitRule = field(default_factory=SplitRule)
    """How many documents validation holds out (by document, deterministic)."""
    tokenizer: Path | None = None
    """Use this tokenizer.json (or a Hugging Face folder holding one, its BOS/EOS/PAD from the
    folder's config files: `octlm.tokenizer.hf_folder`) instead of training one."""
    vocab_size: int = DEFAULT_VOCAB_SIZE
    """Vocabulary size when training a tokenizer."""
    tokenizer_max_chars: int = DEFAULT_TOKENIZER_MAX_CHARS
    """Characters of training text the tokenizer trains on (the first ones, in input order)."""
    tokenizer_doc_cap: int = DEFAULT_TOKENIZER_DOC_CAP
    """Characters taken from any one document for the tokenizer's sample."""
    context: int = 1024
    """Block length the data must support: each split needs at least context + 1 tokens."""
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    """Maximum tokens per shard file."""
    workers: int | None = None
    """Encoding processes; None: one per core. The shards are the same bytes for any number."""
    force: bool = False
    """Replace an existing dataset at `out` (only once the new one is complete)."""

    def __post_init__(self) -> None:
        check_dataset_settings(self.out, self.inputs, self.context, self.shard_tokens)
        check_read_options(self.read)
        if self.tokenizer is None:
            if not checks.is_int(self.vocab_size):  # the type here, the range just below
                check_count("--vocab-size", self.vocab_size)
            check_vocab_size(self.vocab_size)
        check_count("--tokenizer-max-chars", self.tokenizer_max_chars)
        check_count("--tokenizer-doc-cap", self.tokenizer_doc_cap)
        if self.workers is not None:
            checks.check_processes("--workers", self.workers, DataError)


MAX_CONTEXT = 2**20
"""The longest block a dataset is checked against: a thousand times the largest preset's context
(a run's context is at most its preset's); the packing report's tables grow with it."""


def check_count(flag: str, value: object, most: int = checks.MAX_INT) -> None:
    """A count of tokens, characters or documents: a whole number from 1 to `most`."""
    checks.check(flag, value, checks.Int(1, most), f"pass {flag} within that range", DataError)


def check_dataset_settings(out: Path, inputs: Sequence[str], context: int, shards: int) -> None:
    """What `prepare` and `prepare_pairs` share: a dataset folder to write (not the current
    one), input paths, and the sizes (--context, --shard-tokens)."""
    if str(out) in ("", "."):
        raise DataError("--out is the current folder", "name a new folder for the dataset")
    for name in inputs:
        checks.check_path("input", name, DataError)
    check_count("--context", context, MAX_CONTEXT)
    check_count("--shard-tokens", shards)


def check_read_options(read: ReadOptions) -> None:
    checks.check("--text-field", read.text_field, checks.Text(), "name the field", DataError)
    if read.split_on is not None:
        fix = "pass the separator, e.g. '<|endoftext|>', or drop --split-on"
        checks.check("--split-on", read.split_on, checks.Separator(), fix, DataError)


@dataclass
class PrepareStats:
    """What a prepare measured (not in the manifest: it changes from run to run)."""

    workers: int = 1
    input_bytes: int = 0
    empty_documents: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    peak_worker_rss_mb: float = 0.0
    val_short: bool = False
    """Validation ended below --val-tokens: its candidates ran out (see split.py)."""


def prepare(cfg: PrepareConfig, progress: bool | None = None) -> dict[str, Any]:
    """Build the dataset at `cfg.out` and return its manifest. `progress=None`: bars on a TTY."""
    return prepare_with_stats(cfg, progress)[0]


def prepare_with_stats(
    cfg: PrepareConfig, progress: bool | None = None
) -> tuple[dict[str, Any], PrepareStats]:
    check_out(cfg.out, cfg.force)  # the sizes: PrepareConfig checked them
    workers = default_workers() if cfg.workers is None else cfg.workers
    check_workers(workers)
    fast = use_fast_path()
    stats = PrepareStats(workers=workers)
    sources = find_sources(cfg.inputs)
    stats.input_bytes = sum(s.size for s in sources)
    clock = time.perf_counter()
    with _bar(stats.input_bytes, "scanning", progress) as bar:
        scan = scan_corpus(sources, cfg.read, workers=workers, on_bytes=bar.update)
    stats.empty_documents = scan.empty
    plan = _plan(sources, cfg, scan)
    stats.seconds["scan"] = time.perf_counter() - clock
    clock = time.perf_counter()
    if cfg.tokenizer is not None:
        tokenizer = open_tokenizer(cfg.tokenizer)
    else:
        tokenizer = _train_tokenizer(cfg, sources, plan, scan, progress)
    stats.seconds["tokenizer"] = time.perf_counter() - clock

    clock = time.perf_counter()
    with staged(cfg.out) as tmp:
        encoder = ChunkEncoder(tokenizer, fast=fast, dtype=token_dtype(tokenizer.vocab_size))
        summary, stats.val_short = _encode(cfg, sources, plan, encoder, workers, tmp, progress)
        manifest = _write_manifest(cfg, tokenizer, encoder, summary, tmp)
    stats.seconds["encode"] = time.perf_counter() - clock
    # VmHWM, not ru_maxrss: that includes the memory of whatever process started this one.
    stats.peak_rss_mb = peak_rss_mb() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stats.peak_worker_rss_mb = encoder.worker_peak_mb
    return manifest, stats


def _bar(total: int, desc: str, progress: bool | None, unit: str = "B") -> tqdm:
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=True,
        unit_divisor=1000,
        disable=None if progress is None else not progress,
    )


def _plan(sources: Sequence[Source], cfg: PrepareConfig, scan: Scan) -> Plan:
    keys = scan.keys
    duplicate = keys.duplicate(keys.ranking())
    if duplicate is not None:
        ids = find_ids(sources, cfg.read, set(duplicate))
        raise DataError(
            f"two documents share the id {ids[duplicate[0]]!r}",
            "give each JSONL line a unique id, and each input file a unique name",
        )
    return plan_split(keys, cfg.split)


def _sample(cfg: PrepareConfig, sources: Sequence[Source], plan: Plan, bar: tqdm) -> Iterator[str]:
    """The training documents in input order, through `capped_sample`."""
    train = (
        doc.text
        for index, doc in enumerate(documents(sources, cfg.read))
        if plan.labels[index] == TRAIN
    )
    for text in capped_sample(train, cfg.tokenizer_max_chars, cfg.tokenizer_doc_cap):
        bar.update(len(text))
        yield text


def _train_tokenizer(
    cfg: PrepareConfig, sources: Sequence[Source], plan: Plan, scan: Scan, progress: bool | None
) -> Tokenizer:
    chars = np.frombuffer(scan.keys.chars, dtype=np.uint64)[plan.labels == TRAIN]
    budget = int(np.minimum(chars, cfg.tokenizer_doc_cap).sum())
    total = min(budget, cfg.tokenizer_max_chars)
    with _bar(total, "tokenizer sample", progress, unit="char") as bar:
        return Tokenizer.train(_sample(cfg, sources, plan, bar), cfg.vocab_size)


def _encode(
    cfg: PrepareConfig,
    sources: Sequence[Source],
    plan: Plan,
    encoder: ChunkEncoder,
    workers: int,
    folder: Path,
    progress: bool | None,
) -> tuple[dict[str, dict[str, Any]], bool]:
    dtype = encoder.dtype
    outs = {
        split: SplitOut(ShardWriter(folder, split, dtype, cfg.shard_tokens)) for split in SPLITS
    }
    spool = Spool(folder / SPOOL_NAME, dtype)
    total = sum(s.size for s in sources)
    try:
        with _bar(total, f"encoding ({workers} workers)", progress) as bar:
            short = write_splits(
                documents(sources, cfg.read, bar.update),
                plan,
                val_tokens=cfg.split.val_tokens,
                encoder=encoder,
                workers=workers,
                outs=outs,
                spool=spool,
            )
    except BaseException:
        for out in outs.values():
            out.writer.discard()
        raise
    for split in SPLITS:
        n_tokens = outs[split].writer.tokens
        if n_tokens < cfg.context + 1:
            raise DataError(
                f"the {split} split has {n_tokens} tokens; one block of context {cfg.context} "
                f"needs {cfg.context + 1}",
                f"add text, {'raise' if split == 'val' else 'lower'} the validation share "
                "(--val-fraction, --val-docs, --val-tokens), or lower --context",
            )
    return {split: outs[split].summary() for split in SPLITS}, short


def _write_manifest(
    cfg: PrepareConfig,
    tokenizer: Tokenizer,
    encoder: ChunkEncoder,
    summary: dict[str, dict[str, Any]],
    folder: Path,
) -> dict[str, Any]:
    if cfg.tokenizer is not None:  # its own bytes: the fingerprint is their sha256
        shutil.copyfile(tokenizer_json(cfg.tokenizer), folder / TOKENIZER_NAME)
        fsync_path(folder / TOKENIZER_NAME)
    else:
        tokenizer.save(folder / TOKENIZER_NAME)
    manifest: dict[str, Any] = {
        "format": "octlm-dataset",
        "manifest_version": MANIFEST_VERSION,
        "source": list(cfg.inputs) or "embedded:shakespeare",
        "val_fraction": cfg.split.val_fraction,
        "tokenizer": tokenizer_entry(tokenizer),
        "dtype": token_dtype(tokenizer.vocab_size).name,
        "splits": summary,
        "encoder": encoder.note(),  # a note, like `source`: the fingerprint does not cover it
        # Notes too: how the documents were read and split (the shards' hashes say the rest).
        "read": {"text_field": cfg.read.text_field, "split_on": cfg.read.split_on},
        "split_rule": cfg.split.to_dict(),
    }
    if cfg.tokenizer is None:
        manifest["tokenizer_sample"] = {
            "max_chars": cfg.tokenizer_max_chars,
            "doc_cap": cfg.tokenizer_doc_cap,
        }
    return write_manifest(folder, manifest)


def summary_lines(
    manifest: dict[str, Any], out: Path, stats: PrepareStats | None = None
) -> list[str]:
    """The human summary `octlm prepare` prints."""
    tok = manifest["tokenizer"]
    lines = [f"dataset {out}  (source: {manifest['source']})"]
    for split in SPLITS:
        s = manifest["splits"][split]
        framing = 1 if tok.get("specials", {"bos": 0})["bos"] is None else 2
        specials = framing * s["documents"]  # BOS and EOS carry no text bytes
        bpt = s["text_bytes"] / max(1, s["tokens"] - specials)
        lines.append(
            f"  {split:5s} {s['documents']:>7,} documents {s['tokens']:>13,} tokens "
            f"{s['text_bytes']:>13,} bytes  {bpt:.3f} bytes/token"
        )
        for shard in s["shards"][:3]:
            lines.append(f"        {out / shard['file']}  sha256 {shard['sha256'][:16]}")
        if len(s["shards"]) > 3:
            lines.append(f"        ... {len(s['shards'])} shards in all")
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
    if stats is not None:
        lines += _stats_lines(stats)
    return lines


def _stats_lines(stats: PrepareStats) -> list[str]:
    seconds = sum(stats.seconds.values())
    rate = stats.input_bytes / 1e6 / max(seconds, 1e-9)
    parts = ", ".join(f"{name} {t:.1f} s" for name, t in stats.seconds.items())
    short = (
        [
            "  warning    validation ran out of candidates before --val-tokens (text of more "
            "than 8 characters a token): it holds fewer tokens"
        ]
        if stats.val_short
        else []
    )
    return short + [
        f"  read       {stats.input_bytes / 1e6:,.1f} MB in {seconds:.1f} s ({rate:,.1f} MB/s; "
        f"{parts}); {stats.empty_documents:,} blank documents skipped",
        f"  workers    {stats.workers}; peak RSS {stats.peak_rss_mb:,.0f} MB (main), "
        + (
            f"{stats.peak_worker_rss_mb:,.0f} MB (largest worker)"
            if stats.workers > 1
            else "no worker processes"
        ),
    ]


def embedded_dataset(vocab_size: int) -> Path:
    """The embedded corpus prepared at this vocabulary size, in octlm's cache (prepared on
    first use, then reused by every run, sweep and check that names no --data)."""
    from octlm.fsutil import cache_dir

    path = cache_dir() / f"shakespeare-v{vocab_size}"
    if not (path / "manifest.json").is_file():
        print(f"preparing the embedded corpus (vocabulary {vocab_size}) in {path}", file=sys.stderr)
        prepare(PrepareConfig(out=path, vocab_size=vocab_size, context=1024, force=True))
    return path
