"""`octlm tokenizer train` and `octlm prepare`: the data commands of the CLI (`cli/main.py`
adds them and catches their errors)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from octlm.config import checks
from octlm.data.chat_format import CHAT_FORMAT
from octlm.errors import DataError, OctlmError
from octlm.prepare.pairs import FORMAT, PairsConfig, prepare_pairs
from octlm.prepare.pairs import summary_lines as pairs_summary_lines
from octlm.prepare.scan import documents
from octlm.prepare.sources import ReadOptions, find_sources
from octlm.prepare.split import DEFAULT_VAL_FRACTION, DEFAULT_VAL_TOKENS, SplitRule
from octlm.prepare.text import (
    DEFAULT_SHARD_TOKENS,
    DEFAULT_TOKENIZER_DOC_CAP,
    DEFAULT_TOKENIZER_MAX_CHARS,
    PrepareConfig,
    check_count,
    check_read_options,
    prepare_with_stats,
    summary_lines,
)
from octlm.tokenizer.core import DEFAULT_VOCAB_SIZE, Tokenizer, capped_sample, check_vocab_size

_MAX_CHARS = f"{DEFAULT_TOKENIZER_MAX_CHARS:.0e}".replace("e+0", "e")


def count(text: str) -> int:
    """An argparse type for counts that also takes 2e9 or 10_000_000."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def _read_options(args: argparse.Namespace) -> ReadOptions:
    return ReadOptions(text_field=args.text_field, split_on=args.split_on)


def _capped(args: argparse.Namespace, counts: dict[str, int]) -> Iterator[str]:
    """Texts of every document, through `tokenizer.capped_sample` (--max-chars, --doc-cap)."""
    texts = (d.text for d in documents(find_sources(args.inputs), _read_options(args)))
    for text in capped_sample(texts, args.max_chars, args.doc_cap):
        counts["documents"] += 1
        counts["chars"] += len(text)
        yield text


def _check_paths(args: argparse.Namespace) -> None:
    """The paths as typed: an empty one would name the current folder."""
    for name in args.inputs:
        checks.check_path("input", name, DataError)
    checks.check_path("--out", args.out, DataError)
    if getattr(args, "tokenizer", None) is not None:
        checks.check_path("--tokenizer", args.tokenizer, DataError)


def _cmd_tokenizer_train(args: argparse.Namespace) -> int:
    _check_paths(args)
    out = Path(args.out)
    if out.is_dir():
        raise OctlmError(f"--out {out} is a folder", "name the tokenizer.json file to write")
    if out.exists() and not args.force:
        raise OctlmError(f"{out} already exists", "choose another --out, or pass --force")
    check_vocab_size(args.vocab_size)
    check_count("--max-chars", args.max_chars)
    check_count("--doc-cap", args.doc_cap)
    check_read_options(_read_options(args))
    counts = {"documents": 0, "chars": 0}
    tokenizer = Tokenizer.train(_capped(args, counts), args.vocab_size)
    if not counts["documents"]:
        raise OctlmError("the corpus is empty: no document holds any text", "add text")
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(out)
    print(
        f"trained on {counts['documents']:,} documents ({counts['chars']:,} characters): "
        f"vocabulary {tokenizer.vocab_size:,}"
    )
    print(f"wrote {out}  fingerprint {tokenizer.fingerprint}")
    return 0


def _split_rule(args: argparse.Namespace) -> SplitRule:
    given = (args.val_fraction, args.val_docs, args.val_tokens)
    if all(v is None for v in given):
        return SplitRule()  # the default: 10% of the documents, at most ~10M tokens
    return SplitRule(val_fraction=given[0], val_docs=given[1], val_tokens=given[2])


def _cmd_prepare_pairs(args: argparse.Namespace) -> int:
    fix = f"drop it: --format {args.format} reads JSON fields and keeps its tokenizer's vocabulary"
    ignored = (("--split-on", args.split_on), ("--vocab-size", args.vocab_size))
    for flag, value in (*ignored, ("--workers", args.workers)):
        if value is not None:
            raise OctlmError(f"{flag} has no effect with --format {args.format}", fix)
    chat = args.format == CHAT_FORMAT
    fields = ("--prompt-field", "--completion-field") if chat else ("--messages-field",)
    if args.text_field != "text" or _fields_given(args, fields):
        flag = "--text-field" if args.text_field != "text" else " and ".join(fields)
        raise OctlmError(
            f"{flag} {'have' if ' and ' in flag else 'has'} no effect with --format {args.format}",
            "name the field with --messages-field"
            if chat
            else "name the fields with --prompt-field and --completion-field",
        )
    if not args.tokenizer:
        raise OctlmError(
            f"--format {args.format} needs --tokenizer: a fine-tune keeps its base model's "
            "vocabulary",
            "pass the base run's tokenizer, e.g. --tokenizer data/base/tokenizer.json",
        )
    split = (
        SplitRule(val_tokens=None)
        if all(v is None for v in (args.val_fraction, args.val_docs, args.val_tokens))
        else _split_rule(args)
    )
    cfg = PairsConfig(
        out=Path(args.out),
        inputs=tuple(args.inputs),
        tokenizer=Path(args.tokenizer),
        prompt_field=args.prompt_field,
        completion_field=args.completion_field,
        format=args.format,
        messages_field=args.messages_field,
        split=split,
        context=args.context,
        shard_tokens=args.shard_tokens,
        force=args.force,
    )
    manifest = prepare_pairs(cfg)
    print("\n".join(pairs_summary_lines(manifest, cfg.out)))
    return 0


def _fields_given(args: argparse.Namespace, flags: tuple[str, ...]) -> bool:
    """Whether any of the field flags is set to other than its default."""
    defaults = {"--prompt-field": "prompt", "--completion-field": "completion"}
    defaults["--messages-field"] = "messages"
    return any(getattr(args, f[2:].replace("-", "_")) != defaults[f] for f in flags)


def _cmd_prepare(args: argparse.Namespace) -> int:
    _check_paths(args)
    if args.format in (FORMAT, CHAT_FORMAT):
        return _cmd_prepare_pairs(args)
    if _fields_given(args, ("--prompt-field", "--completion-field", "--messages-field")):
        raise OctlmError(
            "--prompt-field/--completion-field need --format prompt-completion "
            "(--messages-field: --format chat)",
            "add the --format, or drop them",
        )
    if args.tokenizer and args.vocab_size is not None:
        raise OctlmError(
            "--vocab-size has no effect with --tokenizer (its vocabulary is fixed)",
            "drop one of the two",
        )
    cfg = PrepareConfig(
        out=Path(args.out),
        inputs=tuple(args.inputs),
        read=_read_options(args),
        split=_split_rule(args),
        tokenizer=Path(args.tokenizer) if args.tokenizer is not None else None,
        vocab_size=DEFAULT_VOCAB_SIZE if args.vocab_size is None else args.vocab_size,
        tokenizer_max_chars=args.tokenizer_max_chars,
        tokenizer_doc_cap=args.tokenizer_doc_cap,
        context=args.context,
        shard_tokens=args.shard_tokens,
        workers=args.workers,
        force=args.force,
    )
    manifest, stats = prepare_with_stats(cfg)
    print("\n".join(summary_lines(manifest, cfg.out, stats)))
    return 0


def _add_read_flags(parser: argparse.ArgumentParser) -> None:
    field = "JSONL field / Parquet or Arrow column holding the text (default: text)"
    parser.add_argument("--text-field", default="text", help=field)
    split_on = "cut text files into documents at this separator, e.g. '<|endoftext|>'"
    parser.add_argument("--split-on", default=None, metavar="SEP", help=split_on)


def add_data_commands(sub: Any) -> None:
    inputs = "files or folders: .txt, .jsonl/.json, .parquet, .arrow, also .gz/.xz/.bz2/.zst"
    tok = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer")
    tok_sub = tok.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    tt = tok_sub.add_parser("train", help="train on a sample of text files, folders or JSONL")
    tt.add_argument("inputs", nargs="*", help=f"{inputs} (default: the embedded corpus)")
    tt.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    tt.add_argument("--out", required=True, help="tokenizer.json to write")
    tt.add_argument("--force", action="store_true", help="overwrite an existing --out")
    _add_read_flags(tt)
    cap = f"characters to train on, the first in input order (default: {_MAX_CHARS})"
    tt.add_argument("--max-chars", type=count, default=DEFAULT_TOKENIZER_MAX_CHARS, help=cap)
    doc_cap = f"characters taken from one document (default: {DEFAULT_TOKENIZER_DOC_CAP:,})"
    tt.add_argument("--doc-cap", type=count, default=DEFAULT_TOKENIZER_DOC_CAP, help=doc_cap)
    tt.set_defaults(handler=_cmd_tokenizer_train)
    _add_prepare(sub, inputs)


def _add_prepare(sub: Any, inputs: str) -> None:
    pr = sub.add_parser("prepare", help="tokenize a corpus into train/val token shards")
    pr.add_argument("inputs", nargs="*", help=f"{inputs} (default: the embedded corpus)")
    pr.add_argument("--out", required=True, help="dataset folder to create")
    kinds = (
        "text: documents to pretrain on (default); prompt-completion: JSON lines (or "
        "Parquet/Arrow rows) of prompt/completion pairs, the prompt masked out of the loss "
        "(docs/finetune.md); chat: conversations of system/user/assistant turns, only the "
        "assistant's in the loss (docs/chat.md)"
    )
    pr.add_argument("--format", choices=("text", FORMAT, CHAT_FORMAT), default="text", help=kinds)
    _add_read_flags(pr)
    pr.add_argument("--prompt-field", default="prompt", help="with --format prompt-completion")
    pr.add_argument(
        "--completion-field", default="completion", help="with --format prompt-completion"
    )
    pr.add_argument(
        "--messages-field", default="messages", help="with --format chat: the list of turns"
    )
    pr.add_argument(
        "--tokenizer",
        help="use this tokenizer.json, or a Hugging Face folder holding one (its BOS/EOS/PAD "
        "from the folder's config files), instead of training one",
    )
    vocab = f"vocabulary size of the tokenizer trained here (default: {DEFAULT_VOCAB_SIZE})"
    pr.add_argument("--vocab-size", type=count, default=None, help=vocab)
    cap = f"characters of training text the tokenizer trains on (default: {_MAX_CHARS})"
    pr.add_argument(
        "--tokenizer-max-chars", type=count, default=DEFAULT_TOKENIZER_MAX_CHARS, help=cap
    )
    doc_cap = (
        f"characters the tokenizer takes from one document (default: {DEFAULT_TOKENIZER_DOC_CAP:,})"
    )
    pr.add_argument(
        "--tokenizer-doc-cap", type=count, default=DEFAULT_TOKENIZER_DOC_CAP, help=doc_cap
    )
    held_out = (
        f"validation limits (default: {DEFAULT_VAL_FRACTION:.0%} of the documents, at most "
        f"{DEFAULT_VAL_TOKENS:,} tokens); any one given replaces the default"
    )
    group = pr.add_argument_group("validation split", held_out)
    group.add_argument("--val-fraction", type=float, default=None, help="share of documents")
    group.add_argument("--val-docs", type=count, default=None, help="number of documents")
    group.add_argument(
        "--val-tokens", type=count, default=None, help="tokens (the documents' whole)"
    )
    context = "each split must hold at least one block of this many tokens + 1"
    pr.add_argument("--context", type=int, default=1024, help=context)
    shard = "maximum tokens per shard file"
    pr.add_argument("--shard-tokens", type=count, default=DEFAULT_SHARD_TOKENS, help=shard)
    workers = "encoding processes (default: one per core); the shards are the same for any"
    pr.add_argument("--workers", type=int, default=None, help=workers)
    pr.add_argument("--force", action="store_true", help="replace an existing dataset at --out")
    pr.set_defaults(handler=_cmd_prepare)
