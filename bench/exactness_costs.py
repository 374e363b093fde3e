"""What exactness costs: hashing the weights, and --deterministic, measured side by side.

    .venv/bin/python -m bench.exactness_costs [--rounds 5] [--steps 12]

1. `weights_sha256` time for the tiny, small and main presets (random init), against the
   measured time of one tiny training step: the price of a `hash` record in the log.
2. `octlm train` with and without `--deterministic`, interleaved round by round on the same
   config: the median paired ratio of per-step times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from octlm.config.shape import preset
from octlm.hashing import weights_sha256
from octlm.model.gpt import GPT

if not __package__:  # run as `python bench/exactness_costs.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import bench_config
from bench.loop_overhead import octlm_step_times


def hash_seconds(name: str, repeats: int = 3) -> tuple[float, int]:
    with torch.device("cpu"):
        model = GPT(preset(name, vocab_size=4096 if name == "tiny" else 32768))
    sd = model.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        weights_sha256(sd)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), nbytes


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    cfg = bench_config(base="tiny", steps=args.steps + 2)
    print(f"threads {torch.get_num_threads()}")
    ratios, step_times = [], []
    for r in range(args.rounds):
        plain = statistics.median(octlm_step_times(cfg))
        det = statistics.median(octlm_step_times(cfg.replace(deterministic=True)))
        step_times.append(plain)
        ratios.append(det / plain)
        print(
            f"round {r}: step {plain * 1e3:.1f} ms, deterministic {det * 1e3:.1f} ms, "
            f"ratio {det / plain:.4f}"
        )
    print(f"--deterministic on CPU: median paired time ratio {statistics.median(ratios):.4f}")
    step = statistics.median(step_times)
    for name in ("tiny", "small", "main"):
        seconds, nbytes = hash_seconds(name)
        print(
            f"weights_sha256 {name}: {seconds * 1e3:.1f} ms for {nbytes / 1e6:.1f} MB "
            f"({nbytes / seconds / 1e9:.2f} GB/s); {seconds / step:.3f} tiny-step times"
        )


if __name__ == "__main__":
    main()
