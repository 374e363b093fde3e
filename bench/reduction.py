"""What the tree reduction costs: step time against DDP's and FSDP2's own sums, side by side.

    .venv/bin/python -m bench.reduction [--rounds 5] [--steps 10] [--model small]

Each round runs `octlm train --nproc 2` four times, interleaved: DDP and FSDP2, each with
`--reduction collective` and `--reduction tree`, on the same config (one thread per worker,
as the launcher gives), and takes the median step time of each run (the first step, which
warms up, left out). Printed: every round, the median paired ratio tree / collective per
wrapper, the bytes each rank sends per step, and the partial sums the fold holds at
accumulation 1, 4 and 16 (`--memory-only` prints just those).

    .venv/bin/python -m bench.reduction --layouts 1x8,2x4,4x2,8x1 [--parallel fsdp]

instead trains `tiny` (dropout 0.1, 6 steps) as each processes x accumulation layout of one
global batch and prints each run's weights hash and whether every logged loss and gradient
norm equals the first layout's (more processes than the test suite starts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

if not __package__:  # run as `python bench/reduction.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octlm.trainer.fold import FoldStack

MODES = [(p, r) for p in ("ddp", "fsdp") for r in ("collective", "tree")]


def step_times(args: argparse.Namespace, parallel: str, reduction: str) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "octlm", "train", "--model", args.model, "--nproc", "2"]
        cmd += ["--steps", str(args.steps), "--warmup", "2", "--val-every", "0"]
        cmd += ["--ckpt-every", "0", "--no-progress", "--dtype", "fp32", "--out", str(out)]
        cmd += ["--context", str(args.context), "--micro-batch", str(args.micro_batch)]
        cmd += ["--accum", str(args.accum), "--parallel", parallel, "--reduction", reduction]
        cmd += ["--data", args.data] if args.data else []
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        lines = (out / "log.jsonl").read_text().splitlines()
    elapsed = [r["elapsed"] for r in map(json.loads, lines) if r["type"] == "step"]
    return [b - a for a, b in zip(elapsed[1:], elapsed[2:], strict=False)]


def bytes_per_step(params: int, world: int, accum: int) -> dict[str, float]:
    """Bytes one rank sends per step (fp32 gradients). A ring all-reduce sends 2(W-1)/W of the
    gradient; the tree sends (W-1)/W per micro-batch (all_to_all) plus (W-1)/W (all_gather,
    DDP layout; FSDP2 keeps the shards); FSDP2's reduce-scatter sends (W-1)/W per step."""
    g, share = 4 * params, (world - 1) / world
    return {
        "ddp collective": 2 * share * g,
        "ddp tree": (accum + 1) * share * g,
        "fsdp collective (reduce-scatter)": share * g,
        "fsdp tree": accum * share * g,
    }


def peak_partial_sums(accum: int) -> int:
    """The most partial sums the fold holds at once over `accum` pushes, the incoming one
    included: the extra gradient buffers beside the one a backward writes."""
    stack: FoldStack[int] = FoldStack(lambda a, b: a + b)
    peak = 0
    for _ in range(accum):
        stack.parts.append((0, 0))  # the incoming gradient, before it merges
        peak = max(peak, stack.depth)
        stack.parts.pop()
        stack.push(1)
    return peak


def layout_run(args: argparse.Namespace, layout: str) -> tuple[str, list]:
    """(weights hash, [(step, loss, grad_norm)]) of `tiny` trained as `layout` ("PxA")."""
    procs, accum = layout.split("x")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "octlm", "train", "--model", "tiny", "--nproc", procs]
        cmd += ["--accum", accum, "--steps", "6", "--warmup", "2", "--dropout", "0.1"]
        cmd += ["--context", "32", "--micro-batch", "2", "--val-every", "3", "--dtype", "fp32"]
        cmd += ["--ckpt-every", "0", "--no-progress", "--out", str(out)]
        cmd += ["--parallel", args.parallel] + (["--data", args.data] if args.data else [])
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        records = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    steps = [(r["step"], r["loss"], r["grad_norm"]) for r in records if r["type"] == "step"]
    end = next(r for r in records if r["type"] == "end")
    return end["weights_sha256"], steps


def compare_layouts(args: argparse.Namespace) -> None:
    first = None
    for layout in args.layouts.split(","):
        digest, steps = layout_run(args, layout)
        first = first or (digest, steps)
        same = "identical" if (digest, steps) == first else "DIFFERENT"
        print(f"{layout}: weights {digest[:16]}, losses and norms {same} to the first")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--model", default="small")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--data", default=None, help="a prepared dataset (default: the embedded)")
    ap.add_argument("--memory-only", action="store_true")
    ap.add_argument("--layouts", default=None, help="PxA,... : compare layouts' bits instead")
    ap.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"])
    return ap


def main() -> None:
    args = build_parser().parse_args()
    if args.layouts:
        compare_layouts(args)
        return
    for accum in (1, 4, 16):
        print(f"accumulation {accum}: at most {peak_partial_sums(accum)} partial sums held")
    if args.memory_only:
        return
    from octlm.config.shape import preset
    from octlm.model.gpt import GPT

    with torch.device("meta"):
        params = GPT(preset(args.model, vocab_size=4096, context=args.context)).num_params()
    for name, n in bytes_per_step(params, 2, args.accum).items():
        print(f"bytes sent per rank per step, {name}: {n / 1e6:.1f} MB")
    ratios: dict[str, list[float]] = {"ddp": [], "fsdp": []}
    for r in range(args.rounds):
        medians = {mode: statistics.median(step_times(args, *mode)) for mode in MODES}
        line = ", ".join(f"{p} {red} {t * 1e3:.0f} ms" for (p, red), t in medians.items())
        for p in ratios:
            ratios[p].append(medians[(p, "tree")] / medians[(p, "collective")])
        print(f"round {r}: {line}", flush=True)
    for p, rs in ratios.items():
        print(f"{p}: tree / collective step time, median paired ratio {statistics.median(rs):.4f}")


if __name__ == "__main__":
    main()
