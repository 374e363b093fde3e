"""`octlm rl RUN --task NAME --out OUT`: reinforcement learning on a verifiable task from a chat
fine-tune (docs/rl.md). Its flags, `--config` and `--print-config` are built as `octlm train`'s
are (`octlm.cli.flags`), from `RLConfig`'s sections (octlm/config/rl.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from octlm.cli.flags import add_config_flags, given_values
from octlm.config.files import make_rl_config, rl_field_docs, sectioned_toml
from octlm.config.rl import KEY_ORDER, NO_OUT, SECTIONS, RLConfig
from octlm.errors import OctlmError
from octlm.trainer.launch import Launch, launch


def add_rl_command(sub: Any, handler: Callable[[argparse.Namespace], int]) -> None:
    rl = sub.add_parser(
        "rl", help="reinforcement learning on a verifiable task, from a chat fine-tune (docs/rl.md)"
    )
    rl.add_argument(
        "source",
        metavar="RUN",
        nargs="?",
        help="the chat fine-tune to start from (run folder or checkpoint; or source in --config)",
    )
    add_config_flags(rl, SECTIONS, rl_field_docs(), skip=("source",))
    rl.add_argument(
        "--print-config",
        action="store_true",
        help="print the settings as the TOML --config reads back (checked), and exit",
    )
    rl.add_argument("--nproc", type=int, default=1, help="processes (prompts split among them)")
    rl.add_argument(
        "--verify-split",
        type=int,
        action="append",
        metavar="K",
        help="instead of one run: octlm verify-resume on these settings (a straight run and one "
        "stopped at K and resumed, each in its own process, compared bit for bit; repeatable)",
    )
    rl.add_argument("--keep", action="store_true", help="with --verify-split: keep the runs")
    rl.add_argument("--workdir", help="with --verify-split: where the runs go (a temporary folder)")
    rl.set_defaults(handler=handler, settings="octlm rl")


def rl_config_from_args(args: argparse.Namespace) -> RLConfig:
    """The flags over the --config file's keys, checked (one line each)."""
    return make_rl_config(args.config, **given_values(args, KEY_ORDER))


def run_rl(args: argparse.Namespace, entry: Callable[[], Any]) -> int:
    """`octlm rl`: the settings checked (one line each, before anything runs), then the run,
    in this process or (`--nproc`) as the workers `launch` starts, each running `entry`."""
    from octlm.rl.loop import rl
    from octlm.rl.run import check_world
    from octlm.rl.tasks import get_task
    from octlm.trainer.distributed import launched_by_torchrun

    cfg = rl_config_from_args(args)
    if args.print_config:  # checked, nothing built: --out is not touched
        print(sectioned_toml(cfg), end="")
        return 0
    if args.verify_split:
        return _verify(args, cfg)
    if cfg.run.out is None:  # before any worker starts (the run itself checks it too)
        raise OctlmError(*NO_OUT)
    spec = Launch(nproc=args.nproc)
    check_world(cfg.policy.prompts, args.nproc)  # before any worker starts
    get_task(cfg.policy.task)  # a task that cannot make a problem: one line, before the claim
    if spec.needed and not launched_by_torchrun():
        return launch(spec, sys.argv[1:], Path(cfg.run.out), None, entry)
    rl(cfg, hard_exit=True)
    return 0


def _verify(args: argparse.Namespace, cfg: RLConfig) -> int:
    """`--verify-split K`: the one verify (`octlm.tools.verify`), as `octlm verify-resume`
    runs it for a training run's settings."""
    from octlm.tools.verify import format_result, verify_resume

    if args.out is not None or cfg.run.resume or cfg.run.stop_at is not None or args.nproc != 1:
        raise OctlmError(
            "--verify-split chooses its own folders, stops and resumes",
            "drop --out, --resume, --stop-at and --nproc (use --workdir and --keep)",
        )
    echo = partial(print, file=sys.stderr)
    workdir = Path(args.workdir) if args.workdir else None
    summaries, kept = verify_resume(
        cfg, args.verify_split, keep=args.keep, workdir=workdir, echo=echo
    )
    print("\n".join(format_result(summaries, kept)))
    return 0 if all(s.identical for s in summaries) else 1
