"""The GPU checks, as one prepared script for a session that is lent a GPU (not yet run on one).

    .venv/bin/python -m bench.gpu_check                   # on a CUDA machine, about 10 minutes
    .venv/bin/python -m bench.gpu_check --device cpu --models tiny --context 64 --micro-batch 2 \
        --accum 1 --steps 6 --variants bf16,fused --split 3    # a smoke test of the script itself

1. Speed: tokens/s and MFU of `octlm train` for each model with bf16 autocast, then adding
   `--fused`, `--compile`, both, and both plus `--deterministic`, one flag at a time as the
   seed's Part 6 plans; variants interleaved round by round; MFU against the device's measured
   bf16 matmul peak (`octlm bench peak`'s measurement, made here first).
2. Exactness on the device (docs/exactness.md): `verify-resume` with and without
   `--deterministic` (bf16, fused, compiled), and two straight runs without it compared with
   `octlm diff` logic: the seed saw such runs part within a few steps.
3. NCCL (issue 18), with two GPUs or more: DDP and FSDP on 2 processes (one GPU each, device
   per local rank), straight against stopped and resumed, with `--deterministic`; the weights
   hashes must match. Skipped, saying so, on one GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from octlm.config_files import make_config
from octlm.model import GPT, preset
from octlm.peak import measure_peak, store_peak

if not __package__:  # run as `python bench/gpu_check.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loop_overhead import octlm_step_times

VARIANTS = {
    "bf16": {},
    "fused": {"fused": True},
    "compile": {"compile": True},
    "fused+compile": {"fused": True, "compile": True},
    "fused+compile+deterministic": {"fused": True, "compile": True, "deterministic": True},
    # Issue 17: the memory/time trade of recomputed blocks (the log's mem_mb shows the peak).
    "activation-checkpointing": {"activation_checkpointing": True},
}


def base_config(model: str, args: argparse.Namespace, steps: int, **extra):
    return make_config(
        None,
        model=model,
        steps=steps,
        warmup=2,
        lr=6e-4,
        micro_batch=args.micro_batch,
        accum=args.accum,
        context=args.context,
        dtype="bf16",
        val_every=0,
        ckpt_every=0,
        progress=False,
        device=args.device,
        **extra,
    )


def speed(args: argparse.Namespace) -> None:
    peak = measure_peak(args.device, "bf16", seconds=5.0)
    store_peak(peak)
    print(f"peak bf16 matmul: {peak.flops / 1e12:.1f} TFLOP/s ({peak.key})")
    names = [v for v in args.variants.split(",") if v]
    for model in args.models.split(","):
        flops = GPT(preset(model, context=args.context)).flops_per_token(args.context)
        times: dict[str, list[float]] = {v: [] for v in names}
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]  # interleave, alternate the order
            for name in order:
                cfg = base_config(model, args, args.steps, **VARIANTS[name])
                steps = octlm_step_times(cfg)[2:]  # compile warms up over the first steps
                times[name].append(statistics.median(steps))
        tokens = args.micro_batch * args.accum * args.context
        base = statistics.median(times[names[0]])
        print(f"\n{model}: {tokens} tokens/step, median of {args.rounds} rounds")
        print("| variant | tok/s | MFU | time vs " + names[0] + " |\n|---|---:|---:|---:|")
        for name in names:
            t = statistics.median(times[name])
            tok_s = tokens / t
            print(
                f"| {name} | {tok_s:,.0f} | {100 * flops * tok_s / peak.flops:.1f}% "
                f"| {t / base:.3f} |"
            )


def exactness(args: argparse.Namespace) -> None:
    from octlm.runlog import read_log
    from octlm.tools.rundiff import diff_runs
    from octlm.tools.verify import format_table, verify_resume

    model = args.models.split(",")[0]
    flags = {"fused": "fused" in args.variants, "compile": "compile" in args.variants}
    for deterministic in (False, True):
        cfg = base_config(model, args, args.steps, deterministic=deterministic, **flags)
        summaries, kept = verify_resume(cfg, [args.split], keep=True, echo=lambda _: None)
        print(f"\nverify-resume, {model}, bf16 {flags}, deterministic={deterministic}:")
        print("\n".join(format_table(summaries)))
        if not deterministic:  # the straight run against a second straight run
            summaries2, kept2 = verify_resume(cfg, [args.split], keep=True, echo=lambda _: None)
            result = diff_runs(read_log(kept / "straight"), read_log(kept2 / "straight"))
            first = "match" if result.first is None else f"part at step {result.first.step}"
            print(
                f"two straight runs without --deterministic: {first} "
                f"(largest loss difference {result.max_loss_diff:.3e})"
            )


def nccl(args: argparse.Namespace) -> None:
    import tempfile

    from octlm.runlog import read_log
    from octlm.tools import subrun

    if not args.device.startswith("cuda") or torch.cuda.device_count() < 2:
        print(f"\nNCCL: skipped ({torch.cuda.device_count()} GPU visible, needs 2)")
        return
    model = args.models.split(",")[0]
    for parallel in ("ddp", "fsdp"):
        cfg = base_config(model, args, args.steps, deterministic=True, parallel=parallel)
        with tempfile.TemporaryDirectory() as tmp:
            config = subrun.write_config(cfg, Path(tmp) / "config.toml")
            runs = {"straight": Path(tmp) / "straight", "split": Path(tmp) / "split"}
            errors = [subrun.train(config, runs["straight"], "--nproc", "2")]
            errors.append(
                subrun.train(config, runs["split"], "--nproc", "2", "--stop-at", str(args.split))
            )
            errors.append(subrun.train(config, runs["split"], "--nproc", "2", "--resume"))
            if any(errors):
                print(f"\nNCCL {parallel}: failed: {[e for e in errors if e]}")
                continue
            ends = [[r for r in read_log(run) if r["type"] == "end"][-1] for run in runs.values()]
            same = ends[0]["weights_sha256"] == ends[1]["weights_sha256"]
            verdict = "identical" if same else "DIFFERENT"
            print(f"\nNCCL {parallel}, 2 GPUs, split at {args.split}: {verdict}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="small,main")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--split", type=int, default=6)
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: pass --device cpu for a smoke test")
    if not args.skip_speed:
        speed(args)
    exactness(args)
    nccl(args)


if __name__ == "__main__":
    main()
