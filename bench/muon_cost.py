"""What Muon's optimizer step costs beside a training step, at the `small` shape on this CPU.

    .venv/bin/python -m bench.muon_cost [--rounds 7]

Two settings of the `small` model (6 layers, width 384, GQA 6/2, SwiGLU 1024):
- `bench`: the shape bench/quality.py trains (vocabulary 4096, 8 sequences of 256 tokens, no
  accumulation): the regime where quality per second is judged on 2 cores.
- `small`: the shipped `small` preset and config (vocabulary 32768, 16 x 1024 tokens per
  micro-batch, 32 micro-batches per step); one micro-batch is timed and the step's forward and
  backward counted as 32 of them (each takes the same work).
Each round times, interleaved on the same gradients: one micro-batch's forward and backward,
AdamW's step (fused, as a run uses it), MuonAdamW's step with Muon's defaults (five float32
Newton-Schulz iterations) and with `--config recipe`'s Muon settings (three iterations through
the Gram matrix, products in bf16 where the CPU multiplies it fast). The result is each one's
median over rounds, and each optimizer's share of a whole step: opt / (accum x fwd+bwd + opt).
"""

from __future__ import annotations

import argparse
import statistics
import time
import tomllib

import torch

from bench.common import optimizer_for
from octlm.config.files import SHIPPED_CONFIGS
from octlm.config.shape import preset
from octlm.config.train import TrainConfig
from octlm.model.gpt import GPT

RECIPE_MUON_KEYS = ("muon_lr", "muon_momentum", "muon_ns_steps", "muon_gram", "muon_ns_dtype")
OPTIMIZERS = ("adamw", "muon", "recipe")


def recipe_muon() -> dict:
    """The Muon keys `--config recipe` sets (the others keep their defaults)."""
    recipe = tomllib.loads((SHIPPED_CONFIGS / "recipe.toml").read_text())
    return {k: recipe[k] for k in RECIPE_MUON_KEYS if k in recipe}


SETTINGS = {
    # name: (vocabulary, micro_batch, context, accum)
    "bench": (4096, 8, 256, 1),
    "small": (32768, 16, 1024, 32),
}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(name: str, rounds: int) -> dict[str, float]:
    vocab, micro, context, accum = SETTINGS[name]
    torch.manual_seed(0)
    model = GPT(preset("small", vocab_size=vocab, context=context))
    cfg = TrainConfig(model="small", context=context, micro_batch=micro, accum=accum)
    optimizers = {
        "adamw": optimizer_for(model, cfg),
        "muon": optimizer_for(model, cfg.replace(optimizer="muon")),
        "recipe": optimizer_for(model, cfg.replace(optimizer="muon", **recipe_muon())),
    }
    x = torch.randint(0, vocab, (micro, context))

    def fwd_bwd() -> None:
        model.zero_grad(set_to_none=True)
        loss_sum, n = model(x, x.roll(-1, dims=1))
        (loss_sum / n).backward()

    times: dict[str, list[float]] = {"fwd_bwd": [], **{kind: [] for kind in OPTIMIZERS}}
    for r in range(rounds + 1):  # the first round warms allocators and states up
        t = timed(fwd_bwd)
        # The grads stay: both optimizers step on the same ones (the weights drift, the cost
        # does not), in an order that alternates between rounds.
        order = OPTIMIZERS if r % 2 else OPTIMIZERS[::-1]
        step = {kind: timed(optimizers[kind].step) for kind in order}
        if r:
            times["fwd_bwd"].append(t)
            for kind in order:
                times[kind].append(step[kind])
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    step_ms = accum * med["fwd_bwd"]
    for kind in OPTIMIZERS:
        med[f"{kind}_share"] = med[kind] / (step_ms + med[kind])
    return med


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    return parser


def main() -> None:
    args = build_parser().parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {args.rounds}")
    print(f"recipe: {recipe_muon()}")
    columns = "".join(f" {kind + ' ms':>10} {kind + ' share':>13}" for kind in OPTIMIZERS)
    print(f"{'setting':8} {'fwd+bwd ms':>11} {'x accum':>8}{columns}")
    for name in args.settings:
        m = measure(name, args.rounds)
        accum = SETTINGS[name][3]
        print(
            f"{name:8} {m['fwd_bwd']:11.1f} {accum:8d}"
            + "".join(f" {m[kind]:10.1f} {m[kind + '_share']:13.1%}" for kind in OPTIMIZERS)
        )


if __name__ == "__main__":
    main()
