"""Tokens/s and MFU of `octlm train` on CPU, against a bare loop and the measured matmul peak.

    .venv/bin/python -m bench.step_mfu [--models tiny,small] [--rounds 3] [--steps 6]

Each round measures, side by side: the machine's matmul peak (`octlm.tools.peak.measure_peak`, fp32,
this thread count), then for each model `octlm train` in-process on the demo data (vocabulary
4096; per-step time from the gaps between `elapsed` values in its log) and a bare
forward/backward/clip/AdamW loop on the same model shape and batch (bench.loop_overhead).
MFU = flops_per_token(context) * tokens/s / peak, with that round's peak. `small` here is the
small preset's shape (d 384, 6 layers, GQA 6/2, d_ff 1024) at vocabulary 4096 and the short
context given, so that a CPU step takes about a second.

Last, one profile (torch.profiler) of `octlm train` steps of the last model: where a step's
time goes, split into the model's own work (forward, backward, clip, AdamW) and everything
else (data, the loop's bookkeeping inside train_step, logging, the rest of the loop).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import octlm.runlog
from octlm.config.files import make_config
from octlm.config.shape import preset
from octlm.data.order import Sampler
from octlm.model.gpt import GPT
from octlm.tools.peak import measure_peak
from octlm.trainer import step as step_module
from octlm.trainer.loop import train

if not __package__:  # run as `python bench/step_mfu.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import DATA
from bench.loop_overhead import bare_step_times, octlm_step_times

VOCAB = 4096

# Profiler labels: the model's own work, and the rest.
MODEL_LABELS = ("octlm::forward", "octlm::backward", "octlm::clip")
OPT_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#")
OTHER_LABELS = ("octlm::data", "octlm::log", "octlm::lr")


def config(model: str, args: argparse.Namespace, steps: int):
    return make_config(
        None,
        model=model,
        data=args.data,
        steps=steps,
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


def _labelled(fn, label):
    def wrapper(*a, **k):
        with record_function(label):
            return fn(*a, **k)

    return wrapper


def profile_steps(cfg, active: int) -> dict:
    """Profile `active` whole loop iterations of `octlm train` (after 2 unprofiled steps).

    Profiler steps are cut where the loop writes a `step` record, so one profiled step is one
    loop iteration: its tail (validation/checkpoint checks), the next lr, data, train_step and
    log line. Returns per-step milliseconds by phase and the top non-model ops.
    """
    prof = profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=active, repeat=1),
        record_shapes=False,
    )
    real_write = octlm.runlog.RunLog.write
    real_train_step = step_module.train_step

    def write(self, record_type, **fields):
        with record_function("octlm::log"):
            real_write(self, record_type, **fields)
        if record_type == "step":
            prof.step()

    def train_step(setup, *a, **k):
        labelled = dataclasses.replace(setup, forward=_labelled(setup.forward, "octlm::forward"))
        with record_function("octlm::train_step"):
            return real_train_step(labelled, *a, **k)

    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        # Patched where they are looked up: `advance` (octlm.trainer.step) calls train_step and
        # learning_rate, train_step calls clip_grad_norm.
        patches = [
            mock.patch.object(octlm.runlog.RunLog, "write", write),
            mock.patch.object(step_module, "train_step", train_step),
            mock.patch.object(Sampler, "batch", _labelled(Sampler.batch, "octlm::data")),
            mock.patch.object(
                step_module,
                "learning_rate",
                _labelled(step_module.learning_rate, "octlm::lr"),
            ),
            mock.patch.object(
                step_module,
                "clip_grad_norm",
                _labelled(step_module.clip_grad_norm, "octlm::clip"),
            ),
            mock.patch.object(
                torch.Tensor, "backward", _labelled(torch.Tensor.backward, "octlm::backward")
            ),
        ]
        for p in patches:
            stack.enter_context(p)
        with prof:
            train(cfg.replace(out=str(Path(tmp) / "run"), steps=active + 3))
    events = prof.events()

    def label_of(ev) -> str | None:
        """The innermost of our labels (or an optimizer label) above an op."""
        node = ev.cpu_parent
        while node is not None:
            name = node.name
            if name in MODEL_LABELS or name in OTHER_LABELS or name == "octlm::train_step":
                return name
            if name.startswith(OPT_PREFIXES):
                return "optimizer"
            node = node.cpu_parent
        return None

    totals: dict[str, float] = defaultdict(float)  # microseconds over all active steps
    non_model_ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    syncs: dict[str, int] = defaultdict(int)  # aten::item calls by the label above them
    for ev in events:
        name = ev.name
        if name.startswith("ProfilerStep"):
            totals["step"] += ev.cpu_time_total
        elif name in MODEL_LABELS or name in OTHER_LABELS or name == "octlm::train_step":
            totals[name] += ev.cpu_time_total
        elif name.startswith(OPT_PREFIXES):
            totals["optimizer"] += ev.cpu_time_total
        if name == "aten::item":  # a read of a tensor's value by the host
            syncs[label_of(ev) or "loop"] += 1
        if name.startswith("aten::"):
            where = label_of(ev)
            if where not in MODEL_LABELS and where != "optimizer":
                entry = non_model_ops[f"{name} [{where or 'loop'}]"]
                entry[0] += ev.self_cpu_time_total
                entry[1] += 1
    ms = {k: v / 1e3 / active for k, v in totals.items()}
    model = sum(ms.get(k, 0.0) for k in (*MODEL_LABELS, "optimizer"))
    in_step_other = ms.get("octlm::train_step", 0.0) - model
    loop_other = (
        ms["step"] - ms.get("octlm::train_step", 0.0) - sum(ms.get(k, 0.0) for k in OTHER_LABELS)
    )
    top = sorted(non_model_ops.items(), key=lambda kv: -kv[1][0])[:8]
    return {
        "ms": ms,
        "model": model,
        "in_step": in_step_other,
        "loop_other": loop_other,
        "items_per_step": {k: v / active for k, v in syncs.items()},
        "top": [(name, us / 1e3 / active, n / active) for name, (us, n) in top],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
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
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = args.models.split(",")
    cfgs = {m: config(m, args, args.steps + 2) for m in models}
    tokens = cfgs[models[0]].tokens_per_step
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
    rows: dict[str, list[tuple[float, float, float]]] = {m: [] for m in models}
    peaks = []
    for r in range(args.rounds):
        peak = measure_peak("cpu", "fp32", seconds=args.peak_seconds).flops
        peaks.append(peak)
        line = [f"round {r}: peak {peak / 1e9:.1f} GFLOP/s"]
        for m in models:
            a = statistics.median(octlm_step_times(cfgs[m]))
            b = statistics.median(bare_step_times(cfgs[m], VOCAB, args.steps))
            rows[m].append((a, b, peak))
            line.append(
                f"{m} octlm {tokens / a:,.0f} tok/s (MFU {flops[m] * tokens / a / peak:.1%}) "
                f"bare {tokens / b:,.0f} tok/s (MFU {flops[m] * tokens / b / peak:.1%})"
            )
        print("  ".join(line))
    print()
    print(
        "| model | octlm tok/s (median) | bare tok/s (median) | octlm/bare time (median "
        "paired) | peak GFLOP/s (median) | MFU octlm | MFU bare |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in models:
        a_s = [a for a, _, _ in rows[m]]
        b_s = [b for _, b, _ in rows[m]]
        ratio = statistics.median(a / b for a, b, _ in rows[m])
        mfu_a = statistics.median(flops[m] * tokens / a / p for a, _, p in rows[m])
        mfu_b = statistics.median(flops[m] * tokens / b / p for _, b, p in rows[m])
        print(
            f"| {m} | {tokens / statistics.median(a_s):,.0f} | "
            f"{tokens / statistics.median(b_s):,.0f} | {ratio:.4f} | "
            f"{statistics.median(peaks) / 1e9:.1f} | {mfu_a:.1%} | {mfu_b:.1%} |"
        )
    if args.profile_steps <= 0:
        return
    profiles = {}
    for m in models:
        t0 = time.perf_counter()
        profiles[m] = profile_steps(cfgs[m], args.profile_steps)
        print(f"profiled {m}: {time.perf_counter() - t0:.0f} s with the profiler's overhead")
    print(
        f"\nprofile (torch.profiler, CPU) of {args.profile_steps} whole `octlm train` loop "
        "iterations per model; ms per step and share of the profiled step"
    )
    print("| phase | " + " | ".join(f"{m} ms | {m} share" for m in models) + " |")
    print("|---|" + "---:|---:|" * len(models))
    phases = [
        ("model: forward", lambda p: p["ms"].get("octlm::forward", 0.0)),
        ("model: backward", lambda p: p["ms"].get("octlm::backward", 0.0)),
        ("model: clip_grad_norm", lambda p: p["ms"].get("octlm::clip", 0.0)),
        ("model: AdamW step + zero_grad", lambda p: p["ms"].get("optimizer", 0.0)),
        ("data: Sampler.batch (x accum)", lambda p: p["ms"].get("octlm::data", 0.0)),
        ("train_step outside the model (target count, set_lr, .item())", lambda p: p["in_step"]),
        ("log: RunLog.write of the step record", lambda p: p["ms"].get("octlm::log", 0.0)),
        ("lr schedule", lambda p: p["ms"].get("octlm::lr", 0.0)),
        ("rest of the loop (counters, checks; tqdm off)", lambda p: p["loop_other"]),
        ("whole step", lambda p: p["ms"]["step"]),
    ]
    for name, get in phases:
        cells = []
        for m in models:
            v, step = get(profiles[m]), profiles[m]["ms"]["step"]
            cells.append(f"{v:.2f} | {v / step:.2%}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    for m in models:
        p = profiles[m]
        step = p["ms"]["step"]
        items = ", ".join(f"{n:.0f} in {k}" for k, n in sorted(p["items_per_step"].items()))
        print(
            f"\n{m}: the model's own work is {p['model'] / step:.2%} of the step; "
            f"aten::item calls per step: {items}"
        )
        print(f"{m}: top ops outside the model by self time, per step [label above them]:")
        for name, v, n in p["top"]:
            print(f"  {name:58s} {v:8.3f} ms {n:6.1f} calls")


if __name__ == "__main__":
    main()
