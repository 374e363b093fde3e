"""Tokens/s and MFU of `octlm train` on CPU, against a bare loop and the measured matmul peak.

    .venv/bin/python -m bench.step_mfu [--models tiny,small] [--rounds 3] [--steps 6]

Each round measures, side by side: the machine's matmul peak (`octlm.tools.peak.measure_peak`, fp32,
this thread count), then for each model `octlm train` in-process on the demo data (vocabulary
4096; per-step time from the gaps between `elapsed` values in its log) and a bare
forward/backward/clip/AdamW loop on the same model shape and batch (bench.loop_overhead).
MFU = flops_per_token(context) * tokens/s / peak, with that round's peak. `small` here is the
small preset's shape (d 384, 6 layers, GQA 6/2, d_ff 1024) at vocabulary 4096 and the short
context given, so that a CPU step takes about a second.

Last, one profile of each model's `octlm train` steps through the product's own
`--profile-steps A:B` (`octlm.train(..., profile_steps="A:B")`, which writes
OUT/profile/trace.json and ops.txt): where the profiled window's time goes, read from its
Chrome trace. The phases are the labels the trace holds: the autograd engine's (backward),
torch.optim's (`Optimizer.step#`, `Optimizer.zero_grad#`), and any `octlm::` label the loop
records; ops under none of them (today the forward, clip_grad_norm, the data and the loss's
reads) are one row, and the time in no op at all (Python: the loop, logging, counters)
another. Nothing of octlm is patched, so the table has the detail the product's labels give.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

import octlm
from octlm.config.shape import preset
from octlm.config.train import TrainConfig
from octlm.model.gpt import GPT
from octlm.tools.peak import measure_peak

if not __package__:  # run as `python bench/step_mfu.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import DATA
from bench.common import bench_config
from bench.loop_overhead import bare_step_times, octlm_step_times

VOCAB = 4096
PROFILE_FROM = 3
"""The first profiled step: the two before it warm up (allocations, the first lr steps)."""

# A trace's phase markers: the autograd engine's and torch.optim's own labels, and the loop's
# `octlm::` labels wherever the product records them.
BACKWARD = "autograd::engine::evaluate_function"
OPTIMIZER = ("Optimizer.step#", "Optimizer.zero_grad#")
MODEL_PHASES = ("backward", "optimizer", "octlm::forward", "octlm::backward", "octlm::clip")
UNLABELLED = "no label"


def config(model: str, args: argparse.Namespace, steps: int) -> TrainConfig:
    return bench_config(
        model,
        data=args.data,
        steps=steps,
        context=args.context,
        micro_batch=args.micro_batch,
        accum=args.accum,
        dtype="fp32",
        lr=1e-3,
    )


def phase_of(name: str) -> str | None:
    """The phase a trace event marks, None for an op that marks none."""
    if name.startswith("octlm::"):
        return name
    if name.startswith(OPTIMIZER):
        return "optimizer"
    if name.startswith(BACKWARD):
        return "backward"
    return None


def trace_events(path: Path) -> tuple[list[dict[str, Any]], float]:
    """The CPU events (ops and labels) of a Chrome trace, and its window in microseconds (the
    profiler's own span, else first event to last)."""
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    ops = [e for e in spans if e.get("cat") in ("cpu_op", "user_annotation")]
    whole = [e["dur"] for e in spans if e.get("cat") == "Trace"]
    if whole:
        return ops, whole[0]
    return ops, max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops)


def nest(events: list[dict[str, Any]]) -> None:
    """Give each event (per thread) its `phases` (its own and its enclosing phase markers',
    innermost last), `top` (no enclosing event) and `self` time (its duration less its
    children's)."""
    stack: list[dict[str, Any]] = []
    for ev in sorted(events, key=lambda e: (e["tid"], e["ts"], -e["dur"])):
        while stack and (stack[-1]["tid"] != ev["tid"] or ev["ts"] >= stack[-1]["end"] - 1e-3):
            stack.pop()
        parent = stack[-1] if stack else None
        own = phase_of(ev["name"])
        inherited = parent["phases"] if parent else ()
        ev["phases"] = (*inherited, own) if own else inherited
        ev["top"], ev["self"], ev["end"] = parent is None, ev["dur"], ev["ts"] + ev["dur"]
        if parent is not None:
            parent["self"] -= ev["dur"]
        stack.append(ev)


def phase_table(events: list[dict[str, Any]], window_us: float, steps: int) -> dict[str, Any]:
    """Milliseconds per profiled step by phase (a marker nested in one of its own phase counts
    once), the ops under no label, the time in no op, aten::item calls by phase, and the top
    ops outside the model's phases by self time."""
    nest(events)
    per_step = 1e3 * steps  # microseconds over the window -> milliseconds per step
    ms: dict[str, float] = defaultdict(float)
    items: dict[str, float] = defaultdict(float)
    outside: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for ev in events:
        own, phases = phase_of(ev["name"]), ev["phases"]
        if own and own not in phases[:-1]:
            ms[own] += ev["dur"] / per_step
        elif ev["top"] and not phases:
            ms[UNLABELLED] += ev["dur"] / per_step
        where = phases[-1] if phases else UNLABELLED
        if ev["name"] == "aten::item":  # a read of a tensor's value by the host
            items[where] += 1 / steps
        if ev["name"].startswith("aten::") and not set(phases) & set(MODEL_PHASES):
            entry = outside[f"{ev['name']} [{where}]"]
            entry[0] += ev["self"] / per_step
            entry[1] += 1 / steps
    top_level = sum(ev["dur"] for ev in events if ev["top"]) / per_step
    window = window_us / per_step
    top = sorted(outside.items(), key=lambda kv: -kv[1][0])[:8]
    return {
        "ms": dict(ms),
        "no_op": window - top_level,
        "window": window,
        "model": sum(ms.get(k, 0.0) for k in MODEL_PHASES),
        "items_per_step": dict(items),
        "top": [(name, v, n) for name, (v, n) in top],
    }


def profile_steps(cfg: TrainConfig, active: int) -> dict[str, Any]:
    """Profile `active` whole steps of `octlm train` (after PROFILE_FROM - 1 unprofiled ones)
    with its own `--profile-steps`, and read the phases from the trace it writes. The last
    step (which validates and hashes) is after the window."""
    window = f"{PROFILE_FROM}:{PROFILE_FROM + active - 1}"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        octlm.train(cfg, out=str(out), steps=PROFILE_FROM + active, profile_steps=window)
        folder = out / "profile"
        if not (folder / "ops.txt").is_file():  # the product's per-op table: the window closed
            raise SystemExit(f"octlm train --profile-steps {window} wrote no {folder}/ops.txt")
        events, window_us = trace_events(folder / "trace.json")
    return phase_table(events, window_us, active)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,small")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per run (after a warm-up)")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    ap.add_argument("--peak-seconds", type=float, default=2.0)
    ap.add_argument("--profile-steps", type=int, default=2, help="0 = no profile")
    ap.add_argument("--data", default=DATA)
    return ap


Rows = dict[str, list[tuple[float, float, float]]]
"""Per model, per round: (octlm s/step, bare s/step, that round's peak FLOP/s)."""


def measure_rounds(
    args: argparse.Namespace, cfgs: dict[str, TrainConfig], flops: dict[str, float], tokens: int
) -> Rows:
    """The rounds, each printed as it ends: the peak, then each model's octlm and bare loop."""
    rows: Rows = {m: [] for m in cfgs}
    for r in range(args.rounds):
        peak = measure_peak("cpu", "fp32", seconds=args.peak_seconds).flops
        line = [f"round {r}: peak {peak / 1e9:.1f} GFLOP/s"]
        for m, cfg in cfgs.items():
            a = statistics.median(octlm_step_times(cfg))
            b = statistics.median(bare_step_times(cfg, VOCAB, args.steps))
            rows[m].append((a, b, peak))
            line.append(
                f"{m} octlm {tokens / a:,.0f} tok/s (MFU {flops[m] * tokens / a / peak:.1%}) "
                f"bare {tokens / b:,.0f} tok/s (MFU {flops[m] * tokens / b / peak:.1%})"
            )
        print("  ".join(line))
    return rows


def print_speed(rows: Rows, flops: dict[str, float], tokens: int) -> None:
    print()
    print(
        "| model | octlm tok/s (median) | bare tok/s (median) | octlm/bare time (median "
        "paired) | peak GFLOP/s (median) | MFU octlm | MFU bare |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m, rs in rows.items():
        a_s = [a for a, _, _ in rs]
        b_s = [b for _, b, _ in rs]
        peaks = [p for _, _, p in rs]
        ratio = statistics.median(a / b for a, b, _ in rs)
        mfu_a = statistics.median(flops[m] * tokens / a / p for a, _, p in rs)
        mfu_b = statistics.median(flops[m] * tokens / b / p for _, b, p in rs)
        print(
            f"| {m} | {tokens / statistics.median(a_s):,.0f} | "
            f"{tokens / statistics.median(b_s):,.0f} | {ratio:.4f} | "
            f"{statistics.median(peaks) / 1e9:.1f} | {mfu_a:.1%} | {mfu_b:.1%} |"
        )


def print_profiles(profiles: dict[str, dict[str, Any]], active: int) -> None:
    print(
        f"\nprofile (octlm train --profile-steps, CPU) of {active} whole `octlm train` loop "
        "iterations per model; ms per step and share of the profiled window"
    )
    models = list(profiles)
    print("| phase | " + " | ".join(f"{m} ms | {m} share" for m in models) + " |")
    print("|---|" + "---:|---:|" * len(models))
    labels = sorted({k for p in profiles.values() for k in p["ms"]} - {"backward", UNLABELLED})
    phases = [
        ("model: backward (autograd engine)", lambda p: p["ms"].get("backward", 0.0)),
        ("model: AdamW step + zero_grad (torch.optim)", lambda p: p["ms"].get("optimizer", 0.0)),
        *((f"label {k}", lambda p, k=k: p["ms"].get(k, 0.0)) for k in labels if k != "optimizer"),
        ("ops under no label (forward, clip, data, reads)", lambda p: p["ms"].get(UNLABELLED, 0.0)),
        ("outside any op (Python: the loop, logging, counters)", lambda p: p["no_op"]),
        ("whole profiled window", lambda p: p["window"]),
    ]
    for name, get in phases:
        cells = [f"{get(p):.2f} | {get(p) / p['window']:.2%}" for p in profiles.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for m, p in profiles.items():
        items = ", ".join(f"{n:.0f} in {k}" for k, n in sorted(p["items_per_step"].items()))
        print(
            f"\n{m}: the model's labelled work is {p['model'] / p['window']:.2%} of the window; "
            f"aten::item calls per step: {items}"
        )
        print(f"{m}: top ops outside the model's labels by self time, per step [label above them]:")
        for name, v, n in p["top"]:
            print(f"  {name:58s} {v:8.3f} ms {n:6.1f} calls")


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    models = args.models.split(",")
    cfgs = {m: config(m, args, args.steps + 2) for m in models}
    tokens = args.micro_batch * args.accum * args.context
    flops = {
        m: GPT(preset(m, vocab_size=VOCAB, context=args.context)).flops_per_token(args.context)
        for m in models
    }
    print(
        f"threads {torch.get_num_threads()}, {args.micro_batch} x {args.context} tokens x accum "
        f"{args.accum} = {tokens} tokens/step, fp32, vocabulary {VOCAB}"
    )
    for m in models:
        print(f"  {m}: {flops[m] / 1e6:.1f} MFLOP/token (6N + 12 L d T)")
    print_speed(measure_rounds(args, cfgs, flops, tokens), flops, tokens)
    if args.profile_steps <= 0:
        return
    profiles = {}
    for m in models:
        t0 = time.perf_counter()
        profiles[m] = profile_steps(cfgs[m], args.profile_steps)
        print(f"profiled {m}: {time.perf_counter() - t0:.0f} s with the profiler's overhead")
    print_profiles(profiles, args.profile_steps)


if __name__ == "__main__":
    main()
