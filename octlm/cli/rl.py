"""`octlm rl RUN --task NAME --out OUT`: reinforcement learning on a verifiable task from a chat
fine-tune (docs/rl.md); every setting is a flag of `RLConfig` (octlm/rl/settings.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import MISSING, fields
from functools import partial
from pathlib import Path
from typing import Any

from octlm.errors import OctlmError
from octlm.rl.settings import RLConfig
from octlm.trainer.launch import Launch, launch

_TYPES = {"int": int, "float": float, "str": str, "int | None": int, "str | None": str}
_POSITIONAL = ("source",)
_SWITCHES = ("resume",)


def _field_help() -> dict[str, str]:
    """Each setting's docstring, read from the source (the first sentence is the help)."""
    import ast
    import inspect

    from octlm.rl import settings

    tree = ast.parse(inspect.getsource(settings))
    docs: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "RLConfig":
            body = node.body
            for a, b in zip(body, body[1:], strict=False):
                if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr):
                    value = getattr(b.value, "value", None)
                    if isinstance(a.target, ast.Name) and isinstance(value, str):
                        docs[a.target.id] = " ".join(value.split())
    return docs


def add_rl_command(sub: Any, handler: Callable[[argparse.Namespace], int]) -> None:
    rl = sub.add_parser(
        "rl", help="reinforcement learning on a verifiable task, from a chat fine-tune (docs/rl.md)"
    )
    rl.add_argument("source", metavar="RUN", help="the chat fine-tune (run folder or checkpoint)")
    docs = _field_help()
    for f in fields(RLConfig):
        if f.name in _POSITIONAL:
            continue
        flag = "--" + f.name.replace("_", "-")
        about = docs.get(f.name, "")
        if f.name in _SWITCHES:
            rl.add_argument(flag, action="store_true", help=about)
        elif f.name == "progress":
            rl.add_argument(flag, action=argparse.BooleanOptionalAction, help=about)
        else:
            kind = _TYPES[str(f.type)]
            required = f.name == "task"
            default = None if required or f.default is MISSING else f.default
            shown = "" if required or default is None else f" (default {default})"
            rl.add_argument(flag, type=kind, required=required, default=default, help=about + shown)
    rl.add_argument("--nproc", type=int, default=1, help="processes (prompts split among them)")
    rl.add_argument(
        "--verify-split",
        type=int,
        action="append",
        metavar="K",
        help="instead of one run: a straight run and one stopped at K and resumed, each in its "
        "own process, compared bit for bit (repeatable; as octlm verify-resume)",
    )
    rl.add_argument("--keep", action="store_true", help="with --verify-split: keep the runs")
    rl.add_argument("--workdir", help="with --verify-split: where the runs go (a temporary folder)")
    rl.set_defaults(handler=handler)


def run_rl(args: argparse.Namespace, entry: Callable[[], Any]) -> int:
    """`octlm rl`: the settings checked (one line each, before anything runs), then the run,
    in this process or (`--nproc`) as the workers `launch` starts, each running `entry`."""
    from octlm.rl.loop import rl
    from octlm.rl.run import check_world
    from octlm.trainer.distributed import launched_by_torchrun

    values = {f.name: getattr(args, f.name) for f in fields(RLConfig)}
    if args.verify_split:
        return _verify(args, values)
    if args.out is None:
        raise OctlmError("octlm rl needs --out", "name a folder for the RL run")
    cfg = RLConfig(**values)
    spec = Launch(nproc=args.nproc)
    check_world(cfg.prompts, args.nproc)  # before any worker starts
    if spec.needed and not launched_by_torchrun():
        return launch(spec, sys.argv[1:], Path(cfg.out), None, entry)
    rl(cfg, hard_exit=True)
    return 0


def _verify(args: argparse.Namespace, values: dict[str, Any]) -> int:
    from octlm.tools.rlverify import verify_rl
    from octlm.tools.verify import format_result

    if args.out is not None or args.resume or args.stop_at is not None or args.nproc != 1:
        raise OctlmError(
            "--verify-split chooses its own folders, stops and resumes",
            "drop --out, --resume, --stop-at and --nproc (use --workdir and --keep)",
        )
    cfg = RLConfig(**{**values, "out": ""})
    echo = partial(print, file=sys.stderr)
    workdir = Path(args.workdir) if args.workdir else None
    summaries, kept = verify_rl(cfg, args.verify_split, keep=args.keep, workdir=workdir, echo=echo)
    print("\n".join(format_result(summaries, kept)))
    return 0 if all(s.identical for s in summaries) else 1
