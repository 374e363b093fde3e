"""The share of a run's wall time that `--eval-tasks` scoring takes, at a given N and interval.

    .venv/bin/python -m bench.task_share [--config recipe] [--tasks core-lite:100] [--rounds 3]

A real Run of the config (`build_run`, the tasks read as `--eval-tasks` reads them) is timed
part by part, the parts interleaved and their order alternating round by round: optimizer steps
exactly as the loop takes them (`advance`), one validation (`Run.validate`) and one scoring of
the tasks (the loop's own `task_scores`). Each round's times are put on schedules: the config's
own run (its steps and val_every) with the tasks scored at every validation (the default) and
at the last step only (eval_tasks_every = 0), and runs of the same model with the tasks scored
every E steps (`--every`). A schedule's task share is the scorings' time over the run's whole
time (steps, validations, scorings); the median over the rounds is printed, with the least E, a
multiple of val_every, that keeps the share at or under `--target`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from octlm.config.files import make_config
from octlm.trainer.loop import advance, task_scores
from octlm.trainer.run import Run, build_run

if not __package__:  # run as `python bench/task_share.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import bench_config


def occasions(steps: int, every: int) -> int:
    """How often an every-N-steps action runs in `steps` steps, the last step always among them
    (N = 0: the last step only)."""
    return 1 if every == 0 else steps // every + (steps % every != 0)


def task_share(
    steps: int, val_every: int, tasks_every: int | None, times: tuple[float, float, float]
) -> float:
    """The scorings' share of a run's wall time: `times` is (step, validation, scoring) in
    seconds; tasks_every None scores at every validation."""
    t_step, t_val, t_score = times
    n_val = occasions(steps, val_every)
    n_score = n_val if tasks_every is None else occasions(steps, tasks_every)
    scoring = n_score * t_score
    return scoring / (steps * t_step + n_val * t_val + scoring)


def least_interval(val_every: int, times: tuple[float, float, float], target: float) -> int:
    """The least E, a multiple of val_every, whose E steps with their validations and one
    scoring give the scoring at most `target` of the time (a long run's share)."""
    t_step, t_val, t_score = times
    per_step = t_step + (t_val / val_every if val_every else 0.0)
    steps = t_score * (1 - target) / target / per_step
    unit = val_every or 1
    return unit * max(1, math.ceil(steps / unit))


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one_round(run: Run, steps: int, flip: bool) -> tuple[float, float, float]:
    """(median step, validation, scoring) seconds, the parts in one order or the other."""
    parts = {
        "steps": lambda: statistics.median(
            timed(lambda: advance(run, validating=False)) for _ in range(steps)
        ),
        "val": lambda: timed(run.validate),
        "score": lambda: timed(lambda: task_scores(run)),
    }
    order = list(reversed(parts)) if flip else list(parts)
    got = {name: parts[name]() for name in order}
    return got["steps"], got["val"], got["score"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="recipe", help="a shipped config's name or a TOML file")
    ap.add_argument("--data", default=None, help="default: the config's")
    ap.add_argument("--context", type=int, default=None, help="default: the config's")
    ap.add_argument("--tasks", default="core-lite:100", help="an --eval-tasks spec")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps-per-round", type=int, default=3)
    ap.add_argument("--every", default="2500", help="intervals E to put on a schedule, a,b,...")
    ap.add_argument("--target", type=float, default=0.05)
    ap.add_argument("--device", default="cpu")
    return ap


def measure(args: argparse.Namespace, out: Path) -> list[tuple[float, float, float]]:
    """Each round's (step, validation, scoring) seconds on a Run of the config."""
    # val_every 1: the loop's task_scores scores at every step it is called at; the bench calls
    # it once a round. Nothing else here reads the intervals.
    keys = {"context": args.context, "out": out, "eval_tasks": args.tasks, "val_every": 1}
    data = {} if args.data is None else {"data": args.data}
    steps = 2 + args.rounds * args.steps_per_round
    cfg = bench_config(base=args.config, steps=steps, device=args.device, **keys, **data)
    run = build_run(cfg)
    advance(run, validating=False)  # warm-up: the first step and validation build caches
    run.validate()
    items = sum(len(t.items) for t in run.tasks)
    print(
        f"{args.config}: {len(run.tasks)} tasks, {items} items ({args.tasks}); "
        f"threads {torch.get_num_threads()}"
    )
    rows = []
    for r in range(args.rounds):
        rows.append(one_round(run, args.steps_per_round, flip=r % 2 == 1))
        t_step, t_val, t_score = rows[-1]
        print(
            f"round {r}: step {t_step:.3f} s  validation {t_val:.3f} s  scoring {t_score:.2f} s "
            f"({t_score / items * 1000:.1f} ms an item)"
        )
    return rows


def report(args: argparse.Namespace, rows: list[tuple[float, float, float]]) -> None:
    base = make_config(args.config)
    steps, val_every = base.lr_schedule.steps, base.evaluation.val_every
    schedules = [
        ("the config's run, tasks at every validation", steps, None),
        ("the config's run, tasks at the last step only", steps, 0),
    ]
    for every in (int(e) for e in args.every.split(",") if e.strip()):
        n = max(steps, 2 * every)
        schedules.append((f"{n} steps, tasks every {every}", n, every))
    t_step, t_val, t_score = (statistics.median(c) for c in zip(*rows, strict=True))
    print(
        f"\nmedians: step {t_step:.3f} s, validation {t_val:.3f} s, scoring {t_score:.2f} s "
        f"({t_score / t_step:.1f} steps)"
    )
    print(f"\n| schedule (val every {val_every}) | steps | scorings | task share (median) |")
    print("|---|---:|---:|---:|")
    for name, n, every in schedules:
        share = statistics.median(task_share(n, val_every, every, row) for row in rows)
        scorings = occasions(n, val_every) if every is None else occasions(n, every)
        print(f"| {name} | {n} | {scorings} | {share:.2%} |")
    least = [least_interval(val_every, row, args.target) for row in rows]
    print(
        f"\nleast interval for a share <= {args.target:.0%}: {statistics.median_high(least)} steps "
        f"(rounds: {', '.join(map(str, least))})"
    )


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-share-") as tmp:
        rows = measure(args, Path(tmp) / "run")
    report(args, rows)


if __name__ == "__main__":
    main()
