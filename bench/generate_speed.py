"""What the key/value cache buys `octlm generate` on this CPU: new tokens per second, cached
against uncached, for one prompt; then a batch of prompts decoded together against the same
prompts one at a time (both cached), as `--prompts FILE` does.

    .venv/bin/python -m bench.generate_speed [--preset tiny] [--new 512] [--rounds 3] [--batch 8]

The model is the preset's shape with its context raised to hold prompt + new tokens (so the
uncached path runs its full forward over the growing sequence, and the cached one never has to
slide the window), from its init: speed does not depend on the weights. Greedy decoding of a
16-token prompt. Each round times the two paths back to back, alternating which goes first;
the result is each path's median and the median of the per-round ratios. The two paths' tokens
are compared too (a random model's near-ties may swap a token: reported, not asserted).
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


def timed_generate(model: GPT, prompt: list[int], new: int, cache: bool) -> tuple[float, list]:
    t0 = time.perf_counter()
    out = generate(model, prompt, new, cache=cache)
    return time.perf_counter() - t0, out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--new", type=int, default=512, help="new tokens per generation")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="prompts in the batched part")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    context = max(PRESETS[args.preset].context, PROMPT_LEN + args.new)
    torch.manual_seed(0)
    model = GPT(preset(args.preset, context=context)).eval()
    prompt = torch.randint(0, model.config.vocab_size, (PROMPT_LEN,)).tolist()
    generate(model, prompt, 8)  # warm the allocator and kernels for both paths
    generate(model, prompt, 8, cache=False)
    times: dict[bool, list[float]] = {True: [], False: []}
    same = True
    for r in range(args.rounds):
        outs = {}
        for cache in (True, False) if r % 2 == 0 else (False, True):
            seconds, outs[cache] = timed_generate(model, prompt, args.new, cache)
            times[cache].append(seconds)
        same = same and outs[True] == outs[False]
    ratios = [u / c for c, u in zip(times[True], times[False], strict=True)]
    params, threads = model.num_params() / 1e6, torch.get_num_threads()
    print(f"{args.preset} ({params:.2f}M parameters), context {context}, threads {threads}")
    print(f"{args.new} new tokens after a {PROMPT_LEN}-token prompt, {args.rounds} rounds")
    for cache, name in ((True, "cached"), (False, "uncached")):
        median = statistics.median(times[cache])
        print(f"  {name:9s} {median:8.2f} s  {args.new / median:8.1f} tokens/s")
    print(f"  speed-up  {statistics.median(ratios):8.1f}x (median of per-round ratios {ratios})")
    print(f"  same tokens: {same}")
    batched(model, args)


def batched(model: GPT, args: argparse.Namespace) -> None:
    """`args.batch` prompts of 8..16 tokens, `args.new` tokens each: one batch against a loop."""
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, PROMPT_LEN + 1, (args.batch,), generator=gen).tolist()
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    times: dict[str, list[float]] = {"batch": [], "loop": []}
    for r in range(args.rounds):
        for name in ("batch", "loop") if r % 2 == 0 else ("loop", "batch"):
            t0 = time.perf_counter()
            if name == "batch":
                generate_batch(model, prompts, args.new)
            else:
                for prompt in prompts:
                    generate(model, prompt, args.new)
            times[name].append(time.perf_counter() - t0)
    total = args.batch * args.new
    print(f"{args.batch} prompts of 8..{PROMPT_LEN} tokens, {args.new} new tokens each")
    for name in ("batch", "loop"):
        median = statistics.median(times[name])
        print(f"  {name:9s} {median:8.2f} s  {total / median:8.1f} tokens/s")
    ratios = [loop / b for b, loop in zip(times["batch"], times["loop"], strict=True)]
    print(f"  speed-up  {statistics.median(ratios):8.1f}x (median of per-round ratios)")


if __name__ == "__main__":
    main()
