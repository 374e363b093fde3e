"""What the exact inference path (`octlm/model/exact.py`) costs the KV-cache decode on this CPU:
new tokens per second, exact against plain, at batch 1 (`generate`) and batch B
(`generate_batch`), for each preset asked, fp32.

    .venv/bin/python -m bench.invariant_decode [--presets tiny small] [--new 64] [--rounds 5]

The model is the preset's shape from its init (speed does not depend on the weights); greedy
decoding after prompts of 16 tokens. Each round times the two paths back to back, alternating
which goes first; the result is each path's median and the median of the per-round ratios
(exact time / plain time: the cost factor). The decode alone: a round times each path's call
for 1 new token (the prompt's prefill and the first token) and for `--new` tokens, and the
decode's tokens/s is (new - 1) x batch over the difference; the prefill's factor is printed
beside it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from octlm.config.shape import PRESETS, preset
from octlm.generation.sampling import generate, generate_batch
from octlm.model.gpt import GPT

PROMPT_LEN = 16


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=sorted(PRESETS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--new", type=int, default=64, help="new tokens per row")
    parser.add_argument("--rounds", type=int, default=5)
    return parser


def decode(model: GPT, prompts: list[list[int]], new: int, exact: bool) -> float:
    t0 = time.perf_counter()
    if len(prompts) == 1:
        generate(model, prompts[0], new, exact=exact)
    else:
        generate_batch(model, prompts, new, exact=exact)
    return time.perf_counter() - t0


def main() -> None:
    args = build_parser().parse_args()
    print(f"threads {torch.get_num_threads()}, {args.new} new tokens per row, greedy, fp32")
    print("preset  batch  plain tok/s  exact tok/s  exact/plain time (median of rounds)")
    for name in args.presets:
        torch.manual_seed(0)
        model = GPT(preset(name)).eval()
        vocab = model.config.vocab_size
        for batch in args.batches:
            prompts = [torch.randint(0, vocab, (PROMPT_LEN,)).tolist() for _ in range(batch)]
            decode(model, prompts, 4, True)  # warm both paths
            decode(model, prompts, 4, False)
            times: dict[bool, list[float]] = {True: [], False: []}
            firsts: dict[bool, list[float]] = {True: [], False: []}
            for r in range(args.rounds):
                for exact in (True, False) if r % 2 == 0 else (False, True):
                    first = decode(model, prompts, 1, exact)
                    firsts[exact].append(first)
                    times[exact].append(decode(model, prompts, args.new, exact) - first)
            ratios = [e / p for e, p in zip(times[True], times[False], strict=True)]
            prefill = [e / p for e, p in zip(firsts[True], firsts[False], strict=True)]
            total = batch * (args.new - 1)
            plain, exact = (total / statistics.median(times[k]) for k in (False, True))
            print(
                f"{name:7s} {batch:5d}  {plain:11.1f}  {exact:11.1f}  "
                f"{statistics.median(ratios):.2f}x {[round(x, 2) for x in ratios]}  "
                f"prefill {statistics.median(prefill):.2f}x"
            )


if __name__ == "__main__":
    main()
