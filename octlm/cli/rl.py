"""`octlm rl RUN --task NAME --out OUT`: reinforcement learning on a verifiable task from a chat
fine-tune (docs/rl.md); every setting is a flag of `RLConfig` (octlm/rl/settings.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

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
            required = f.name in ("task", "out")
            default = None if required else f.default
            shown = "" if required or default is None else f" (default {default})"
            rl.add_argument(flag, type=kind, required=required, default=default, help=about + shown)
    rl.add_argument("--nproc", type=int, default=1, help="processes (prompts split among them)")
    rl.set_defaults(handler=handler)


def run_rl(args: argparse.Namespace, entry: Callable[[], Any]) -> int:
    """`octlm rl`: the settings checked (one line each, before anything runs), then the run,
    in this process or (`--nproc`) as the workers `launch` starts, each running `entry`."""
    from octlm.rl.loop import rl
    from octlm.trainer.distributed import launched_by_torchrun

    cfg = RLConfig(**{f.name: getattr(args, f.name) for f in fields(RLConfig)})
    spec = Launch(nproc=args.nproc)
    if spec.needed and not launched_by_torchrun():
        return launch(spec, sys.argv[1:], Path(cfg.out), None, entry)
    rl(cfg, hard_exit=True)
    return 0
