"""The `octlm` command: argparse subcommands, each a thin call into the library.

`main()` is the only place that catches `OctlmError`: it prints one line, `octlm: error: ...`,
and exits 1, so bad input never shows a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from octlm import __version__
from octlm.errors import OctlmError

Handler = Callable[[argparse.Namespace], int]


def _cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from octlm.data.corpus import read_documents
    from octlm.tokenizer import Tokenizer, check_vocab_size

    out = Path(args.out)
    if out.exists() and not args.force:
        raise OctlmError(f"{out} already exists", "choose another --out, or pass --force")
    check_vocab_size(args.vocab_size)
    docs = read_documents(args.inputs)
    tokenizer = Tokenizer.train((d.text for d in docs), args.vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(out)
    print(f"trained on {len(docs):,} documents: vocabulary {tokenizer.vocab_size:,}")
    print(f"wrote {out}  fingerprint {tokenizer.fingerprint}")
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from octlm.data.prepare import PrepareConfig, prepare, summary_lines

    cfg = PrepareConfig(
        out=Path(args.out),
        inputs=tuple(args.inputs),
        tokenizer=Path(args.tokenizer) if args.tokenizer else None,
        vocab_size=args.vocab_size,
        val_fraction=args.val_fraction,
        context=args.context,
        shard_tokens=args.shard_tokens,
        force=args.force,
    )
    manifest = prepare(cfg)
    print("\n".join(summary_lines(manifest, cfg.out)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from octlm.data.prepare import DEFAULT_SHARD_TOKENS
    from octlm.tokenizer import DEFAULT_VOCAB_SIZE

    parser = argparse.ArgumentParser(
        prog="octlm", description="Train small GPT-style language models that resume exactly."
    )
    parser.add_argument("--version", action="version", version=f"octlm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tok = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer")
    tok_sub = tok.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    tt = tok_sub.add_parser("train", help="train on text files, folders or JSONL")
    tt.add_argument("inputs", nargs="*", help="inputs (default: the embedded corpus)")
    tt.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    tt.add_argument("--out", required=True, help="tokenizer.json to write")
    tt.add_argument("--force", action="store_true", help="overwrite an existing --out")
    tt.set_defaults(handler=_cmd_tokenizer_train)

    pr = sub.add_parser("prepare", help="tokenize a corpus into train/val token shards")
    pr.add_argument(
        "inputs", nargs="*", help="text files, folders, JSONL (default: embedded corpus)"
    )
    pr.add_argument("--out", required=True, help="dataset folder to create")
    pr.add_argument("--tokenizer", help="use this tokenizer.json instead of training one")
    pr.add_argument(
        "--vocab-size",
        type=int,
        default=DEFAULT_VOCAB_SIZE,
        help="vocabulary size of the tokenizer trained here",
    )
    pr.add_argument(
        "--val-fraction", type=float, default=0.1, help="share of documents held out for validation"
    )
    pr.add_argument(
        "--context",
        type=int,
        default=1024,
        help="each split must hold at least one block of this many tokens + 1",
    )
    pr.add_argument(
        "--shard-tokens",
        type=int,
        default=DEFAULT_SHARD_TOKENS,
        help="maximum tokens per shard file",
    )
    pr.add_argument("--force", action="store_true", help="replace an existing dataset at --out")
    pr.set_defaults(handler=_cmd_prepare)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except OctlmError as exc:
        print(f"octlm: error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("octlm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
