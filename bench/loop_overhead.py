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
import tempfile
import time
from pathlib import Path

import torch

from octlm.config.files import make_config
from octlm.config.shape import preset
from octlm.model.gpt import GPT
from octlm.runlog import read_log
from octlm.trainer.inputs import resolve_data
from octlm.trainer.loop import train
from octlm.trainer.optim import build_optimizer


def octlm_step_times(cfg) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg.replace(out=str(Path(tmp) / "run")))
        records = read_log(Path(tmp) / "run")
    elapsed = [r["elapsed"] for r in records if r["type"] == "step"]
    return [b - a for a, b in zip(elapsed[1:], elapsed[2:], strict=False)]  # skip warm-up step


def bare_step_times(cfg, vocab_size: int, steps: int) -> list[float]:
    torch.manual_seed(cfg.seed)
    model = GPT(preset(cfg.model, vocab_size=vocab_size, context=cfg.context))
    opt = build_optimizer(model, cfg)
    x = torch.randint(0, vocab_size, (cfg.micro_batch, cfg.context))
    y = torch.randint(0, vocab_size, (cfg.micro_batch, cfg.context))
    n = cfg.accum * x.numel()
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        for _ in range(cfg.accum):
            loss_sum, _ = model(x, y)
            (loss_sum / n).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_sum.item()
        times.append(time.perf_counter() - t0)
    return times[1:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--context", type=int, default=128)
    args = ap.parse_args()
    cfg = make_config(
        None,
        model=args.model,
        steps=args.steps + 2,
        warmup=2,
        lr=1e-3,
        micro_batch=args.micro_batch,
        accum=args.accum,
        context=args.context,
        dtype="fp32",
        val_every=0,
        ckpt_every=0,
        progress=False,
        device="cpu",
    )
    vocab = json.loads((resolve_data(cfg) / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    tokens = cfg.tokens_per_step
    print(f"model {cfg.model}, {tokens} tokens/step, threads {torch.get_num_threads()}")
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
