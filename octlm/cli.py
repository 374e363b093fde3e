"""The `octlm` command: argparse subcommands, each a thin call into the library.

`main()` is the only place that catches `OctlmError`: it prints one line, `octlm: error: ...`,
and exits 1, so bad input never shows a traceback.
"""

from __future__ import annotations

import argparse
import os
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
    from octlm.tokenizer import DEFAULT_VOCAB_SIZE

    if args.tokenizer and args.vocab_size is not None:
        raise OctlmError(
            "--vocab-size has no effect with --tokenizer (its vocabulary is fixed)",
            "drop one of the two",
        )
    cfg = PrepareConfig(
        out=Path(args.out),
        inputs=tuple(args.inputs),
        tokenizer=Path(args.tokenizer) if args.tokenizer else None,
        vocab_size=args.vocab_size or DEFAULT_VOCAB_SIZE,
        val_fraction=args.val_fraction,
        context=args.context,
        shard_tokens=args.shard_tokens,
        force=args.force,
    )
    manifest = prepare(cfg)
    print("\n".join(summary_lines(manifest, cfg.out)))
    return 0


_FLAG_TYPES = {"int": int, "float": float, "str": str}
_CHOICES = {
    "model": ("micro", "tiny", "small", "main"),
    "dtype": ("fp32", "bf16", "fp16"),
    "parallel": ("ddp", "fsdp"),
}


def _add_train_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field; defaults stay None so the TOML value wins unless given."""
    from dataclasses import fields

    from octlm.config import TrainConfig, field_docs

    docs = field_docs()
    parser.add_argument("--config", help="TOML file with the same keys as these flags")
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type).replace(" | None", "")
        default = f" (default: {f.default})" if f.default is not None else ""
        help_text = docs.get(f.name, "") + default
        if kind == "bool":
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            parser.add_argument(
                flag,
                type=_FLAG_TYPES[kind],
                default=None,
                choices=_CHOICES.get(f.name),
                help=help_text,
            )


def _config_from_args(args: argparse.Namespace):
    from dataclasses import fields

    from octlm.config import TrainConfig, make_config

    overrides = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    return make_config(args.config, **overrides)


def _cmd_train(args: argparse.Namespace) -> int:
    from octlm.train.distributed import launched_by_torchrun
    from octlm.train.loop import train

    if args.nproc is not None and args.nproc < 1:
        raise OctlmError(f"--nproc {args.nproc} starts no process", "use --nproc 1 or more")
    if args.nproc and args.nproc > 1 and not launched_by_torchrun():
        return _torchrun(args.nproc)
    train(_config_from_args(args))
    return 0


def _cmd_verify_resume(args: argparse.Namespace) -> int:
    from octlm.verify import format_table, verify_resume

    if args.resume or args.stop_at is not None:
        raise OctlmError(
            "verify-resume chooses its own stops and resumes",
            "drop --resume and --stop-at; use --split K",
        )
    cfg = _config_from_args(args)
    summaries, kept = verify_resume(
        cfg,
        args.split,
        keep=args.keep,
        workdir=Path(args.workdir) if args.workdir else None,
        echo=lambda line: print(line, file=sys.stderr),
    )
    print("\n".join(format_table(summaries)))
    if kept:
        print(f"runs kept in {kept}")
    ok = all(s.identical for s in summaries)
    print(
        "identical: every resumed run matches the straight run bit for bit"
        if ok
        else "NOT identical: see the table"
    )
    return 0 if ok else 1


def _cmd_diff(args: argparse.Namespace) -> int:
    from octlm.rundiff import diff_runs, format_diff, load

    result = diff_runs(load(args.run_a), load(args.run_b))
    print("\n".join(format_diff(result, args.run_a, args.run_b)))
    return 0 if result.first is None and result.common_steps else 1


def _cmd_sweep(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from octlm.config import TrainConfig
    from octlm.sweep import base_from, run_sweep

    overrides = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if f.name != "out"}
    base, table = base_from(args.config, overrides)
    out = Path(args.out or "sweeps/sweep")
    run_sweep(
        base, table, grids=args.grid, sets=args.set, repeats=args.repeats, out=out, jobs=args.jobs
    )
    print((out / "summary.md").read_text(), end="")
    print(f"wrote {out / 'summary.md'} and {out / 'summary.csv'}")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from octlm.plot import plot_runs

    print(f"wrote {plot_runs(args.runs, args.output, unigram=not args.no_unigram)}")
    return 0


def _torchrun(nproc: int) -> int:
    """`octlm train --nproc N ...`: torchrun --standalone --nproc-per-node N -m octlm train."""
    import subprocess

    argv = sys.argv[1:]
    i = next(i for i, a in enumerate(argv) if a == "--nproc" or a.startswith("--nproc="))
    del argv[i : i + (1 if "=" in argv[i] else 2)]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "octlm",
        *argv,
    ]
    return subprocess.call(cmd)


def _load(args: argparse.Namespace):
    from octlm.train.loop import load_model_for_inference

    return load_model_for_inference(args.run, device=args.device)


def _cmd_eval(args: argparse.Namespace) -> int:
    import numpy as np

    from octlm.data.order import validation_starts
    from octlm.data.shards import ShardDataset
    from octlm.evaluate import evaluate
    from octlm.tokenizer import Tokenizer

    model, meta = _load(args)
    data_dir = Path(args.data or meta["data_dir"])
    dataset = ShardDataset.open(data_dir, tokenizer_fingerprint=meta["fingerprints"]["tokenizer"])
    tokenizer = Tokenizer.load(dataset.tokenizer_path)
    context = model.config.context
    stream = dataset.val if args.split == "val" else dataset.train
    n = args.batches * args.micro_batch if args.batches else len(stream)
    starts = validation_starts(len(stream), context, n)
    device = next(model.parameters()).device
    result = evaluate(
        model,
        stream,
        np.asarray(starts),
        context=context,
        micro_batch=args.micro_batch,
        token_bytes=tokenizer.token_bytes_table,
        device=device,
        dtype=args.dtype,
    )
    print(
        f"{meta['path']}  step {meta['train_state']['step']}  {args.split}: "
        f"loss {result.loss:.4f}  ppl {result.ppl:.3f}  bpb {result.bpb:.4f}  "
        f"({result.tokens:,} tokens)"
    )
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from octlm.data.shards import ShardDataset
    from octlm.generate import generate
    from octlm.tokenizer import Tokenizer

    if args.top_k is not None and args.top_k < 1:
        raise OctlmError(f"--top-k {args.top_k} keeps no token", "use --top-k 1 or more")
    model, meta = _load(args)
    data_dir = Path(args.data or meta["data_dir"])
    dataset = ShardDataset.open(data_dir, tokenizer_fingerprint=meta["fingerprints"]["tokenizer"])
    tokenizer = Tokenizer.load(dataset.tokenizer_path)
    prompt = tokenizer.encode(args.prompt, add_special_tokens=False)
    ids = [tokenizer.bos_id, *prompt]
    new = generate(
        model,
        ids,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        stop_id=tokenizer.eos_id,
    )
    print(args.prompt + tokenizer.decode(new))
    return 0


def _cmd_hash(args: argparse.Namespace) -> int:
    from octlm.hashing import weights_sha256

    model, meta = _load(args)
    print(f"{weights_sha256(model.state_dict())}  {meta['path']}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from octlm.report.report import build_report, write_page

    out = write_page(build_report(args.runs, title=args.title), args.out)
    runs = f"{len(args.runs)} run" + ("s" if len(args.runs) > 1 else "")
    print(f"wrote {out} ({runs}; open it in a browser)")
    return 0


def _cmd_playground(args: argparse.Namespace) -> int:
    from octlm.report.report import build_playground, write_page

    out = write_page(build_playground(), args.out)
    print(f"wrote {out} (schedule and clipping playgrounds; open it in a browser)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from octlm.export import export

    written = export(args.run, args.fmt, args.out, force=args.force, tokenizer=args.tokenizer)
    print(f"wrote {written} ({args.fmt})")
    return 0


def _cmd_analyze_unigram(args: argparse.Namespace) -> int:
    from octlm.analyze import format_unigram, unigram_for_data

    print(format_unigram(unigram_for_data(args.data)))
    return 0


def _cmd_analyze_underflow(args: argparse.Namespace) -> int:
    from octlm.analyze import format_underflow, underflow_for_run

    report = underflow_for_run(
        args.run, micro_batch=args.micro_batch, dtype=args.dtype, device=args.device, step=args.step
    )
    print(format_underflow(report))
    return 0


def _cmd_bench_peak(args: argparse.Namespace) -> int:
    from octlm.peak import format_peak, measure_peak, store_peak

    result = measure_peak(args.device, args.dtype, seconds=args.seconds)
    print(format_peak(result, store_peak(result)))
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage errors in the same one-line form as every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"octlm: error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    from octlm.data.prepare import DEFAULT_SHARD_TOKENS
    from octlm.tokenizer import DEFAULT_VOCAB_SIZE

    parser = _Parser(
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
        default=None,
        help=f"vocabulary size of the tokenizer trained here (default: {DEFAULT_VOCAB_SIZE})",
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

    tr = sub.add_parser("train", help="train a model (flags override --config)")
    _add_train_flags(tr)
    tr.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="processes on this machine: launches torchrun (gloo on CPU, NCCL on GPU)",
    )
    tr.set_defaults(handler=_cmd_train)

    vr = sub.add_parser("verify-resume", help="check exact resume: straight vs stopped+resumed")
    _add_train_flags(vr)
    vr.add_argument(
        "--split",
        type=int,
        action="append",
        required=True,
        help="stop at this step and resume (repeatable)",
    )
    vr.add_argument("--keep", action="store_true", help="keep the temporary runs")
    vr.add_argument("--workdir", help="folder for the temporary runs (default: the system's)")
    vr.set_defaults(handler=_cmd_verify_resume)

    sw = sub.add_parser("sweep", help="grid x repeats of training runs, resumable, summarised")
    _add_train_flags(sw)
    sw.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="values of one setting (repeatable: the product is swept)",
    )
    sw.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=V,KEY2=V2",
        help="one explicit setting whose keys change together (repeatable)",
    )
    sw.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs per setting, repeat r with seed + r (default 1)",
    )
    sw.add_argument("--jobs", type=int, default=1, help="runs at a time")
    sw.set_defaults(handler=_cmd_sweep)

    pl = sub.add_parser("plot", help="loss, learning rate, gradient norm and speed of runs")
    pl.add_argument("runs", nargs="+", metavar="RUN", help="run folders (overlaid)")
    pl.add_argument("-o", "--output", required=True, help="PNG file to write")
    pl.add_argument("--no-unigram", action="store_true", help="omit the unigram baseline")
    pl.set_defaults(handler=_cmd_plot)

    df = sub.add_parser("diff", help="first step where two run logs differ")
    df.add_argument("run_a")
    df.add_argument("run_b")
    df.set_defaults(handler=_cmd_diff)

    def run_parser(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("run", help="run folder (its newest checkpoint) or checkpoint file")
        p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
        return p

    ev = run_parser("eval", "validation loss, perplexity and bits per byte")
    ev.add_argument("--data", help="dataset folder (default: the one the run trained on)")
    ev.add_argument("--split", choices=("val", "train"), default="val")
    ev.add_argument("--batches", type=int, default=40, help="micro-batches; 0 = the whole split")
    ev.add_argument("--micro-batch", type=int, default=16)
    ev.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    ev.set_defaults(handler=_cmd_eval)

    ge = run_parser("generate", "continue a prompt")
    ge.add_argument("--prompt", required=True)
    ge.add_argument("--data", help="dataset folder whose tokenizer to use (default: the run's)")
    ge.add_argument("--max-new-tokens", type=int, default=64)
    ge.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ge.add_argument("--top-k", type=int, default=None)
    ge.add_argument("--seed", type=int, default=0)
    ge.set_defaults(handler=_cmd_generate)

    ha = run_parser("hash", "print the model's weights_sha256")
    ha.set_defaults(handler=_cmd_hash)

    rp = sub.add_parser("report", help="one self-contained HTML page of runs, with playgrounds")
    rp.add_argument("runs", nargs="+", metavar="RUN", help="run folder (or its log.jsonl)")
    rp.add_argument("-o", "--out", default="report.html", help="HTML file to write (folders made)")
    rp.add_argument("--title", help="page title (default: the runs' names)")
    rp.set_defaults(handler=_cmd_report)

    pg = sub.add_parser("playground", help="an HTML page of the schedule and clipping playgrounds")
    pg.add_argument("-o", "--out", default="playground.html", help="HTML file to write")
    pg.set_defaults(handler=_cmd_playground)

    ex = sub.add_parser("export", help="write a Hugging Face Llama folder or plain safetensors")
    ex.add_argument("run", help="run folder (its newest checkpoint) or checkpoint file")
    ex.add_argument("out", help="folder to write (safetensors: a folder or a .safetensors file)")
    ex.add_argument(
        "--format",
        choices=("hf", "safetensors"),
        default="hf",
        dest="fmt",
        help="hf: LlamaForCausalLM folder with tokenizer (default); safetensors: octlm's weights",
    )
    ex.add_argument("--tokenizer", help="the run's tokenizer.json (default: its dataset's)")
    ex.add_argument("--force", action="store_true", help="write into a non-empty OUT")
    ex.set_defaults(handler=_cmd_export)

    an = sub.add_parser("analyze", help="dataset and gradient diagnostics")
    an_sub = an.add_subparsers(dest="analyze_command", required=True, metavar="ACTION")
    au = an_sub.add_parser("unigram", help="unigram entropy of a dataset's validation split")
    au.add_argument("data", help="dataset folder made by `octlm prepare`")
    au.set_defaults(handler=_cmd_analyze_unigram)
    af = an_sub.add_parser("underflow", help="share of Linear-output gradients FP16 would flush")
    af.add_argument("run", help="run folder (its newest checkpoint) or checkpoint file")
    af.add_argument("--micro-batch", type=int, default=None, help="default: the run's")
    af.add_argument(
        "--dtype", choices=("fp32", "bf16", "fp16"), default=None, help="default: the run's"
    )
    af.add_argument("--step", type=int, default=None, help="data of this step (default: next)")
    af.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    af.set_defaults(handler=_cmd_analyze_underflow)

    be = sub.add_parser("bench", help="measure this machine")
    be_sub = be.add_subparsers(dest="bench_command", required=True, metavar="ACTION")
    bp = be_sub.add_parser("peak", help="peak matmul FLOP/s, cached for MFU")
    bp.add_argument("--seconds", type=float, default=5.0, help="time budget (default: 5)")
    bp.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="bf16")
    bp.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    bp.set_defaults(handler=_cmd_bench_peak)
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
    except BrokenPipeError:  # output piped into `head` and closed: not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (Python flushes it at exit)
        return 0
    except OSError as exc:  # disk full, permissions, a file where a folder should be
        where = f": {exc.filename}" if exc.filename else ""
        print(
            f"octlm: error: {exc.strerror or exc}{where}; check the path and free space",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print("octlm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
