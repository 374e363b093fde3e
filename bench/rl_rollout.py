"""What an RL step's rollouts cost on this CPU: G replies to one prompt sampled as `octlm rl`
samples them (one cached batch, a generator per reply), against the same replies sampled one
at a time without the cache; and, from a finished RL run's log, each step's time split into
the rollouts and the update.

    .venv/bin/python -m bench.rl_rollout [--preset tiny] [--samples 8] [--new 32] [--rounds 5]
    .venv/bin/python -m bench.rl_rollout --log runs/rl    # the split of a run's steps

The model is the preset's shape from its init (speed does not depend on the weights), a
24-token prompt, temperature 1 and the reply seeds of step 0, prompt 0; no reply stops early
(no stop id), so every path samples G x `--new` tokens. Each round times the two paths back to
back, alternating which goes first; the result is each path's median tokens per second and
the median of the per-round ratios. The two paths' replies are compared (they must be equal:
the cache is only a speed-up).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from octlm.config.shape import PRESETS, preset
from octlm.generation.sampling import generate, generate_batch
from octlm.model.gpt import GPT
from octlm.rl.rollout import reply_seed
from octlm.runlog.reader import read_log

PROMPT_LEN = 24


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--samples", type=int, default=8, help="G: replies to the prompt")
    parser.add_argument("--new", type=int, default=32, help="tokens per reply")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--log", help="an RL run folder: print its steps' rollout/update split")
    return parser


def cached(model: GPT, prompt: list[int], seeds: list[int], new: int) -> list[list[int]]:
    return generate_batch(model, [prompt] * len(seeds), new, temperature=1.0, seeds=seeds)


def uncached(model: GPT, prompt: list[int], seeds: list[int], new: int) -> list[list[int]]:
    return [generate(model, prompt, new, temperature=1.0, seed=s, cache=False) for s in seeds]


def speed(args: argparse.Namespace) -> None:
    context = max(PRESETS[args.preset].context, PROMPT_LEN + args.new)
    torch.manual_seed(0)
    model = GPT(preset(args.preset, context=context)).eval()
    prompt = torch.randint(0, model.config.vocab_size, (PROMPT_LEN,)).tolist()
    seeds = [reply_seed(0, 0, 0, j) for j in range(args.samples)]
    paths = {"cached batch": cached, "uncached, one by one": uncached}
    for path in paths.values():  # warm the allocator and kernels
        path(model, prompt, seeds[:2], 4)
    times: dict[str, list[float]] = {name: [] for name in paths}
    same = True
    for r in range(args.rounds):
        outs = {}
        for name in list(paths) if r % 2 == 0 else list(paths)[::-1]:
            t0 = time.perf_counter()
            outs[name] = paths[name](model, prompt, seeds, args.new)
            times[name].append(time.perf_counter() - t0)
        same = same and outs["cached batch"] == outs["uncached, one by one"]
    tokens = args.samples * args.new
    params, threads = model.num_params() / 1e6, torch.get_num_threads()
    print(f"{args.preset} ({params:.2f}M parameters), threads {threads}; G={args.samples} replies")
    print(f"of {args.new} tokens after a {PROMPT_LEN}-token prompt, {args.rounds} rounds")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"  {name:22s} {median:8.3f} s  {tokens / median:9.1f} sampled tokens/s")
    ratios = [u / c for c, u in zip(*times.values(), strict=True)]
    print(f"  speed-up {statistics.median(ratios):.2f}x (median of per-round ratios)")
    print(f"  same replies: {same}")


def split(folder: str) -> None:
    steps = [r for r in read_log(folder) if r.get("type") == "step" and "rollout_s" in r]
    if not steps:
        raise SystemExit(f"{folder}: no RL step records")
    rollout = statistics.median(r["rollout_s"] for r in steps)
    update = statistics.median(r["update_s"] for r in steps)
    speed_ = statistics.median(r["tok_per_s"] for r in steps)
    total = rollout + update
    print(f"{folder}: {len(steps)} steps; median step {total:.3f} s = rollouts {rollout:.3f} s")
    print(f"  ({rollout / total:.0%}) + update {update:.3f} s ({update / total:.0%});")
    print(f"  rollouts sample {speed_:.0f} tokens/s (median)")


def main() -> None:
    args = build_parser().parse_args()
    if args.log:
        split(args.log)
        return
    speed(args)


if __name__ == "__main__":
    main()
