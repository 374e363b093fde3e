"""The `octlm` command: argparse subcommands, each a thin call into the library. `main()` is the
only place that catches `OctlmError`: it prints one line, `octlm: error: ...`, and exits 1."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

# Modules that import torch are imported by the handlers that use them: `--help` stays quick.
from octlm import __version__
from octlm.cli.data import add_data_commands
from octlm.cli.flags import add_config_flags, given_values, named_as_typed, setting_keys
from octlm.cli.model import add_model_commands, run_parser
from octlm.cli.rl import add_rl_command, run_rl
from octlm.cli.serve import add_serve_command
from octlm.cli.tasks import add_task_commands
from octlm.config.checks import shown, shown_path
from octlm.config.files import (
    field_docs,
    load_toml,
    make_config,
    make_rl_config,
    sectioned_toml,
    settings_command,
)
from octlm.config.rl import RLConfig
from octlm.config.run import DTYPES
from octlm.config.train import SECTIONS, TrainConfig, config_keys
from octlm.errors import OctlmError, RankError, one_line
from octlm.tools.export import FORMATS, export
from octlm.tools.gguf_export import OUTTYPES
from octlm.tools.plot import plot_runs
from octlm.tools.report.report import (
    build_playground,
    build_report,
    check_page_out,
    write_page,
)
from octlm.tools.rundiff import diff_folders
from octlm.tools.sweep import run_sweep
from octlm.tools.sweep_plan import base_from
from octlm.trainer.launch import (
    LAUNCHED_ENV,
    REQUEUE_SIGNALS,
    Launch,
    launch,
    leave_note,
    restart_resumes,
)

SHARED_ERROR_GRACE_S = 3.0


def _add_train_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig key, grouped by its section in `--help`; only dtype names are
    argparse choices."""
    add_config_flags(parser, SECTIONS, field_docs(), choices={"dtype": DTYPES})


def _overrides(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return given_values(args, [key for key in config_keys() if key not in skip])


def _config_from_args(args: argparse.Namespace) -> TrainConfig:
    return make_config(args.config, **_overrides(args))


def _cmd_train(args: argparse.Namespace) -> int:
    from octlm.trainer.distributed import launched_by_torchrun
    from octlm.trainer.loop import train
    from octlm.trainer.run import run_tasks

    if args.print_config:  # checked and resolved, nothing built: --out is not touched
        print(sectioned_toml(_config_from_args(args).resolved()), end="")
        return 0
    cfg = _config_from_args(args)
    spec = Launch(
        nproc=args.nproc if args.nproc is not None else 1,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        max_restarts=args.max_restarts,
        requeue_exit_code=args.requeue_exit_code,
    )
    if spec.needed and not launched_by_torchrun():
        run_tasks(cfg)  # a bad --eval-tasks file: one line, before any worker starts
        return launch(spec, sys.argv[1:], Path(cfg.run.out), args.requeue_exit_code, main)
    if restart_resumes():  # the elastic agent restarted the group after a failure
        cfg = cfg.replace(resume=True)
    # A --model flag must have the shape the run starts from: checked in the run, against the
    # --init-from source or the checkpoint it resumes.
    result = train(cfg, hard_exit=True, model_flag=args.model is not None)
    if (
        args.requeue_exit_code is not None
        and result.stop_signal in REQUEUE_SIGNALS
        and LAUNCHED_ENV not in os.environ  # that launcher picks the code (launch.py)
    ):
        return args.requeue_exit_code
    return 0


def _given(args: argparse.Namespace, key: str) -> bool:
    """Whether `key` was set by a flag or the --config file (not left at its default)."""
    return getattr(args, key) is not None or bool(args.config and key in load_toml(args.config))


def _cmd_verify_resume(args: argparse.Namespace) -> int:
    from octlm.tools.verify import format_result, verify_resume, with_digests
    from octlm.trainer.init_from import check_preset

    if args.resume or args.stop_at is not None:
        raise OctlmError(
            "verify-resume chooses its own stops and resumes",
            "drop --resume and --stop-at; use --split K",
        )
    workdir = Path(args.workdir) if args.workdir else None
    echo = partial(print, file=sys.stderr)
    if args.config is not None and settings_command(args.config) == "octlm rl":
        cfg: TrainConfig | RLConfig = _rl_settings_only(args)
    else:
        cfg = _config_from_args(args)
        check_preset(cfg, args.model)  # its runs see the preset in their config file: it yields
        cfg = with_digests(cfg, _given(args, "hash_tensors"), _given(args, "hash_every"))
    summaries, kept = verify_resume(cfg, args.split, keep=args.keep, workdir=workdir, echo=echo)
    print("\n".join(format_result(summaries, kept)))
    return 0 if all(s.identical for s in summaries) else 1


def _rl_settings_only(args: argparse.Namespace) -> RLConfig:
    """An RL run's settings file (`octlm rl --print-config`), verified as it stands: training's
    flags do not apply to it."""
    given = [key for key in config_keys() if getattr(args, key) is not None]
    if given:
        raise OctlmError(
            f"{shown_path(args.config)} holds octlm rl's settings; --{given[0].replace('_', '-')} "
            "is octlm train's",
            "put the RL settings in the file, or add --verify-split K to the octlm rl command",
        )
    return make_rl_config(args.config)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from octlm.trainer.init_from import check_preset

    base, table = base_from(args.config, _overrides(args, skip=("out",)))
    check_preset(base, args.model)  # its runs see the preset in their config file: it yields
    if base.evaluation.eval_tasks:  # a bad task file: one line, before the sweep's folder
        from octlm.evaluate.protocol import read_tasks

        read_tasks(base.evaluation.eval_tasks, "eval_tasks")
    runs = {"grids": args.grid, "sets": args.set, "repeats": args.repeats, "jobs": args.jobs}
    run_sweep(base, table, out=args.out, **runs)  # prints the summary; failed runs raise
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    print(f"wrote {plot_runs(args.runs, args.output, unigram=not args.no_unigram)}")
    return 0


def _cmd_log_export(args: argparse.Namespace) -> int:
    from octlm.tools.logexport import export_tensorboard  # lazy: it imports torch's writer

    written, bad = export_tensorboard(args.run, args.tensorboard)
    skipped = f" ({bad} unreadable line{'s' * (bad > 1)} skipped)" if bad else ""
    print(f"wrote {written} records to {args.tensorboard}{skipped}")
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    lines, same = diff_folders(args.run_a, args.run_b)
    print("\n".join(lines))
    return 0 if same else 1


def _cmd_report(args: argparse.Namespace) -> int:
    check_page_out(args.out)  # before any run is read
    out = write_page(build_report(args.runs, title=args.title), args.out)
    print(f"wrote {out} ({len(args.runs)} run{'s' * (len(args.runs) > 1)}; open it in a browser)")
    return 0


def _cmd_playground(args: argparse.Namespace) -> int:
    check_page_out(args.out)
    out = write_page(build_playground(), args.out)
    print(f"wrote {out} (schedule and clipping playgrounds; open it in a browser)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    options = {"force": args.force, "tokenizer": args.tokenizer, "outtype": args.outtype}
    written = export(args.run, args.fmt, args.out, **options)
    print(f"wrote {written} ({args.fmt})")
    return 0


def _cmd_analyze_unigram(args: argparse.Namespace) -> int:
    from octlm.tools.analyze import format_unigram, unigram_for_data

    print(format_unigram(unigram_for_data(args.data)))
    return 0


def _cmd_analyze_underflow(args: argparse.Namespace) -> int:
    from octlm.tools.analyze import format_underflow, underflow_for_run

    sizes = {"micro_batch": args.micro_batch, "dtype": args.dtype, "step": args.step}
    print(format_underflow(underflow_for_run(args.run, device=args.device, **sizes)))
    return 0


def _cmd_bench_peak(args: argparse.Namespace) -> int:
    from octlm.tools.peak import format_peak, measure_peak, store_peak

    result = measure_peak(args.device, args.dtype, seconds=args.seconds)
    print(format_peak(result, store_peak(result)))
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage errors in the same one-line form as every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"octlm: error: {one_line(message)}; see `{self.prog} --help`\n")


def _add_train_commands(sub: Any) -> None:
    tr = sub.add_parser("train", help="train a model (flags override --config)")
    _add_train_flags(tr)
    nproc = "processes per node: launches them under torchrun's agent (gloo on CPU, NCCL on GPU)"
    tr.add_argument("--nproc", type=int, default=None, help=nproc)
    tr.add_argument("--nnodes", type=int, default=1, help="nodes, each running this command")
    tr.add_argument("--node-rank", type=int, default=0, help="this node's number, 0 to nnodes-1")
    endpoint = "HOST:PORT every node meets at (c10d rendezvous), HOST node 0's address"
    tr.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT", help=endpoint)
    rdzv_id = "the job's name at the rendezvous, the same on every node (default: octlm)"
    tr.add_argument("--rdzv-id", default=None, help=rdzv_id)
    restarts = "restart the workers this often when one dies, each time resuming (default 0)"
    tr.add_argument("--max-restarts", type=int, default=0, help=restarts)
    requeue = "exit with this code when SIGTERM or SIGUSR1 stopped the run (for a scheduler)"
    tr.add_argument("--requeue-exit-code", type=int, default=None, metavar="CODE", help=requeue)
    printed = "print the resolved settings (shape written out) as TOML for --config, and exit"
    tr.add_argument("--print-config", action="store_true", help=printed)
    tr.set_defaults(handler=_cmd_train, settings="octlm train")

    vr = sub.add_parser("verify-resume", help="check exact resume: straight vs stopped+resumed")
    _add_train_flags(vr)
    split = "stop at this step and resume (repeatable)"
    vr.add_argument("--split", type=int, action="append", required=True, help=split)
    vr.add_argument("--keep", action="store_true", help="keep the temporary runs")
    vr.add_argument("--workdir", help="folder for the temporary runs (default: the system's)")
    vr.set_defaults(handler=_cmd_verify_resume, settings="octlm train")

    sw = sub.add_parser("sweep", help="grid x repeats of training runs, resumable, summarised")
    _add_train_flags(sw)
    grid = "values of one setting (repeatable: the product is swept)"
    sw.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2", help=grid)
    one = "one explicit setting whose keys change together (repeatable)"
    sw.add_argument("--set", action="append", default=[], metavar="KEY=V,KEY2=V2", help=one)
    repeats = "runs per setting, repeat r with seed + r (default 1)"
    sw.add_argument("--repeats", type=int, default=None, help=repeats)
    sw.add_argument("--jobs", type=int, default=1, help="runs at a time")
    sw.set_defaults(handler=_cmd_sweep, settings="octlm train")


def _add_log_commands(sub: Any) -> None:
    pl = sub.add_parser("plot", help="loss, learning rate, gradient norm and speed of runs")
    pl.add_argument("runs", nargs="+", metavar="RUN", help="run folders (overlaid)")
    pl.add_argument("-o", "--output", required=True, help="PNG file to write")
    pl.add_argument("--no-unigram", action="store_true", help="omit the unigram baseline")
    pl.set_defaults(handler=_cmd_plot)
    df = sub.add_parser("diff", help="first step where two run logs differ")
    df.add_argument("run_a")
    df.add_argument("run_b")
    df.set_defaults(handler=_cmd_diff)
    lg = sub.add_parser("log", help="a run's log.jsonl in other tools")
    lg_sub = lg.add_subparsers(dest="log_command", required=True, metavar="ACTION")
    le = lg_sub.add_parser("export", help="replay a run's log into TensorBoard event files")
    le.add_argument("run", help="run folder (or its log.jsonl)")
    le.add_argument("--tensorboard", required=True, metavar="DIR", help="event files go here")
    le.set_defaults(handler=_cmd_log_export)


def _add_page_commands(sub: Any) -> None:
    rp = sub.add_parser("report", help="one self-contained HTML page of runs, with playgrounds")
    rp.add_argument("runs", nargs="+", metavar="RUN", help="run folder (or its log.jsonl)")
    rp.add_argument("-o", "--out", default="report.html", help="HTML file to write (folders made)")
    rp.add_argument("--title", help="page title (default: the runs' names)")
    rp.set_defaults(handler=_cmd_report)
    pg = sub.add_parser("playground", help="an HTML page of the schedule and clipping playgrounds")
    pg.add_argument("-o", "--out", default="playground.html", help="HTML file to write")
    pg.set_defaults(handler=_cmd_playground)


def _add_export_command(sub: Any) -> None:
    what = "write a Hugging Face Llama/Qwen3 folder, plain safetensors, or a llama.cpp GGUF file"
    ex = run_parser(sub, "export", what)
    ex.add_argument(
        "out", help="folder to write (safetensors: a folder or a .safetensors file; gguf: .gguf)"
    )
    kinds = "hf: Llama (Qwen3 with q/k norms) folder with tokenizer (default); safetensors; gguf"
    ex.add_argument("--format", choices=FORMATS, default="hf", dest="fmt", help=kinds)
    ex.add_argument(
        "--outtype", choices=OUTTYPES, help="gguf tensor type: f32, f16 (default) or q8_0"
    )
    ex.add_argument("--tokenizer", help="the run's tokenizer.json (default: its dataset's)")
    ex.add_argument("--force", action="store_true", help="write into a non-empty OUT")
    ex.set_defaults(handler=_cmd_export)


def _add_machine_commands(sub: Any) -> None:
    an = sub.add_parser("analyze", help="dataset and gradient diagnostics")
    an_sub = an.add_subparsers(dest="analyze_command", required=True, metavar="ACTION")
    au = an_sub.add_parser("unigram", help="unigram entropy of a dataset's validation split")
    au.add_argument("data", help="dataset folder made by `octlm prepare`")
    au.set_defaults(handler=_cmd_analyze_unigram)
    flush = "share of Linear-output gradients FP16 would flush"
    af = run_parser(an_sub, "underflow", flush)
    af.add_argument("--micro-batch", type=int, default=None, help="default: the run's")
    af.add_argument("--dtype", choices=DTYPES, default=None, help="default: the run's")
    af.add_argument("--step", type=int, default=None, help="data of this step (default: next)")
    af.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    af.set_defaults(handler=_cmd_analyze_underflow)

    be = sub.add_parser("bench", help="measure this machine")
    be_sub = be.add_subparsers(dest="bench_command", required=True, metavar="ACTION")
    bp = be_sub.add_parser("peak", help="peak matmul FLOP/s, cached for MFU")
    bp.add_argument("--seconds", type=float, default=5.0, help="time budget (default: 5)")
    bp.add_argument("--dtype", choices=DTYPES, default="bf16")
    bp.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    bp.set_defaults(handler=_cmd_bench_peak)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="octlm", description="Train small GPT-style language models that resume exactly."
    )
    parser.add_argument("--version", action="version", version=f"octlm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_data_commands(sub)
    _add_train_commands(sub)
    _add_log_commands(sub)
    add_model_commands(sub)
    add_serve_command(sub, run_parser)
    add_rl_command(sub, lambda args: run_rl(args, main))
    add_task_commands(sub)
    _add_page_commands(sub)
    _add_export_command(sub)
    _add_machine_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with named_as_typed(args, setting_keys(args)):  # a setting as the user gave it
            return args.handler(args)
    except OctlmError as exc:
        if not isinstance(exc, RankError) and os.environ.get("RANK", "0") != "0":
            # An error every rank meets alike is rank 0's to print: wait for it to, and for
            # the agent to stop this worker once rank 0 has exited. Only a rank that is still
            # here after the grace (rank 0 did not fail) prints its own line.
            time.sleep(SHARED_ERROR_GRACE_S)
        leave_note()
        print(f"octlm: error: {one_line(exc.message)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and closed: not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (Python flushes it at exit)
        return 0
    except OSError as exc:  # disk full, permissions, a file where a folder should be
        problem = f"{exc.strerror or shown(str(exc))}"
        problem += f": {shown_path(exc.filename)}" if exc.filename else ""
        print(f"octlm: error: {one_line(problem)}; check the path and free space", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("octlm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
