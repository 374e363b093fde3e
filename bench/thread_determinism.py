"""Do fresh processes at a fixed thread count end on one hash, under load? Per setting.

    .venv/bin/python -m bench.thread_determinism [--runs 50] [--steps 4] [--variants a,b]

Each run is a fresh `octlm train --config tiny` process of a few steps at the default intra-op
thread count (OMP_NUM_THREADS unset: one thread per core), a checkpoint after every step (so
the background writer runs beside the compute); every other run has the other core kept busy
by a spinning process. The variants run interleaved, one run each per round, so load and
drift fall on all alike. For each variant it prints how many runs ended on another weights
hash than that variant's most common one (mismatches), and the median step time relative to
`defaults` (paired by round). Then 1 against 2 threads, for the defaults and MKL's strict CNR
mode: do the two counts end on the same hash?

Known sources of run-to-run differences at a fixed thread count: MKL's dynamic adjustment
(MKL_DYNAMIC defaults to TRUE: under load MKL may use fewer threads than asked, which splits a
reduction differently) and its code-path choice and alignment (Conditional Numerical
Reproducibility, MKL_CBWR, is off by default). Each variant sets its variables explicitly, so
octlm's own pinning (octlm/numerics.py: an explicit environment wins) does not apply.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    # MKL's and OpenMP's own defaults, spelled out (so octlm's pinning stands aside).
    "defaults": ({"MKL_DYNAMIC": "TRUE", "OMP_DYNAMIC": "FALSE"}, ()),
    "dynamic-off": ({"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"}, ()),
    "cbwr-compatible": ({"MKL_DYNAMIC": "TRUE", "MKL_CBWR": "COMPATIBLE"}, ()),
    "cbwr-strict": ({"MKL_DYNAMIC": "TRUE", "MKL_CBWR": "AUTO,STRICT"}, ()),
    "deterministic": ({"MKL_DYNAMIC": "TRUE"}, ("--deterministic",)),
    "sync-writer": ({"MKL_DYNAMIC": "TRUE"}, ("--no-async-checkpoint",)),
}
PINNED_ENV = ("MKL_DYNAMIC", "OMP_DYNAMIC", "MKL_CBWR", "OMP_NUM_THREADS")


def run_once(
    data: Path, out: Path, steps: int, env_extra: dict[str, str], flags: tuple[str, ...]
) -> tuple[str, float]:
    """(end weights hash, median step seconds) of one fresh training process."""
    env = {k: v for k, v in os.environ.items() if k not in PINNED_ENV}
    env.update(env_extra)
    cmd = [sys.executable, "-m", "octlm", "train", "--config", "tiny", "--data", str(data),
           "--out", str(out), "--steps", str(steps), "--warmup", "1", "--micro-batch", "8",
           "--accum", "1", "--val-every", "0", "--ckpt-every", "1", "--keep-last", "1",
           "--no-progress", *flags]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    records = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    dts = [r["dt"] for r in records if r["type"] == "step"][1:]  # the first step warms up
    return records[-1]["weights_sha256"], statistics.median(dts)


def short(digests: set[str]) -> str:
    return " ".join(sorted(d[:12] for d in digests))


def spinner() -> subprocess.Popen:
    """A process that keeps one core busy."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50, help="fresh processes per variant")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--thread-runs", type=int, default=3, help="per count, in the 1-vs-2 part")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    names = args.variants.split(",")
    with tempfile.TemporaryDirectory(prefix="thread-det-") as tmp:
        root = Path(tmp)
        data = root / "data"
        subprocess.run([sys.executable, "-m", "octlm", "prepare", "--out", str(data),
                        "--vocab-size", "4096"], check=True, capture_output=True)  # fmt: skip
        hashes: dict[str, list[str]] = collections.defaultdict(list)
        times: dict[str, list[float]] = collections.defaultdict(list)
        for i in range(args.runs):
            loaded = i % 2 == 1
            for name in names:
                load = spinner() if loaded else None
                try:
                    env, flags = VARIANTS[name]
                    digest, dt = run_once(data, root / f"{name}-{i}", args.steps, env, flags)
                finally:
                    if load is not None:
                        load.kill()
                        load.wait()
                hashes[name].append(digest)
                times[name].append(dt)
            done = ", ".join(f"{n} {len(set(hashes[n]))}" for n in names)
            print(f"round {i + 1}/{args.runs} ({'loaded' if loaded else 'quiet'}): distinct "
                  f"hashes {done}", file=sys.stderr, flush=True)  # fmt: skip
        print(f"\n{args.runs} fresh processes per variant, {args.steps} tiny steps each, default "
              "threads, every other run with the other core busy\n")  # fmt: skip
        print("| variant | distinct hashes | mismatches | step ms (median) | time vs defaults |")
        print("|---|---:|---:|---:|---:|")
        for name in names:
            common = collections.Counter(hashes[name]).most_common(1)[0][1]
            ratio = "-"
            if name != "defaults" and "defaults" in names:
                pairs = zip(times[name], times["defaults"], strict=True)
                ratio = f"{statistics.median(a / b for a, b in pairs):.3f}"
            print(f"| {name} | {len(set(hashes[name]))} | {args.runs - common} | "
                  f"{1000 * statistics.median(times[name]):.1f} | {ratio} |")  # fmt: skip
        print("\n1 against 2 threads (quiet), same hash?\n")
        for name in ("defaults", "cbwr-strict"):
            env, flags = VARIANTS[name]
            got = {}
            for threads in ("1", "2"):
                got[threads] = {
                    run_once(
                        data,
                        root / f"t{threads}-{name}-{k}",
                        args.steps,
                        {**env, "OMP_NUM_THREADS": threads},
                        flags,
                    )[0]  # fmt: skip
                    for k in range(args.thread_runs)
                }
            same = got["1"] == got["2"] and len(got["1"]) == 1
            print(f"- {name}: 1 thread {short(got['1'])}, 2 threads {short(got['2'])}: "
                  f"{'same' if same else 'differ'}")  # fmt: skip


if __name__ == "__main__":
    main()
