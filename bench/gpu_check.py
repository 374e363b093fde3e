"""The GPU checks, as one prepared script for a session that is lent a GPU (first run on an H200
on 2026-12-04: docs/performance.md, "On a GPU").

    .venv/bin/python -m bench.gpu_check                   # on a CUDA machine, over 15 minutes
    .venv/bin/python -m bench.gpu_check --device cpu --models tiny --context 64 --micro-batch 2 \
        --accum 1 --steps 6 --variants bf16,fused --split 3 \
        --det-combos none,algorithms,attention    # a smoke test of the script itself

1. Speed and memory: tokens/s, MFU and the step's peak allocated memory (the log's `mem_mb`)
   of `octlm train` for each model with bf16 autocast and the per-tensor AdamW, then adding
   `--fused` (today's default), `--compile`, both, both plus `--deterministic`, and
   `--activation-checkpointing`, one flag at a time as the seed's Part 6 plans; variants
   interleaved round by round; MFU against the device's measured bf16 matmul peak (`octlm
   bench peak`'s measurement, made here first). Then the targets (issue 19): `small` >= 50%
   and `main` >= 55% MFU with fused + compile, each printed as met or missed, and what
   `--deterministic` costs (its time over fused + compile's).
2. Exactness on the device (docs/exactness.md): `verify-resume` with and without
   `--deterministic` (bf16, fused, compiled), and two straight runs without it compared with
   `octlm diff` logic: the seed saw such runs part within a few steps.
3. A profile (issue 30): the first model's steps 4 to 6 under `--profile-steps` (a Chrome
   trace and a per-op table) and, on CUDA, `--memory-snapshot`, in `--profile-out`.
4. --doc-mask (issue 29): FlexAttention's block mask against SDPA's dense mask on the device
   (loss, gradients, forward + backward time), and verify-resume of a --packing bos
   --doc-mask run.
5. NCCL (issue 18), with two GPUs or more: DDP and FSDP on 2 processes (one GPU each, device
   per local rank), straight against stopped and resumed, with `--deterministic`; the weights
   hashes must match. Skipped, saying so, on one GPU.
6. The shipped recipe (issue 28): verify-resume of `--config recipe` (Muon with Newton-Schulz
   through the Gram matrix, QK-norm, value residual) on the device in fp32 as shipped, Muon's
   optimizer step against the forward and backward; then (`recipe_compiled`) in bf16 with
   --compile. On CUDA with --deterministic, without which two straight runs part.
7. --deterministic's parts (issue 51, bench/gpu_determinism.py): the step time of no part,
   each part alone (algorithms, attention, inductor) and all, as a ratio to the run without
   parts (compiled alike), on `small` with bf16 and fused AdamW, interleaved round by round;
   then verify-resume of each, printing which end on the straight run's bits. `--det-combos`
   picks them.

`--sections` picks and orders them. On one H200 the exactness part took 367 s (nine compiles in
fresh processes) and `small`'s six speed variants about 100 s: a 15-minute lease holds the
parts in two or three calls, most needed first; the output should be tee'd to a file, so a
call cut short still brings back what it printed. A section that fails prints its traceback
and the next one runs; the script exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from octlm.config.shape import preset
from octlm.config.train import TrainConfig
from octlm.model.gpt import GPT
from octlm.runlog.reader import read_log
from octlm.tools.peak import measure_peak, store_peak
from octlm.trainer.loop import train

if not __package__:  # run as `python bench/gpu_check.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import gpu_determinism
from bench.common import bench_config, gpu_config, optimizer_for, step_times_and_memory

VARIANTS = {
    "bf16": {"fused": False},
    "fused": {"fused": True},
    "compile": {"compile": True},
    "fused+compile": {"fused": True, "compile": True},
    "fused+compile+deterministic": {"fused": True, "compile": True, "deterministic": True},
    # Issue 17: the memory/time trade of recomputed blocks (the log's mem_mb shows the peak).
    "activation-checkpointing": {"activation_checkpointing": True},
}
MFU_TARGETS = {"small": 0.50, "main": 0.55}
"""Issue 19's targets on an H200, bf16 with fused AdamW and compile."""


def speed(args: argparse.Namespace) -> None:
    peak = measure_peak(args.device, "bf16", seconds=5.0)
    store_peak(peak)
    print(f"peak bf16 matmul: {peak.flops / 1e12:.1f} TFLOP/s ({peak.key})")
    names = [v for v in args.variants.split(",") if v]
    for model in args.models.split(","):
        flops = GPT(preset(model, context=args.context)).flops_per_token(args.context)
        times: dict[str, list[float]] = {v: [] for v in names}
        memory: dict[str, float | None] = {}
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]  # interleave, alternate the order
            for name in order:
                cfg = gpu_config(model, args, args.steps, **VARIANTS[name])
                gaps, memory[name] = step_times_and_memory(cfg)
                times[name].append(statistics.median(gaps))
        tokens = args.micro_batch * args.accum * args.context
        base = statistics.median(times[names[0]])
        print(f"\n{model}: {tokens} tokens/step, median of {args.rounds} rounds")
        print(f"| variant | tok/s | MFU | time vs {names[0]} | peak MB |")
        print("|---|---:|---:|---:|---:|")
        mfu = {}
        for name in names:
            t = statistics.median(times[name])
            tok_s = tokens / t
            mfu[name] = flops * tok_s / peak.flops
            mem = "-" if memory[name] is None else f"{memory[name]:,.0f}"
            print(f"| {name} | {tok_s:,.0f} | {100 * mfu[name]:.1f}% | {t / base:.3f} | {mem} |")
        if model in MFU_TARGETS and "fused+compile" in mfu:
            got, target = mfu["fused+compile"], MFU_TARGETS[model]
            verdict = "met" if got >= target else "MISSED"
            print(
                f"target: {model} fused+compile MFU {100 * got:.1f}% >= {100 * target:.0f}%: "
                f"{verdict}"
            )
        det = "fused+compile+deterministic"
        if det in times and "fused+compile" in times:
            cost = statistics.median(times[det]) / statistics.median(times["fused+compile"])
            print(f"--deterministic costs {100 * (cost - 1):+.1f}% step time over fused+compile")


def exactness(args: argparse.Namespace) -> None:
    from octlm.tools.rundiff import diff_runs
    from octlm.tools.verify import format_table, verify_resume

    model = args.models.split(",")[0]
    flags = {"fused": "fused" in args.variants, "compile": "compile" in args.variants}
    for deterministic in (False, True):
        cfg = gpu_config(model, args, args.steps, deterministic=deterministic, **flags)
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
    from octlm.tools import subrun

    if not args.device.startswith("cuda") or torch.cuda.device_count() < 2:
        print(f"\nNCCL: skipped ({torch.cuda.device_count()} GPU visible, needs 2)")
        return
    model = args.models.split(",")[0]
    for parallel in ("ddp", "fsdp"):
        cfg = gpu_config(model, args, args.steps, deterministic=True, parallel=parallel)
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


def profile(args: argparse.Namespace) -> None:
    """One run of the first model (fused AdamW) with --profile-steps and, on CUDA,
    --memory-snapshot: the files land in --profile-out for the first GPU run to bring back."""
    model = args.models.split(",")[0]
    out = Path(args.profile_out) / model
    window = f"{min(4, args.steps)}:{min(6, args.steps)}"
    cuda = args.device.startswith("cuda")
    cfg = gpu_config(model, args, args.steps, fused=True, profile_steps=window)
    train(cfg.replace(out=str(out), memory_snapshot=cuda))
    table = (out / "profile" / "ops.txt").read_text().splitlines()
    files = sorted(path.name for path in (out / "profile").iterdir())
    print(f"\nprofile of {model}, steps {window}: {files}")
    print("\n".join(table[:16]))


def doc_mask(args: argparse.Namespace) -> None:
    """--doc-mask's CUDA path: FlexAttention with a block mask against SDPA with the dense
    mask (logits and, on CUDA, gradients; flex has no CPU backward), their forward + backward
    times interleaved, then verify-resume of a --packing bos --doc-mask run."""
    from octlm.tools.verify import format_table, verify_resume

    model_name = args.models.split(",")[0]
    torch.manual_seed(0)
    model = GPT(preset(model_name, context=args.context)).to(args.device)
    cuda = args.device.startswith("cuda")
    B, T = args.micro_batch, args.context
    x = torch.randint(3, model.config.vocab_size, (B, T), device=args.device)
    lengths = torch.randint(16, max(17, T // 2), (B, 64))  # documents of 16 .. T/2 tokens
    segments = (torch.cumsum(lengths, 1).unsqueeze(2) <= torch.arange(T)).sum(1) + 1
    segments = segments.to(args.device)
    results, times = {}, {False: [], True: []}
    for _ in range(args.rounds + 1):  # the first round warms up (flex compiles)
        for flex in (False, True):
            model.flex_segments = flex
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            autocast = torch.autocast(torch.device(args.device).type, torch.bfloat16, enabled=cuda)
            with autocast, torch.set_grad_enabled(cuda):  # flex has no backward on a CPU
                loss, n = model(x, x, segments)
            if cuda:
                (loss / n).backward()
                torch.cuda.synchronize()
            times[flex].append(time.perf_counter() - start)
            grads = {k: p.grad for k, p in model.named_parameters()} if cuda else {}
            results[flex] = (float((loss / n).detach()), grads)
    (dense_loss, dense_grads), (flex_loss, flex_grads) = results[False], results[True]
    worst = max(
        (float((dense_grads[k] - flex_grads[k]).abs().max()) for k in dense_grads), default=0.0
    )
    dense_s, flex_s = (statistics.median(times[f][1:]) for f in (False, True))
    print(
        f"\n--doc-mask, {model_name}, {B} x {T}: loss dense {dense_loss:.6f} flex {flex_loss:.6f}; "
        f"largest gradient difference {worst:.3e}{'' if cuda else ' (CPU: forward only)'}; "
        f"fwd+bwd dense {dense_s * 1e3:.1f} ms, flex {flex_s * 1e3:.1f} ms"
    )
    cfg = gpu_config(
        model_name, args, args.steps, fused=True, packing="bos", doc_mask=True, deterministic=cuda
    )  # on CUDA without --deterministic two straight runs part already (the exactness part)
    summaries, _ = verify_resume(cfg, [args.split], keep=False, echo=lambda _: None)
    print("\n".join(format_table(summaries)))


def recipe_config(args: argparse.Namespace, **changes: Any) -> TrainConfig:
    """`--config recipe` on the device, short; --deterministic on CUDA, where the default
    kernels already part two straight runs (the exactness section)."""
    cuda = args.device.startswith("cuda")
    keys = {"deterministic": cuda, **changes}
    return bench_config(base="recipe", steps=args.steps, device=args.device, **keys)


def recipe(args: argparse.Namespace) -> None:
    """The shipped recipe on the device as shipped (fp32): verify-resume, then Muon's step
    time beside a forward and backward (bench/muon_cost.py's measure, at the recipe's shape)."""
    from octlm.tools.verify import format_table, verify_resume

    shipped = recipe_config(args)
    summaries, _ = verify_resume(shipped, [args.split], keep=False, echo=lambda _: None)
    keys = shipped.to_dict()  # flat keys, whatever sections the config class groups them in
    print(f"\nverify-resume, --config recipe, fp32 as shipped, {keys['device']}:")
    print("\n".join(format_table(summaries)))
    torch.manual_seed(0)
    # bench/quality.py's vocabulary (4096): the class where the recipe was chosen.
    micro_batch, context = keys["micro_batch"], keys["context"]
    shape = preset(keys["model"], vocab_size=4096, context=context, **shipped.shape.resolved())
    model = GPT(shape).to(args.device)
    optimizer = optimizer_for(model, shipped)
    x = torch.randint(0, 4096, (micro_batch, context)).to(args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    times: dict[str, list[float]] = {"fwd+bwd": [], "muon step": []}
    for _ in range(args.rounds * 5 + 2):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss, n = model(x, x.roll(-1, dims=1))
        (loss / n).backward()
        sync()
        middle = time.perf_counter()
        optimizer.step()
        sync()
        times["fwd+bwd"].append(middle - start)
        times["muon step"].append(time.perf_counter() - middle)
    fb, mu = (statistics.median(t[2:]) for t in times.values())  # two warm-ups dropped
    print(
        f"recipe shape, {micro_batch} x {context}, fp32: "
        f"fwd+bwd {fb * 1e3:.2f} ms, "
        f"Muon step {mu * 1e3:.2f} ms ({100 * mu / (fb + mu):.1f}% of a step)"
    )


def recipe_compiled(args: argparse.Namespace) -> None:
    """The shipped recipe in bf16 with --compile: verify-resume."""
    from octlm.tools.verify import format_table, verify_resume

    cfg = recipe_config(args, dtype="bf16", compile=True)
    summaries, _ = verify_resume(cfg, [args.split], keep=False, echo=lambda _: None)
    print(f"\nverify-resume, --config recipe, bf16 + compile, {cfg.hardware.device}:")
    print("\n".join(format_table(summaries)))


SECTIONS = {
    "exactness": exactness,
    "recipe": recipe,
    "recipe_compiled": recipe_compiled,
    "doc_mask": doc_mask,
    "speed": speed,
    "profile": profile,
    "nccl": nccl,
    "determinism": gpu_determinism.determinism,
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="small,main")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--split", type=int, default=6)
    ap.add_argument("--sections", default=",".join(SECTIONS), help="which checks, in this order")
    ap.add_argument("--profile-out", default="gpu-profile", help="folder for the profile run")
    gpu_determinism.add_arguments(ap)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: pass --device cpu for a smoke test")
    names = [n for n in args.sections.split(",") if n]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"unknown section(s) {unknown}: choose from {', '.join(SECTIONS)}")
    if "determinism" in names:
        gpu_determinism.combo_names(args)  # an unknown combination ends here, before any run
    failed = []
    for name in names:
        start = time.perf_counter()
        print(f"\n== {name} ==", flush=True)
        try:
            SECTIONS[name](args)
        except Exception:  # report and go on: one lease, as many answers as it can give
            traceback.print_exc()
            failed.append(name)
        print(f"== {name}: {time.perf_counter() - start:.0f} s", flush=True)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
