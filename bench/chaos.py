"""Chaos test: SIGKILL a training run at random moments, resume it each time, compare bits.

    .venv/bin/python bench/chaos.py --kills 50 [--config tiny] [--steps N]

Runs the config straight through once for reference. Then runs it again in a subprocess and
kills it with SIGKILL after a random delay, over and over, each time re-running the same
`octlm train ... --resume` command, until `--kills` kills have landed; then lets it finish.
Runs are launched with `octlm.tools.subrun`: the config and the flags given here are written
once into one TOML file that every run reads.
Saves are slowed by the OCTLM_CHAOS_SAVE_PAUSE fault-injection point so that some kills land
in the middle of a checkpoint write. Prints kills survived, kills during a save, steps redone,
and whether the final weights_sha256 equals the straight run's (exit 0 only if identical).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from octlm.config.files import make_config
from octlm.runlog.reader import read_log
from octlm.tools import subrun


def end_hash(out: Path) -> str | None:
    ends = [r for r in read_log(out) if r["type"] == "end"] if (out / "log.jsonl").exists() else []
    return ends[-1]["weights_sha256"] if ends else None


def straight_reference(config: Path, root: Path, t0: float, *flags: str) -> str | None:
    """The straight run's weights hash (ROOT/straight), printed; None when that run failed."""
    error = subrun.train(config, root / "straight", *flags)
    if error is not None:
        print(f"straight run failed: {error}")
        return None
    reference = end_hash(root / "straight")
    print(f"straight run: weights_sha256 {reference}  ({time.time() - t0:.0f} s)", flush=True)
    return reference


def last_logged_step(out: Path) -> int:
    if not (out / "log.jsonl").exists():
        return -1
    # read_log skips a line cut short by the kill
    return max([-1] + [r["step"] for r in read_log(out) if r["type"] == "step"])


def checkpoint_step(out: Path) -> int:
    latest = out / "checkpoints" / "latest.json"
    if not latest.exists():
        return 0
    return json.loads(latest.read_text())["checkpoints"][-1]["step"]


def unlisted(out: Path) -> set[str]:
    """Checkpoint files renamed into place but not yet listed: a kill between the two."""
    folder = out / "checkpoints"
    if not (folder / "latest.json").exists():
        return set()
    listed = {e["file"] for e in json.loads((folder / "latest.json").read_text())["checkpoints"]}
    return {p.name for p in folder.glob("step_*.safetensors")} - listed


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--data", default=None)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--save-pause", type=float, default=0.15, help="seconds, per save, twice")
    ap.add_argument("--min-delay", type=float, default=0.5)
    ap.add_argument("--max-delay", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0, help="seeds the kill times")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the runs (default: delete them)")
    return ap


def main() -> int:
    args = build_parser().parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="octlm-chaos-", dir=args.workdir))

    t0 = time.time()
    cfg = make_config(args.config, steps=args.steps, data=args.data, ckpt_every=args.ckpt_every)
    config = subrun.write_config(cfg, root / "config.toml")
    reference = straight_reference(config, root, t0)
    if reference is None:
        return 2

    out = root / "chaos"
    env = {**os.environ, "OCTLM_CHAOS_SAVE_PAUSE": str(args.save_pause)}
    kills = during_save = redone = restarts = 0
    while True:
        restarts += 1
        orphans_before = unlisted(out)
        proc = subprocess.Popen(
            subrun.train_argv(config, out, "--resume"),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if kills < args.kills:
            try:
                proc.wait(timeout=rng.uniform(args.min_delay, args.max_delay))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                kills += 1
                orphans = unlisted(out) - orphans_before
                during_save += bool(list((out / "checkpoints").glob(".*.tmp-*")) or orphans)
                redone += max(0, last_logged_step(out) + 1 - checkpoint_step(out))
                continue
        else:
            proc.wait()
        err = proc.stderr.read().decode() if proc.stderr else ""
        if proc.returncode != 0:
            print(f"run failed (exit {proc.returncode}): {subrun.last_line(err)}")
            return 2
        if end_hash(out) is not None:
            break
    print(
        f"kills survived: {kills} ({during_save} with a checkpoint write in progress), "
        f"restarts: {restarts}, steps redone: {redone}"
    )
    return verdict(out, reference, t0, root, args.keep)


def verdict(out: Path, reference: str | None, t0: float, root: Path, keep: bool) -> int:
    """Print the chaos run's hash against the straight one's; 0 only if identical."""
    final = end_hash(out)
    same = final == reference
    print(f"chaos run:    weights_sha256 {final}")
    print("identical" if same else "NOT identical")
    print(f"total {time.time() - t0:.0f} s" + (f"; runs kept in {root}" if keep else ""))
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
