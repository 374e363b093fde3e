"""What octlm's loop costs over a bare forward/backward/clip/step loop, measured side by side.

    .venv/bin/python bench/loop_overhead.py [--model tiny] [--rounds 5] [--steps 12]

Each round runs `octlm train` (in-process, real shards, logging on, no validation or periodic
checkpoints) and then a bare loop on the same model shape and batch size, interleaved so both
see the same machine noise. Per-step time of octlm is the gap between consecutive `elapsed`
values in its log (everything the loop does between steps); the bare loop reuses one fixed
batch. It prints per-round medians and the median of the paired ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from octlm.config.shape import preset
from octlm.config.train import TrainConfig
from octlm.model.gpt import GPT
from octlm.runlog.reader import read_log
from octlm.trainer.inputs import resolve_data
from octlm.trainer.loop import train

if not __package__:  # run as `python bench/loop_overhead.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import bench_config, optimizer_for


def octlm_step_times(cfg: TrainConfig) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg.replace(out=str(Path(tmp) / "run")))
        records = read_log(Path(tmp) / "run")
    elapsed = [r["elapsed"] for r in records if r["type"] == "step"]
    return [b - a for a, b in zip(elapsed[1:], elapsed[2:], strict=False)]  # skip warm-up step


def bare_step_times(cfg: TrainConfig, vocab_size: int, steps: int) -> list[float]:
    keys = cfg.to_dict()  # flat keys, whatever sections the config class groups them in
    torch.manual_seed(keys["seed"])
    context, accum = keys["context"], keys["accum"]
    model = GPT(preset(keys["model"], vocab_size=vocab_size, context=context))
    opt = optimizer_for(model, cfg)
    x = torch.randint(0, vocab_size, (keys["micro_batch"], context))
    y = torch.randint(0, vocab_size, (keys["micro_batch"], context))
    n = accum * x.numel()
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        for _ in range(accum):
            loss_sum, _ = model(x, y)
            (loss_sum / n).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), keys["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_sum.item()
        times.append(time.perf_counter() - t0)
    return times[1:]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--context", type=int, default=128)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    cfg = bench_config(
        args.model,
        steps=args.steps + 2,
        context=args.context,
        micro_batch=args.micro_batch,
        accum=args.accum,
        dtype="fp32",
        lr=1e-3,
    )
    manifest = resolve_data(cfg) / "manifest.json"
    vocab = json.loads(manifest.read_text())["tokenizer"]["vocab_size"]
    tokens = args.micro_batch * args.accum * args.context
    print(f"model {args.model}, {tokens} tokens/step, threads {torch.get_num_threads()}")
    ratios = []
    for r in range(args.rounds):
        a = statistics.median(octlm_step_times(cfg))
        b = statistics.median(bare_step_times(cfg, vocab, args.steps))
        ratios.append(a / b)
        print(
            f"round {r}: octlm {tokens / a:,.0f} tok/s  bare {tokens / b:,.0f} tok/s  "
            f"octlm/bare time {a / b:.4f}"
        )
    med = statistics.median(ratios)
    print(
        f"median paired ratio (octlm step time / bare step time): {med:.4f} "
        f"-> loop overhead {100 * (med - 1):+.2f}%"
    )


if __name__ == "__main__":
    main()
