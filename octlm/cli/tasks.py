"""`octlm rl-data`: a verifiable task's problems written as chat data for the format fine-tune
(`cli/main.py` adds the command and catches its errors). Every check runs before anything is
written; imports no torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from octlm.cli.data import count
from octlm.config import checks
from octlm.errors import OctlmError
from octlm.rl.task_data import write_chat_data
from octlm.rl.tasks import KNOWN, get_task
from octlm.tools.outputs import check_file_out

SUFFIX = ".jsonl"
"""`octlm prepare` tells a JSON-lines file by its name."""


def _cmd_rl_data(args: argparse.Namespace) -> int:
    checks.check_path("--out", args.out)
    task = get_task(args.task)
    checks.check("--count", args.count, checks.Int(1), "pass --count 1 or more")
    checks.check("--seed", args.seed, checks.Int(0), "pass a --seed from 0 to 2**53 - 1")
    out = Path(args.out)
    check_file_out("--out", out)
    if out.suffix.lower() != SUFFIX:
        raise OctlmError(
            f"--out {checks.shown_path(out)} does not end in {SUFFIX}",
            f"name a {SUFFIX} file: `octlm prepare` reads JSON lines by that suffix",
        )
    if out.exists() and not args.force:
        raise OctlmError(
            f"--out {checks.shown_path(out)} already exists",
            "choose another --out, or pass --force",
        )
    write_chat_data(task, args.count, out, seed=args.seed)
    print(f"wrote {args.count:,} conversations of {task.name} to {out}")
    print(f"next: octlm prepare {out} --format chat --tokenizer BASE_TOKENIZER --out DATA")
    return 0


def add_task_commands(sub: Any) -> None:
    rd = sub.add_parser("rl-data", help="write a verifiable task's problems as chat data")
    rd.add_argument("--task", required=True, help=f"the task: {KNOWN}")
    rd.add_argument("--count", type=count, required=True, help="conversations to write")
    rd.add_argument("--out", required=True, help=f"the {SUFFIX} file to write (folders made)")
    seed = "seed of the problems (default 0); never the held-out ones, whatever the seed"
    rd.add_argument("--seed", type=int, default=0, help=seed)
    rd.add_argument("--force", action="store_true", help="overwrite an existing --out")
    rd.set_defaults(handler=_cmd_rl_data)
