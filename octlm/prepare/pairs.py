"""`octlm prepare --format prompt-completion`: JSON lines of {"prompt": ..., "completion": ...}
(or Parquet/Arrow files with those two string columns) written as token shards plus a
loss-mask stream, for fine-tuning with the prompt out of the loss.

An example is [BOS] + prompt + completion + EOS, the prompt and the completion encoded apart
(so no BPE merge crosses the boundary and the mask falls on a token edge). Its loss mask marks
the first token START, the rest of the prompt CONTEXT and the completion and its closing EOS
TARGET (`octlm.data.packing`). The split is by example, from the sha256 of example ids, as
`prepare` splits documents; the windows are packed by the run, at its own context.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from octlm.config import checks
from octlm.data.chat_format import CHAT_FORMAT, CHAT_TEMPLATE_VERSION, special_pattern
from octlm.data.dataset_tokenizer import tokenizer_entry
from octlm.data.packing import CONTEXT, LOSS_MASK_VERSION, START, TARGET, waste_shares
from octlm.data.shards import (
    MASKED_MANIFEST_VERSION,
    SPLITS,
    TOKENIZER_NAME,
    ShardWriter,
    token_dtype,
)
from octlm.errors import DataError
from octlm.fsutil import fsync_path
from octlm.prepare.chat import encode_conversations, read_conversations
from octlm.prepare.folder import check_out, staged, write_manifest
from octlm.prepare.sources import Source, find_sources, json_objects
from octlm.prepare.split import VAL, KeyTable, SplitRule, plan_split
from octlm.prepare.tables import ARROW, PARQUET, Column, read_columns
from octlm.prepare.text import check_dataset_settings
from octlm.prepare.writer import IdsDigest
from octlm.tokenizer.core import Tokenizer
from octlm.tokenizer.hf_folder import open_tokenizer, tokenizer_json

FORMAT = "prompt-completion"
CHUNK_EXAMPLES = 2048
"""Examples encoded per encode_batch call: enough for the Rust side's threads."""


@dataclass(frozen=True, slots=True)
class Example:
    id: str
    prompt: str
    completion: str

    @property
    def chars(self) -> int:
        return len(self.prompt) + len(self.completion)


@dataclass(frozen=True)
class PairsConfig:
    out: Path
    inputs: tuple[str, ...]
    tokenizer: Path
    """The base model's tokenizer.json: a fine-tune keeps its base model's vocabulary."""
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    format: str = FORMAT
    """FORMAT, or CHAT_FORMAT: conversations (`octlm.prepare.chat`), assistant turns as targets."""
    messages_field: str = "messages"
    split: SplitRule = field(default_factory=lambda: SplitRule(val_tokens=None))
    context: int = 1024
    """Only reported against: how many examples a run at this context skips, and the padding."""
    shard_tokens: int = 100_000_000
    force: bool = False

    def __post_init__(self) -> None:
        check_dataset_settings(self.out, self.inputs, self.context, self.shard_tokens)
        for flag, name in (
            ("--prompt-field", self.prompt_field),
            ("--completion-field", self.completion_field),
            ("--messages-field", self.messages_field),
        ):
            checks.check(flag, name, checks.Text(), "name the JSON field", DataError)
        if self.prompt_field == self.completion_field:
            raise DataError(
                f"--prompt-field and --completion-field are both {self.prompt_field!r}",
                "name two different fields",
            )


def _records(cfg: PairsConfig, src: Source, tokenizer: Tokenizer) -> Iterator[Any]:
    """The examples (or conversations) of one file; each has `id` and `chars`."""
    if cfg.format == CHAT_FORMAT:
        yield from read_conversations(src, cfg.messages_field, special_pattern(tokenizer))
    else:
        yield from read_examples(src, cfg.prompt_field, cfg.completion_field)


def read_examples(src: Source, prompt_field: str, completion_field: str) -> Iterator[Example]:
    """The examples of one JSON-lines, Parquet or Arrow file, in file order; a bad line or row
    is a one-line error."""
    if src.kind in (PARQUET, ARROW):
        yield from _rows(src, prompt_field, completion_field)
        return
    yield from _lines(src, prompt_field, completion_field)


def _rows(src: Source, prompt_field: str, completion_field: str) -> Iterator[Example]:
    """A table's rows as examples: two string columns, the id from an `id` column if any
    (else FILE:ROW, as a JSON line's is FILE:LINE)."""
    columns = (
        Column(prompt_field, "the prompt column", "--prompt-field"),
        Column(completion_field, "the completion column", "--completion-field"),
    )
    for row, (row_id, values) in enumerate(read_columns(src.path, src.kind, columns), start=1):
        for col, value in zip(columns, values, strict=True):
            if value is None:
                raise DataError(
                    f"{src.path} row {row}: column {col.name!r} is null",
                    "give every row a prompt and a completion, or drop that row",
                )
        prompt, completion = values
        yield Example(row_id or f"{src.name}:{row}", prompt, completion)


def _lines(src: Source, prompt_field: str, completion_field: str) -> Iterator[Example]:
    example = f'{{"{prompt_field}": ..., "{completion_field}": ...}}'
    for lineno, record in json_objects(src, FORMAT, example):
        where = f"{src.path}:{lineno}"
        values = []
        for name, flag in (
            (prompt_field, "--prompt-field"),
            (completion_field, "--completion-field"),
        ):
            if name not in record:
                raise DataError(
                    f"{where} has no field {name!r}",
                    f"add it to every line, or name the field with {flag}",
                )
            value = record[name]
            if not isinstance(value, str):
                raise DataError(
                    f"{where}: field {name!r} holds a {type(value).__name__}, not a string",
                    "make it a string",
                )
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # JSON can escape half of a surrogate pair
                raise DataError(f"{where} holds a lone surrogate", "fix that line") from None
            values.append(value)
        yield Example(str(record.get("id", f"{src.name}:{lineno}")), values[0], values[1])


def encode_examples(
    tokenizer: Tokenizer, examples: Sequence[Example]
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(tokens, loss mask, tokens per example) of `examples` back to back."""
    prompts = tokenizer.encode_batch([e.prompt for e in examples], add_special_tokens=False)
    completions = tokenizer.encode_batch([e.completion for e in examples], add_special_tokens=False)
    head = tokenizer.start_ids
    ids: list[int] = []
    marks: list[int] = []
    lengths = []
    for p, c in zip(prompts, completions, strict=True):
        n_context = len(head) + len(p)
        ids += head + p + c + [tokenizer.eos_id]
        example = [CONTEXT] * n_context + [TARGET] * (len(c) + 1)
        example[0] = START  # with no BOS and no prompt, the first completion token: unpredictable
        marks += example
        lengths.append(n_context + len(c) + 1)
    return np.asarray(ids, dtype=np.int64), np.asarray(marks, dtype=np.uint8), lengths


@dataclass
class _SplitOut:
    tokens: ShardWriter
    mask: ShardWriter
    ids: IdsDigest = field(default_factory=IdsDigest)
    examples: int = 0
    targets: int = 0
    lengths: list[int] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    """Chat: assistant turns, and those merged into their header (`encode_conversations`)."""

    def add(
        self, chunk: list[Example], ids: np.ndarray, marks: np.ndarray, lengths: list[int]
    ) -> None:
        self.tokens.add(ids)
        self.mask.add(marks)
        for example in chunk:
            self.ids.add(example.id)
        self.examples += len(chunk)
        self.targets += int(np.count_nonzero(marks == TARGET))
        self.lengths += lengths

    def summary(self, context: int) -> dict[str, Any]:
        sizes = np.asarray(self.lengths, dtype=np.int64) - 1
        shares = waste_shares(sizes, context)
        return {
            "documents": self.examples,
            "tokens": self.tokens.tokens,
            "targets": self.targets,
            "document_ids_sha256": self.ids.hexdigest(),
            **self.counts,
            "shards": self.tokens.close(),
            "mask_shards": self.mask.close(),
            # Notes at prepare's --context (a run packs at its own): not in the fingerprint.
            "at_context": {
                "context": context,
                "too_long": int(np.count_nonzero(sizes > context)),
                "windows": shares["windows"],
                "padding_packed": round(shares["packed"], 6),
                "padding_one_per_window": round(shares["padded"], 6),
            },
        }


def prepare_pairs(cfg: PairsConfig) -> dict[str, Any]:
    """Build the prompt/completion dataset at `cfg.out`; its manifest."""
    check_out(cfg.out, cfg.force)
    if cfg.split.val_tokens is not None:
        raise DataError(
            f"--val-tokens does not apply to --format {cfg.format} (the split is by example count)",
            "pass --val-fraction or --val-docs",
        )
    sources = find_sources(cfg.inputs)
    if not cfg.inputs:
        raise DataError(
            f"--format {cfg.format} needs input files (the embedded corpus is plain text)",
            "pass JSON-lines files of prompt/completion pairs (or conversations, for chat)",
        )
    tokenizer = open_tokenizer(cfg.tokenizer)  # a tokenizer.json, or an HF folder's
    keys = KeyTable()
    for src in sources:  # pass 1: every id (and a full check of every line) before any writing
        for ex in _records(cfg, src, tokenizer):
            keys.add(ex.id, ex.chars)
    duplicate = keys.duplicate(keys.ranking())
    if duplicate is not None:
        raise DataError(
            f"examples {duplicate[0] + 1} and {duplicate[1] + 1} (in input order) have the same id",
            "give every line its own `id`, or drop the `id` field",
        )
    labels = plan_split(keys, cfg.split).labels
    dtype = token_dtype(tokenizer.vocab_size)
    with staged(cfg.out) as tmp:
        outs = {
            split: _SplitOut(
                ShardWriter(tmp, split, dtype, cfg.shard_tokens),
                ShardWriter(tmp, f"{split}_mask", np.dtype(np.uint8), cfg.shard_tokens),
            )
            for split in SPLITS
        }
        try:
            _encode_all(cfg, sources, tokenizer, labels, outs)
        except BaseException:
            for out in outs.values():
                out.tokens.discard()
                out.mask.discard()
            raise
        summary = {split: outs[split].summary(cfg.context) for split in SPLITS}
        for split in SPLITS:
            if summary[split]["at_context"]["windows"] == 0:
                raise DataError(
                    f"no {split} example fits in --context {cfg.context}",
                    "raise --context, add shorter examples, or change the validation share",
                )
        manifest = _write_manifest(cfg, tokenizer, summary, tmp)
    return manifest


def _encode_all(
    cfg: PairsConfig,
    sources: Sequence[Source],
    tokenizer: Tokenizer,
    labels: np.ndarray,
    outs: dict[str, _SplitOut],
) -> None:
    """Pass 2: encode in input order; each split's examples keep their input order."""
    index = 0
    chunk: list[Any] = []

    def flush() -> None:
        nonlocal index
        if cfg.format == CHAT_FORMAT:
            ids, marks, lengths, counts = encode_conversations(tokenizer, chunk)
        else:
            (ids, marks, lengths), counts = encode_examples(tokenizer, chunk), {}
        cuts = np.cumsum([0, *lengths])
        is_val = labels[index : index + len(chunk)] == VAL
        for split in SPLITS:
            picked = np.flatnonzero(is_val == (split == "val")).tolist()
            if not picked:
                continue
            spans = np.concatenate([np.arange(cuts[i], cuts[i + 1]) for i in picked])
            outs[split].add(
                [chunk[i] for i in picked], ids[spans], marks[spans], [lengths[i] for i in picked]
            )
            for name, per_example in counts.items():
                outs[split].counts[name] = outs[split].counts.get(name, 0) + sum(
                    per_example[i] for i in picked
                )
        index += len(chunk)
        chunk.clear()

    for src in sources:
        for example in _records(cfg, src, tokenizer):
            chunk.append(example)
            if len(chunk) == CHUNK_EXAMPLES:
                flush()
    if chunk:
        flush()


def _write_manifest(
    cfg: PairsConfig, tokenizer: Tokenizer, summary: dict[str, Any], folder: Path
) -> dict[str, Any]:
    # The given tokenizer's own bytes: its fingerprint is their sha256, as the base run's.
    (folder / TOKENIZER_NAME).write_bytes(tokenizer_json(cfg.tokenizer).read_bytes())
    fsync_path(folder / TOKENIZER_NAME)
    manifest: dict[str, Any] = {
        "format": "octlm-dataset",
        "manifest_version": MASKED_MANIFEST_VERSION,
        "source": list(cfg.inputs),
        "val_fraction": cfg.split.val_fraction,
        "tokenizer": tokenizer_entry(tokenizer),
        "dtype": token_dtype(tokenizer.vocab_size).name,
        "splits": summary,
        "loss_mask": {
            "version": LOSS_MASK_VERSION,
            "format": cfg.format,
            "values": {str(START): "example start", str(CONTEXT): "prompt", str(TARGET): "target"},
        },
        "read": {"prompt_field": cfg.prompt_field, "completion_field": cfg.completion_field},
        "split_rule": cfg.split.to_dict(),
    }
    if cfg.format == CHAT_FORMAT:  # what `octlm chat` and `octlm export` frame turns with
        manifest["read"] = {"messages_field": cfg.messages_field}
        manifest["chat_template"] = {"version": CHAT_TEMPLATE_VERSION}
    return write_manifest(folder, manifest)


def summary_lines(manifest: dict[str, Any], out: Path) -> list[str]:
    """The human summary `octlm prepare --format prompt-completion` (or chat) prints."""
    chat = "chat_template" in manifest
    kind, items = ("chat", "conversations") if chat else ("prompt/completion", "examples")
    lines = [f"dataset {out}  ({kind}, source: {manifest['source']})"]
    for split in SPLITS:
        s = manifest["splits"][split]
        at = s["at_context"]
        lines.append(
            f"  {split:5s} {s['documents']:>7,} {items} {s['tokens']:>11,} tokens, "
            f"{s['targets']:,} of them targets ({s['targets'] / max(1, s['tokens']):.1%})"
        )
        if chat:
            lines.append(
                f"        {s['assistant_turns']:,} assistant turns, {s['merged_headers']:,} of "
                "them starting inside the header's last token"
            )
        lines.append(
            f"        at context {at['context']}: {at['windows']:,} packed windows, padding "
            f"{at['padding_packed']:.1%} (one example per window: "
            f"{at['padding_one_per_window']:.1%}); {at['too_long']:,} examples too long, skipped"
        )
    tok = manifest["tokenizer"]
    lines.append(f"  tokenizer  {out / tok['file']}  fingerprint {tok['fingerprint']}")
    lines.append(f"  dataset fingerprint {manifest['fingerprint']}")
    return lines
