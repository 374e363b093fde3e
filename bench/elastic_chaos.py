"""Elastic chaos: SIGKILL one worker of a multi-process run at random moments; torchrun's agent
restarts the group each time, the restart resumes, and the end must be the straight run's bits.

    .venv/bin/python -m bench.elastic_chaos --kills 20 [--parallel ddp|fsdp] [--nproc 2]

Runs the config straight once with `--nproc N` for reference, then once more as one
`octlm train --nproc N --max-restarts KILLS+2 --resume` launcher, killing a random worker (a
child of the launcher) after a random delay, `--kills` times, and lets it finish. Saves are
slowed by the OCTLM_CHAOS_SAVE_PAUSE fault point so that some kills land in a checkpoint
write. A run that makes no progress for `--stall` seconds counts as hung (exit 2). Prints the
kills, how many landed during a save, the steps redone, and whether the weights are identical.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.chaos import checkpoint_step, last_logged_step, straight_reference, unlisted, verdict
from octlm.config.files import make_config
from octlm.tools import subrun
from octlm.trainer.forkstart import worker_pids


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--save-pause", type=float, default=0.15, help="seconds, per save, twice")
    ap.add_argument("--min-delay", type=float, default=0.5, help="after the workers start")
    ap.add_argument("--max-delay", type=float, default=6.0)
    ap.add_argument("--stall", type=float, default=180.0, help="seconds without a new step")
    ap.add_argument("--seed", type=int, default=0, help="seeds the kill times and victims")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    return ap


def kill_workers(
    proc: subprocess.Popen, out: Path, args: argparse.Namespace, rng: random.Random
) -> tuple[int, int, int] | None:
    """SIGKILL a random worker of the launcher `proc` after a random delay, `args.kills`
    times, until it ends: (kills, of them during a checkpoint write, steps redone), or None
    when the run hung (no new step for `args.stall` seconds; the launcher is killed)."""
    kills = during_save = redone = 0
    progress, seen = time.monotonic(), -1
    next_kill = None
    while proc.poll() is None:
        time.sleep(0.05)
        step = last_logged_step(out)
        if step != seen:
            progress, seen = time.monotonic(), step
        if time.monotonic() - progress > args.stall:
            proc.kill()
            print(f"HUNG: no new step for {args.stall:.0f} s after step {seen} ({kills} kills)")
            return None
        workers = worker_pids(proc.pid)
        if kills >= args.kills or len(workers) != args.nproc:
            next_kill = None  # between groups: wait for the restart to be up
            continue
        if next_kill is None:
            next_kill = time.monotonic() + rng.uniform(args.min_delay, args.max_delay)
        if time.monotonic() < next_kill:
            continue
        orphans_before = unlisted(out)
        victim = rng.choice(workers)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            continue
        kills += 1
        next_kill = None
        in_save = list((out / "checkpoints").glob(".*.tmp-*")) or unlisted(out) - orphans_before
        during_save += bool(in_save)
        redone += max(0, last_logged_step(out) - checkpoint_step(out))
        while victim in worker_pids(proc.pid):  # until the agent has noticed and reaped it
            time.sleep(0.05)
    return kills, during_save, redone


def main() -> int:
    args = build_parser().parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="octlm-elastic-", dir=args.workdir))
    t0 = time.time()
    cfg = make_config(args.config, steps=args.steps, ckpt_every=args.ckpt_every)
    accum = max(1, cfg.inputs.accum // args.nproc)
    cfg = cfg.replace(parallel=args.parallel, accum=accum)
    config = subrun.write_config(cfg, root / "config.toml")
    nproc = ("--nproc", str(args.nproc))
    reference = straight_reference(config, root, t0, *nproc)
    if reference is None:
        return 2

    out = root / "chaos"
    env = {**os.environ, "OCTLM_CHAOS_SAVE_PAUSE": str(args.save_pause)}
    argv = subrun.train_argv(config, out, "--resume", *nproc)
    argv += ["--max-restarts", str(args.kills + 2)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    survived = kill_workers(proc, out, args, rng)
    if survived is None:
        return 2
    kills, during_save, redone = survived
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        print(f"run failed (exit {proc.returncode}): {subrun.last_line(err)}")
        return 2
    print(
        f"{args.parallel} x {args.nproc}: kills survived: {kills} ({during_save} with a "
        f"checkpoint write in progress), resumes: {err.count('resumed from')}, "
        f"steps redone: {redone}"
    )
    return verdict(out, reference, t0, root, args.keep)


if __name__ == "__main__":
    sys.exit(main())
