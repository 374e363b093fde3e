"""A --data mixture's realised shares and its memory: the samples each dataset gave over 1,000
steps against the weights, and the memory the sampler holds after reading batches at step 1,000
and at step 1,000,000 (tracemalloc: what the Python heap holds, numpy's arrays included).

    .venv/bin/python -m bench.mixture_shares [--micro-batch 8] [--accum 1]

The datasets are in-memory streams (their content does not matter here: the draws depend on
their sizes, the weights, the seed and the sample number only).
"""

from __future__ import annotations

import argparse
import tracemalloc

import numpy as np

from octlm.data.mixture import MixtureSampler
from octlm.data.shards import TokenStream
from octlm.data.windows import StreamWindows

WEIGHTS = ([0.7, 0.3], [0.5, 0.3, 0.2], [0.9, 0.09, 0.01])


def sampler(weights: list[float], args: argparse.Namespace, order: str) -> MixtureSampler:
    sources = [
        StreamWindows(TokenStream([np.zeros(50_000 + 7_919 * i, np.uint16)]), 64, 65, f"fp{i}")
        for i in range(len(weights))
    ]
    names = [f"d{i}" for i in range(len(weights))]
    settings = {"micro_batch": args.micro_batch, "accum": args.accum, "order": order}
    return MixtureSampler(sources, names, weights, seed=1337, **settings)


def held_bytes(mix: MixtureSampler, steps: range) -> int:
    """The heap the sampler holds (beyond what it held before) after batches at `steps`."""
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for s in steps:
        mix.batch(s, 0)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=1)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    held_bytes(sampler(WEIGHTS[0], args, "random"), range(2))  # first-call caches, not counted
    print("| weights | order | realised shares over 1,000 steps | largest gap | held after "
          "step 1,000 | held after step 1,000,000 |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|")
    for weights in WEIGHTS:
        for order in ("random", "epoch"):
            mix = sampler(weights, args, order)
            drawn = np.concatenate([mix.draws(mix.samples(s, 0))[0] for s in range(1000)])
            shares = np.bincount(drawn, minlength=len(weights)) / len(drawn)
            gap = float(np.max(np.abs(shares - np.array(weights) / sum(weights))))
            early = held_bytes(sampler(weights, args, order), range(990, 1000))
            late = held_bytes(sampler(weights, args, order), range(999_990, 1_000_000))
            cells = ", ".join(f"{x:.4f}" for x in shares)
            print(f"| {weights} | {order} | {cells} | {gap:.2%} | {early:,} B | {late:,} B |")


if __name__ == "__main__":
    main()
