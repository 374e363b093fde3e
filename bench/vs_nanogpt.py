"""octlm against nanoGPT on this machine: the same shape class, interleaved, several rounds.

    .venv/bin/python -m bench.vs_nanogpt --nanogpt PATH [--rounds 5] [--steps 12]

PATH is a checkout of github.com/karpathy/nanoGPT, run as it is: its own `train.py` in a
subprocess, its per-iteration `time ...ms` lines read from stdout. Nothing of it is copied
here. Its data is the embedded corpus at character level (`data/<name>/train.bin`, `val.bin`,
`meta.pkl` written in a scratch folder that the run's working directory points at, so the
checkout is not touched).

The matched shape (nanoGPT's `shakespeare_char` class, without dropout or compile): 6 layers,
width 384, 6 heads, context 256, 8 sequences per step, no accumulation, fp32 eager, CPU.
octlm runs `octlm train --model small --context 256 --micro-batch 8 --accum 1 --dtype fp32`
(GQA 6/2, SwiGLU d_ff 1024, vocabulary 4096) in a subprocess; its per-step times are the
gaps between the log's `elapsed` values.

Each side's achieved FLOP/s uses its own count, 6N + 12·L·d·T per token: nanoGPT's N is
`GPT.get_num_params()` of its own model (position embeddings excluded, as in its
`estimate_mfu`), octlm's is `GPT.flops_per_token`. A round runs both, in alternating order;
the ratio of a round is octlm's median FLOP/s over nanoGPT's, and the result is the median of
those paired ratios. Peak memory is each process's peak resident set (`wait4`), whole process.

`--profile` instead profiles one step of each model in its own process (torch.profiler, same
shape and batch, 2 warm-up and 3 profiled steps of forward, backward, clip and AdamW, as each
trainer takes them) and prints milliseconds per step by op group: nanoGPT, octlm as it was
before this bench's changes (unfused AdamW, glibc's default allocator), and octlm now.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from octlm.config.shape import preset
from octlm.model.gpt import GPT
from octlm.prepare.corpus import embedded_documents
from octlm.prepare.text import embedded_dataset

ITER_LINE = re.compile(r"^iter (\d+): loss [\d.naninf]+, time ([\d.]+)ms")
DATASET = "octlm_chars"
NANOGPT_VOCAB = 84
"""The embedded corpus's distinct characters: nanoGPT's vocabulary on its data here."""
OCTLM_VOCAB = 4096
"""octlm's side trains on the embedded corpus at this vocabulary (prepared once, cached)."""


@dataclass(frozen=True)
class Shape:
    layers: int = 6
    width: int = 384
    heads: int = 6
    context: int = 256
    batch: int = 8


@dataclass
class Side:
    name: str
    flops_per_token: int
    step_ms: list[float]
    peak_rss_mb: list[float]


def char_dataset(folder: Path) -> int:
    """nanoGPT's shakespeare_char layout from the embedded corpus; returns the vocabulary."""
    text = "\n\n".join(doc.text for doc in embedded_documents())
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((index[c] for c in text), dtype=np.uint16, count=len(text))
    cut = int(0.9 * len(ids))
    data = folder / "data" / DATASET
    data.mkdir(parents=True)
    ids[:cut].tofile(data / "train.bin")
    ids[cut:].tofile(data / "val.bin")
    # nanoGPT reads its vocabulary size from this pickle; it is nanoGPT's format, written here.
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": index}
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    return len(chars)


def octlm_model_config(shape: Shape):
    """The model `octlm train --model small` builds at the matched shape (vocabulary 4096)."""
    return preset(
        "small",
        n_layers=shape.layers,
        d_model=shape.width,
        n_heads=shape.heads,
        vocab_size=OCTLM_VOCAB,
        context=shape.context,
    )


def nanogpt_model(checkout: Path, shape: Shape, vocab: int):
    """nanoGPT's own GPT (its model.py, imported from the checkout) at the matched shape."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", checkout / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.GPTConfig(
        block_size=shape.context,
        vocab_size=vocab,
        n_layer=shape.layers,
        n_head=shape.heads,
        n_embd=shape.width,
        dropout=0.0,
        bias=False,
    )
    with contextlib.redirect_stdout(open(os.devnull, "w")):  # it prints its parameter count
        return module.GPT(cfg)


def nanogpt_flops_per_token(checkout: Path, shape: Shape, vocab: int) -> int:
    """6N + 12·L·d·T with N from nanoGPT's own model (its `estimate_mfu` convention)."""
    n = nanogpt_model(checkout, shape, vocab).get_num_params()
    return 6 * n + 12 * shape.layers * shape.width * shape.context


def run_measured(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, float]:
    """Run `cmd`; its stdout and its peak resident set in MB. A failure ends the bench."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{text[-2000:]}")
    return text, usage.ru_maxrss / 1024


def nanogpt_round(checkout: Path, scratch: Path, shape: Shape, steps: int, env) -> tuple:
    out_dir = scratch / "out"
    cmd = [
        sys.executable,
        str(checkout / "train.py"),
        f"--dataset={DATASET}",
        "--device=cpu",
        "--compile=False",
        "--dtype=float32",
        f"--n_layer={shape.layers}",
        f"--n_head={shape.heads}",
        f"--n_embd={shape.width}",
        f"--block_size={shape.context}",
        f"--batch_size={shape.batch}",
        "--gradient_accumulation_steps=1",
        "--dropout=0.0",
        "--bias=False",
        f"--max_iters={steps + 1}",
        "--eval_interval=1000000",
        "--eval_iters=1",
        "--log_interval=1",
        "--always_save_checkpoint=False",
        f"--out_dir={out_dir}",
    ]
    text, rss = run_measured(cmd, scratch, env)
    times = [float(m.group(2)) for line in text.splitlines() if (m := ITER_LINE.match(line))]
    # iter 0 includes its evaluation and first-call set-up: drop the first two.
    return times[2:], rss


def octlm_round(scratch: Path, shape: Shape, steps: int, env, extra: list[str]) -> tuple:
    run = scratch / "octlm-run"
    cmd = [
        sys.executable,
        "-m",
        "octlm",
        "train",
        "--model",
        "small",
        "--n-layers",
        str(shape.layers),
        "--d-model",
        str(shape.width),
        "--n-heads",
        str(shape.heads),
        "--context",
        str(shape.context),
        "--micro-batch",
        str(shape.batch),
        "--accum",
        "1",
        "--dtype",
        "fp32",
        "--steps",
        str(steps + 2),
        "--warmup",
        "1",
        "--val-every",
        "0",
        "--ckpt-every",
        "0",
        "--no-progress",
        "--no-resume",
        "--out",
        str(run),
        "--data",
        str(embedded_dataset(OCTLM_VOCAB)),
        *extra,
    ]
    _, rss = run_measured(cmd, Path.cwd(), env)
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    elapsed = [r["elapsed"] for r in records if r["type"] == "step"]
    gaps = [1000 * (b - a) for a, b in zip(elapsed[1:], elapsed[2:], strict=False)]
    for path in sorted(run.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    run.rmdir()
    return gaps, rss


GROUPS = (
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm")),
    ("attention (SDPA kernel)", ("scaled_dot_product",)),
    ("softmax + cross-entropy", ("log_softmax", "nll_loss")),
    ("activation (SiLU, GELU)", ("silu", "gelu")),
    ("norm kernels", ("layer_norm", "rms_norm")),
)
OTHER = "other elementwise, copies, fills (RoPE, RMSNorm's backward, residuals)"
OPTIMIZER = "AdamW + clipping"


def op_group(event) -> str:
    node = event
    while node is not None:
        if node.name.startswith(("Optimizer.step#", "Optimizer.zero_grad#", "octlm::clip")):
            return OPTIMIZER
        node = node.cpu_parent
    for group, needles in GROUPS:
        if any(n in event.name for n in needles):
            return group
    return OTHER


def profile_side(side: str, checkout: Path, shape: Shape, threads: int) -> dict[str, float]:
    """Milliseconds per step by op group for one side (run in its own process)."""
    from torch.profiler import record_function

    from bench.common import optimizer_for
    from octlm.config.files import make_config
    from octlm.device import keep_freed_host_memory
    from octlm.trainer.optim import clip_grad_norm

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if side == "nanoGPT":
        vocab = NANOGPT_VOCAB
        model = nanogpt_model(checkout, shape, vocab)
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")

        def loss_of(x, y):
            return model(x, y)[1]
    else:
        if side == "octlm":
            keep_freed_host_memory()
        vocab = OCTLM_VOCAB
        model = GPT(octlm_model_config(shape))
        fused = None if side == "octlm" else False
        opt = optimizer_for(model, make_config(None, context=shape.context, fused=fused))

        def loss_of(x, y):
            loss_sum, n = model(x, y)
            return loss_sum / n

    x = torch.randint(0, vocab, (shape.batch, shape.context))
    y = torch.randint(0, vocab, (shape.batch, shape.context))

    def step():
        loss_of(x, y).backward()
        with record_function("octlm::clip"):
            clip_grad_norm(model, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    steps = 3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - t0
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.name.startswith("aten::"):
            group = op_group(event)
            totals[group] = totals.get(group, 0.0) + event.self_cpu_time_total / 1e3 / steps
    totals["framework (autograd, dispatch, Python)"] = wall * 1e3 / steps - sum(totals.values())
    totals["whole step"] = wall * 1e3 / steps
    return totals


def profile_table(checkout: Path, shape: Shape, threads: int) -> None:
    sides = ("nanoGPT", "octlm before", "octlm")
    results = {}
    for side in sides:
        cmd = [
            sys.executable,
            "-m",
            "bench.vs_nanogpt",
            "--nanogpt",
            str(checkout),
            "--threads",
            str(threads),
            "--profile-side",
            side,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = [g for g, _ in GROUPS] + [OTHER, OPTIMIZER, "framework (autograd, dispatch, Python)"]
    print("| op group (ms per step) | " + " | ".join(sides) + " |")
    print("|---|" + "---:|" * len(sides))
    for row in [*rows, "whole step"]:
        cells = " | ".join(f"{results[s].get(row, 0.0):.1f}" for s in sides)
        print(f"| {row} | {cells} |")


def timed_rounds(args, checkout: Path, shape: Shape, variants: dict[str, list[str]]) -> None:
    """The interleaved rounds: nanoGPT and each octlm variant once per round, the order
    rotated; per round each variant's FLOP/s over nanoGPT's; the paired medians at the end."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1"}
    octlm_flops = GPT(octlm_model_config(shape)).flops_per_token(shape.context)
    tokens = shape.batch * shape.context
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        vocab = char_dataset(scratch)
        # train.py reads configurator.py from its working directory: point at the checkout's.
        (scratch / "configurator.py").symlink_to(checkout / "configurator.py")
        sides = [Side("nanoGPT", nanogpt_flops_per_token(checkout, shape, vocab), [], [])]
        sides += [Side(name, octlm_flops, [], []) for name in variants]
        ratios: dict[str, list[float]] = {name: [] for name in variants}
        token_ratios: dict[str, list[float]] = {name: [] for name in variants}
        print(
            f"shape: {shape}; nanoGPT vocabulary {vocab}, octlm {OCTLM_VOCAB}; "
            f"{args.threads} threads; {args.steps} timed steps per run"
        )
        print(
            f"FLOPs/token: nanoGPT {sides[0].flops_per_token / 1e6:.1f} M, "
            f"octlm {octlm_flops / 1e6:.1f} M"
        )
        for r in range(args.rounds):
            shift = r % len(sides)
            medians = {}
            for side in sides[shift:] + sides[:shift]:
                if side.name == "nanoGPT":
                    times, rss = nanogpt_round(checkout, scratch, shape, args.steps, env)
                else:
                    times, rss = octlm_round(scratch, shape, args.steps, env, variants[side.name])
                medians[side.name] = statistics.median(times)
                side.step_ms.append(medians[side.name])
                side.peak_rss_mb.append(rss)
            flops = {s.name: s.flops_per_token * tokens / (medians[s.name] / 1e3) for s in sides}
            line = [f"round {r + 1}: nanoGPT {medians['nanoGPT']:.1f} ms"]
            for name in variants:
                ratios[name].append(flops[name] / flops["nanoGPT"])
                token_ratios[name].append(medians["nanoGPT"] / medians[name])
                line.append(f"{name} {medians[name]:.1f} ms (FLOP/s ratio {ratios[name][-1]:.3f})")
            print(", ".join(line))
    print()
    print("| side | ms/step (median of round medians) | range | GFLOP/s | peak RSS MB |")
    print("|---|---:|---|---:|---:|")
    for side in sides:
        ms = statistics.median(side.step_ms)
        print(
            f"| {side.name} | {ms:.1f} | {min(side.step_ms):.1f} – {max(side.step_ms):.1f} | "
            f"{side.flops_per_token * tokens / ms / 1e6:.1f} | "
            f"{statistics.median(side.peak_rss_mb):.0f} |"
        )
    print()
    for name in variants:
        print(
            f"{name} / nanoGPT achieved FLOP/s, paired median of {args.rounds} rounds: "
            f"{statistics.median(ratios[name]):.3f} "
            f"(rounds: {', '.join(f'{x:.3f}' for x in ratios[name])}); "
            f"tokens/s: {statistics.median(token_ratios[name]):.3f}"
        )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12, help="timed steps per run")
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS for both sides")
    ap.add_argument(
        "--octlm",
        action="append",
        metavar="NAME=FLAGS",
        help="an octlm variant: a name and extra `octlm train` flags, space-separated (repeat "
        "for several, e.g. --octlm eager= --octlm 'compile=--compile'); default: octlm=",
    )
    ap.add_argument("--profile", action="store_true", help="op-group profile instead of timing")
    ap.add_argument("--profile-side", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    checkout = args.nanogpt.resolve()
    if not (checkout / "train.py").is_file() or not (checkout / "model.py").is_file():
        sys.exit(f"bench: {checkout} has no train.py and model.py: pass a nanoGPT checkout")
    shape = Shape()
    if args.profile_side:
        print(json.dumps(profile_side(args.profile_side, checkout, shape, args.threads)))
        return
    if args.profile:
        profile_table(checkout, shape, args.threads)
        return
    variants = {}
    for spec in args.octlm or ["octlm="]:
        name, sep, flags = spec.partition("=")
        if not sep or not name or name == "nanoGPT":
            sys.exit(f"bench: --octlm {spec!r}: write NAME=FLAGS, e.g. compile=--compile")
        variants[name] = flags.split()
    timed_rounds(args, checkout, shape, variants)


if __name__ == "__main__":
    main()
