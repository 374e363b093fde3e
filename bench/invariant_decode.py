"""What the exact inference path (`octlm/model/exact.py`) costs the KV-cache decode on this CPU:
new tokens per second, exact against plain, at batch 1 (`generate`) and batch B
(`generate_batch`), for each preset asked, fp32.

    .venv/bin/python -m bench.invariant_decode [--presets tiny small] [--new 64] [--rounds 5]
        [--kernels 1 2] [--fresh]

The model is the preset's shape from its init (speed does not depend on the weights); greedy
decoding after prompts of 16 tokens. Each round times the plain path and the exact path with
each product kernel asked (`octlm/model/exact_products.py`) back to back, the order rotating
from round to round; the result is each path's median and the median of the per-round ratios
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

from octlm.config.rl import EXACT_KERNEL, EXACT_KERNELS
from octlm.config.shape import PRESETS, preset
from octlm.generation.sampling import generate, generate_batch
from octlm.model.exact_kept import keep_packed
from octlm.model.gpt import GPT

PROMPT_LEN = 16
PLAIN = 0
"""The plain path's key among the kernels timed."""


MIN_NEW = 8


def decode_length(text: str) -> int:
    """`--new`: an integer of at least MIN_NEW. Under it, the decode's time (a call for `new`
    tokens less a call for one) is a few milliseconds, within a loaded machine's jitter, and it
    came out negative on the 2-core machine under the test suite."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < MIN_NEW:
        raise argparse.ArgumentTypeError(f"{value} is under {MIN_NEW}: ask for more new tokens")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=sorted(PRESETS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument(
        "--new", type=decode_length, default=64,
        help=f"new tokens per row (at least {MIN_NEW}: the decode is timed as the difference of "
        "two calls, which a shorter one leaves inside the machine's noise)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--kernels", nargs="+", type=int, default=[EXACT_KERNEL], choices=EXACT_KERNELS
    )
    parser.add_argument(
        "--fresh", action="store_true",
        help="pack the exact path's weights afresh each call (a model not kept: a GPT of your "
        "own; `load_model`, so every CLI, keeps them)",
    )  # fmt: skip
    return parser


def decode(model: GPT, prompts: list[list[int]], new: int, kernel: int) -> float:
    """Seconds to decode `new` tokens per prompt on the plain path (kernel `PLAIN`) or the
    exact path with product kernel `kernel`."""
    how = {"exact": kernel != PLAIN, "kernel": kernel or EXACT_KERNEL}
    t0 = time.perf_counter()
    if len(prompts) == 1:
        generate(model, prompts[0], new, **how)
    else:
        generate_batch(model, prompts, new, **how)
    return time.perf_counter() - t0


def timed(model: GPT, prompts: list[list[int]], args: argparse.Namespace) -> dict[int, tuple]:
    """Per path (`PLAIN` and each kernel): the decode's times and the first tokens' times, one
    of each per round, the paths' order rotated each round."""
    paths = [PLAIN, *args.kernels]
    for path in paths:
        decode(model, prompts, 4, path)  # warm each
    times: dict[int, list[float]] = {k: [] for k in paths}
    firsts: dict[int, list[float]] = {k: [] for k in paths}
    for r in range(args.rounds):
        for path in paths[r % len(paths) :] + paths[: r % len(paths)]:
            first = decode(model, prompts, 1, path)
            firsts[path].append(first)
            times[path].append(decode(model, prompts, args.new, path) - first)
    return {k: (times[k], firsts[k]) for k in paths}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    packing = "packed afresh each call" if args.fresh else "packings kept"
    threads = torch.get_num_threads()
    print(f"threads {threads}, {args.new} new tokens per row, greedy, fp32, {packing}")
    print("preset  batch  kernel  plain tok/s  exact tok/s  exact/plain time (median of rounds)")
    for name in args.presets:
        torch.manual_seed(0)
        model = GPT(preset(name)).eval()
        if not args.fresh:
            keep_packed(model)  # as `load_model` does
        vocab = model.config.vocab_size
        for batch in args.batches:
            prompts = [torch.randint(0, vocab, (PROMPT_LEN,)).tolist() for _ in range(batch)]
            runs = timed(model, prompts, args)
            plain_times, plain_firsts = runs[PLAIN]
            total = batch * (args.new - 1)
            plain = total / statistics.median(plain_times)
            for kernel in args.kernels:
                times, firsts = runs[kernel]
                ratios = [e / p for e, p in zip(times, plain_times, strict=True)]
                prefill = [e / p for e, p in zip(firsts, plain_firsts, strict=True)]
                print(
                    f"{name:7s} {batch:5d}  {kernel:6d}  {plain:11.1f}  "
                    f"{total / statistics.median(times):11.1f}  "
                    f"{statistics.median(ratios):.2f}x {[round(x, 2) for x in ratios]}  "
                    f"prefill {statistics.median(prefill):.2f}x"
                )


if __name__ == "__main__":
    main()
