"""Checkpoint save/load speed, and the share of wall time validation and checkpoints take.

    .venv/bin/python -m bench.checkpoint_io [--rounds 5] [--fraction-rounds 5] [--log-steps 42]

1. Save and load of a real Run's checkpoint (`ckpt.pack(run.state_dict())` after one real
   step, so the AdamW moments exist) with octlm's `save_checkpoint` / `load_checkpoint`,
   against `torch.save` / `torch.load(weights_only=True)` of the same tensors in the same
   folder, interleaved round by round (the order inside a round alternates). octlm's save is
   atomic and durable (temporary file, fsync, rename, fsync of the folder), checksums the file
   as it writes it (xxh3-128) and rewrites latest.json the same way; its load checks the
   checksum first. So `torch.save` + fsync and a load without the check are shown too, to say
   where the difference goes. With background writes (the default) the loop waits only for the
   private host copy of the state (`ckpt.host_copy`, as `Run.save` takes it), timed as "async:
   loop waits". Files are read back from the page cache (no cache dropping here).
   Models: tiny and the small shape at the demo data's vocabulary 4096 (real Runs), and the
   seed's small (vocabulary 32768, 22.0M parameters; model + AdamW + RNG built directly and
   packed with `ckpt.pack`, as `Run.save` packs a run's state).

2. Validation and checkpoint share of wall time at the seed's intervals (small.toml: validate
   every 20 steps on 40 micro-batches, weights hash at every validation, checkpoint every 40
   with keep_ckpts' snapshot), on a CPU-sized run: small shape, vocabulary 4096, micro-batch 2,
   context 128, accumulation 4 instead of 32 and 5 validation micro-batches instead of 40 (the
   seed's 40:32 ratio of validation to training micro-batches per step is kept, so validation's
   share is the seed's; a checkpoint's share is not, since its cost does not scale with the
   step). (a) `Run.validate`, the hash, and `Run.save` timed against one real step (the loop's
   `advance`), interleaved, with background writes (the default: `Run.save`'s own time plus the
   extra time of the steps that run while the write is in flight) and with
   `--no-async-checkpoint`; (b) real `octlm train` runs' logs, both ways: the `elapsed` gap
   after a validation or checkpoint step minus the median ordinary gap (for a checkpoint, plus
   the excess of the next steps, which run beside a background write). Both are put on the
   seed's 440-step schedule (22 validations, 22 hashes, 11 checkpoints). Last, a projection for
   the seed's GPU run (not a measurement): the measured validation/step ratio plus this disk's
   save time of the 22M checkpoint and snapshot against the 5.27 s step of small.toml's comment
   (524,288 tokens at ~99,500 tok/s).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from octlm.config.files import make_config
from octlm.config.shape import preset
from octlm.config.train import TrainConfig
from octlm.fsutil import fsync_path
from octlm.hashing import weights_sha256
from octlm.model.gpt import GPT
from octlm.runlog.reader import read_log
from octlm.trainer import checkpoint as ckpt
from octlm.trainer.loop import advance, train
from octlm.trainer.run import Run, build_run
from octlm.trainer.saver import BackgroundSaver
from octlm.trainer.state import rng_state_dict

if not __package__:  # run as `python bench/checkpoint_io.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import DATA
from bench.common import optimizer_for

SEED_STEPS, SEED_VAL_EVERY, SEED_CKPT_EVERY = 440, 20, 40
SEED_STEP_SECONDS = 524_288 / 99_500  # the shipped small config: ~99,500 tokens/s on the seed's GPU


def run_config(model: str, out: Path, data: str, **overrides):
    values = dict(
        model=model,
        data=data,
        out=str(out),
        steps=SEED_STEPS,
        warmup=20,
        micro_batch=2,
        accum=1,
        context=128,
        dtype="fp32",
        device="cpu",
        progress=False,
        val_every=SEED_VAL_EVERY,
        val_batches=40,
        ckpt_every=SEED_CKPT_EVERY,
    )
    values.update(overrides)
    return make_config(None, **values)


def one_step(run: Run) -> None:
    """One optimizer step exactly as the loop takes it (without logging)."""
    advance(run, validating=False)


def seed_small_state(meta: dict) -> tuple[dict, dict[str, torch.Tensor], float]:
    """The seed's small model (vocabulary 32768) after one AdamW step on random tokens, as the
    metadata and tensors `Run.save` packs (the rest of the run's state borrowed from a Run's
    meta), and the median seconds that gathering and packing take."""
    torch.manual_seed(0)
    model = GPT(preset("small", context=128))
    opt = optimizer_for(model, make_config(None, model="small"))
    x = torch.randint(0, model.config.vocab_size, (1, 128))
    loss, _ = model(x, x)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

    keys = (ckpt.TRAIN_STATE, ckpt.SAMPLER, *ckpt.IDENTITY_KEYS)
    borrowed = {key: meta.get(key) for key in keys}  # init_from: absent when unset
    borrowed["model_config"] = model.config.to_dict()

    def gather():
        state = {  # as Run.state_dict gives it in one process
            ckpt.MODEL: model.state_dict(),
            ckpt.OPTIMIZER: opt.state_dict(),
            ckpt.SCALER: None,
            ckpt.RNG: [rng_state_dict()],
            **borrowed,
        }
        return ckpt.pack(state)  # type: ignore[arg-type]

    seconds = statistics.median(timed(gather) for _ in range(3))
    packed_meta, tensors = gather()
    return packed_meta, tensors, seconds


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def touch(tensors: dict[str, torch.Tensor]) -> None:
    """Read one byte of every 4 KiB page of every tensor: safetensors maps the file lazily, so
    this is where its bytes are read; for torch.load's copies it is a cheap strided sum."""
    for t in tensors.values():
        t.reshape(-1).view(torch.uint8)[::4096].sum()


def io_rounds(name, meta, tensors, folder: Path, rounds: int) -> dict[str, list[float]]:
    a_dir, b_dir = folder / f"{name}-octlm", folder / f"{name}-plain"
    a_dir.mkdir()
    b_dir.mkdir()
    plain, raw = b_dir / "plain.pt", b_dir / "plain.safetensors"
    step = meta["train_state"]["step"]
    path = a_dir / ckpt.CKPT_DIR / f"step_{step:06d}.safetensors"

    def save_c():
        torch.save(tensors, plain)
        fsync_path(plain)

    def load_octlm(check: bool):
        def load():
            expected = ckpt.read_latest(a_dir)[-1]["checksum"] if check else None
            touch(ckpt.load_checkpoint(path, expected)[1])

        return load

    jobs = {
        "save octlm": lambda: ckpt.save_checkpoint(a_dir, step, meta, tensors),
        "async copy": lambda: ckpt.host_copy(meta, tensors),
        "save safetensors": lambda: save_file(tensors, str(raw)),
        "save torch": lambda: torch.save(tensors, plain),
        "save torch+fsync": save_c,
        "load octlm": load_octlm(True),
        "load octlm, no check": load_octlm(False),
        "load torch": lambda: touch(torch.load(plain, weights_only=True)),
    }
    for job in jobs.values():  # warm-up: files exist, page cache filled
        job()
    times: dict[str, list[float]] = {k: [] for k in jobs}
    for r in range(rounds):
        order = list(jobs) if r % 2 == 0 else list(reversed(jobs))
        for key in order:
            times[key].append(timed(jobs[key]))
    times["_bytes"] = [float(path.stat().st_size), float(plain.stat().st_size)]
    return times


def paired(t: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(t[a], t[b], strict=True))


def checkpoint_io(args, tmp: Path) -> dict[str, float]:
    print("== 1. checkpoint save/load: octlm against torch.save/load, same tensors, same disk")
    states = {}
    for model in ("tiny", "small"):
        run = build_run(run_config(model, tmp / f"run-{model}", args.data, context=args.context))
        one_step(run)
        states[f"{model} (vocab 4096)"] = ckpt.pack(run.state_dict())
        if model == "small":
            seed_meta = states[f"{model} (vocab 4096)"][0]
            *state, gather = seed_small_state(seed_meta)
            states["small (seed, vocab 32768)"] = tuple(state)
        del run
    results = {}
    for i, (name, (meta, tensors)) in enumerate(states.items()):
        results[name] = io_rounds(f"m{i}", meta, tensors, tmp, args.rounds)
    print(
        "save (seconds, medians; ratios are medians of paired rounds; MB/s of octlm's file)\n"
        "| model | MB | octlm save_checkpoint | safetensors save_file | torch.save | "
        "torch.save + fsync | octlm / torch.save | octlm / (torch.save + fsync) | octlm MB/s | "
        "async: loop waits (host copy) s | async wait / torch.save |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    save_seconds = {}
    for name, t in results.items():
        med = {k: statistics.median(v) for k, v in t.items() if not k.startswith("_")}
        mb = t["_bytes"][0] / 1e6
        save_seconds[name] = med["save octlm"]
        save_seconds[f"{name} copy"] = med["async copy"]
        print(
            f"| {name} | {mb:.1f} | {med['save octlm']:.3f} | {med['save safetensors']:.3f} | "
            f"{med['save torch']:.3f} | {med['save torch+fsync']:.3f} | "
            f"{paired(t, 'save octlm', 'save torch'):.2f} | "
            f"{paired(t, 'save octlm', 'save torch+fsync'):.2f} | {mb / med['save octlm']:,.0f} | "
            f"{med['async copy']:.3f} | {paired(t, 'async copy', 'save torch'):.2f} |"
        )
    print(
        "load, then read every page of every tensor (page cache warm)\n"
        "| model | octlm load_checkpoint (checksum check) | octlm without the check | "
        "torch.load | octlm / torch.load | octlm without check / torch.load | octlm MB/s |\n"
        "|---|---:|---:|---:|---:|---:|---:|"
    )
    for name, t in results.items():
        med = {k: statistics.median(v) for k, v in t.items() if not k.startswith("_")}
        mb = t["_bytes"][0] / 1e6
        print(
            f"| {name} | {med['load octlm']:.3f} | {med['load octlm, no check']:.3f} | "
            f"{med['load torch']:.3f} | {paired(t, 'load octlm', 'load torch'):.2f} | "
            f"{paired(t, 'load octlm, no check', 'load torch'):.2f} | "
            f"{mb / med['load octlm']:,.0f} |"
        )
    save_seconds["seed gather"] = gather
    return save_seconds


def snapshot_seconds(tmp: Path, rounds: int) -> tuple[float, float]:
    """keep_ckpts' weights-only snapshot of the seed's small model, as Run.save writes it."""
    model = GPT(preset("small", context=128))
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    times = [
        timed(lambda: ckpt.save_snapshot(tmp / "snap", 40, tensors, {"x": 1}))
        for _ in range(rounds)
    ]
    hashes = [timed(lambda: weights_sha256(tensors)) for _ in range(rounds)]
    return statistics.median(times), statistics.median(hashes)


def fraction(n_val, n_hash, n_ckpt, t_val, t_hash, t_save, t_step, steps=SEED_STEPS) -> float:
    extra = n_val * t_val + n_hash * t_hash + n_ckpt * t_save
    return extra / (steps * t_step + extra)


def seed_counts() -> tuple[int, int, int]:
    """Validations, hashes (including the end record's) and checkpoints of the seed's run."""
    n_val = SEED_STEPS // SEED_VAL_EVERY
    n_hash = n_val  # one per validation but the last, plus the `end` record's
    n_ckpt = SEED_STEPS // SEED_CKPT_EVERY  # the last one is also the final save
    return n_val, n_hash, n_ckpt


def shrunk_overrides(args) -> dict:
    return dict(
        micro_batch=args.fraction_micro_batch,
        accum=args.fraction_accum,
        context=args.fraction_context,
        val_batches=args.fraction_val_batches,
        keep_ckpts=True,
    )


def eval_ckpt_fraction(
    args, tmp: Path, seed_save: float, seed_copy: float, seed_hash: float
) -> None:
    ov = shrunk_overrides(args)
    print(
        f"\n== 2. validation + checkpoint share at the seed's intervals (small shape, vocab 4096, "
        f"{ov['micro_batch']} x {ov['context']} x accum {ov['accum']}, {ov['val_batches']} val "
        f"micro-batches; val every {SEED_VAL_EVERY}, hash at each, checkpoint + snapshot every "
        f"{SEED_CKPT_EVERY}, {SEED_STEPS} steps)"
    )
    run = build_run(run_config("small", tmp / "fraction", args.data, **ov))
    savers = {"background": run.saver, "in line": BackgroundSaver(background=False)}
    one_step(run)  # warm-up
    run.validate()
    rows: dict[str, list[tuple[float, ...]]] = {k: [] for k in savers}
    for r in range(args.fraction_rounds):
        for mode in list(savers) if r % 2 == 0 else list(reversed(savers)):
            run.saver = savers[mode]
            t_step = timed(lambda: one_step(run))
            t_val = timed(run.validate)
            t_hash = timed(lambda: weights_sha256(run.full_model_state()))
            t_save = timed(run.save)
            t_beside = 0.0  # the steps that run beside a background write, over t_step
            while run.saver.busy:
                t_beside += timed(lambda: one_step(run)) - t_step
            t_save += t_beside + timed(run.saver.wait)
            rows[mode].append((t_step, t_val, t_hash, t_save))
    run.saver = savers["background"]
    n_val, n_hash, n_ckpt = seed_counts()
    print("(a) timed against a step, medians of paired rounds:")
    print(
        "| checkpoint writes | step s | validate s | val/step | hash s | Run.save s (with the "
        "steps beside it) | save/step | share of wall |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode, mode_rows in rows.items():
        t_step, t_val, t_hash, t_save = (statistics.median(c) for c in zip(*mode_rows, strict=True))
        fr = statistics.median(fraction(n_val, n_hash, n_ckpt, *x[1:], x[0]) for x in mode_rows)
        val_only = statistics.median(fraction(n_val, 0, 0, x[1], 0, 0, x[0]) for x in mode_rows)
        print(
            f"| {mode} | {t_step:.3f} | {t_val:.3f} | "
            f"{statistics.median(x[1] / x[0] for x in mode_rows):.3f} | {t_hash:.4f} | "
            f"{t_save:.3f} | {statistics.median(x[3] / x[0] for x in mode_rows):.3f} | "
            f"{fr:.2%} (validation alone {val_only:.2%}) |"
        )
    val_ratio = statistics.median(x[1] / x[0] for x in rows["background"] + rows["in line"])
    if args.log_steps:
        log_fraction(args, tmp, n_val, n_hash, n_ckpt)
    t_val = val_ratio * SEED_STEP_SECONDS
    proj = fraction(n_val, n_hash, n_ckpt, t_val, seed_hash, seed_save, SEED_STEP_SECONDS)
    proj_bg = fraction(n_val, n_hash, n_ckpt, t_val, seed_hash, seed_copy, SEED_STEP_SECONDS)
    print(
        f"\nprojection for the seed's GPU run (not measured): step {SEED_STEP_SECONDS:.2f} s, "
        f"validation {val_ratio:.3f} x step (measured above), weights hash of the 22M model "
        f"{seed_hash:.3f} s; its checkpoint + snapshot written in line {seed_save:.3f} s "
        f"(gather + save + snapshot) -> {proj:.2%} of wall time; in the background the loop "
        f"waits for the host copy, {seed_copy:.3f} s here (a GPU adds its device-to-host copy, "
        f"not measured) -> {proj_bg:.2%} (target <= 2.4%)"
    )


BESIDE = 3  # steps after a checkpoint whose excess is counted: they run beside its write


def log_fraction(args, tmp: Path, n_val: int, n_hash: int, n_ckpt: int) -> None:
    for i, background in enumerate((True, False, True, False)[: 2 * args.log_runs]):
        out = tmp / f"logrun{i}"
        cfg = run_config(
            "small",
            out,
            args.data,
            stop_at=args.log_steps,
            async_checkpoint=background,
            **shrunk_overrides(args),
        )
        train(cfg)
        mode = "background" if background else "in line"
        print(f"(b{i + 1}) checkpoint writes {mode}:")
        log_shares(read_log(out), cfg, n_val, n_hash, n_ckpt)


def log_shares(records: list[dict], cfg: TrainConfig, n_val: int, n_hash: int, n_ckpt: int) -> None:
    keys = cfg.to_dict()  # flat keys, whatever sections the config class groups them in
    steps = [r for r in records if r["type"] == "step"]
    gaps = {b["step"]: b["elapsed"] - a["elapsed"] for a, b in zip(steps, steps[1:], strict=False)}
    # gap[s + 1] holds step s + 1 and everything done after step s.
    val_steps = {s + 1 for s in range(len(steps)) if (s + 1) % SEED_VAL_EVERY == 0}
    ckpt_steps = {s + 1 for s in range(len(steps)) if (s + 1) % SEED_CKPT_EVERY == 0}
    after_ckpt = {s + k for s in ckpt_steps for k in range(1, BESIDE + 1)}
    ordinary = [
        g for s, g in gaps.items() if s > 1 and s not in val_steps | ckpt_steps | after_ckpt
    ]
    base = statistics.median(ordinary)
    print(
        f"(b) a real `octlm train` run, {len(steps)} steps ({keys['micro_batch']} x "
        f"{keys['context']} x accum {keys['accum']}): median ordinary step gap {base:.3f} s "
        f"(range {min(ordinary):.3f} - {max(ordinary):.3f})"
    )
    print("| after step | what | gap s | extra over a step s | extra / step |")
    print("|---:|---|---:|---:|---:|")
    val_extra, ckpt_extra = [], []
    for s in sorted(val_steps | ckpt_steps):
        if s not in gaps:
            continue
        what = "val + hash" + (" + checkpoint + snapshot" if s in ckpt_steps else "")
        extra = gaps[s] - base
        if s in ckpt_steps:
            what += f" (and the next {BESIDE} steps)"
            extra += sum(gaps[s + k] - base for k in range(1, BESIDE + 1) if s + k in gaps)
        (ckpt_extra if s in ckpt_steps else val_extra).append(extra)
        print(f"| {s - 1} | {what} | {gaps[s]:.3f} | {extra:.3f} | {extra / base:.3f} |")
    if val_extra and ckpt_extra:
        t_vh = statistics.median(val_extra)
        t_save = statistics.median(ckpt_extra) - t_vh
        fr = fraction(n_val, n_hash, n_ckpt, t_vh, 0.0, t_save, base)
        print(f"share of wall on the seed's schedule, from this log: {fr:.2%}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dir", default="runs", help="where the files go (default: runs/)")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--fraction-rounds", type=int, default=5)
    ap.add_argument("--fraction-micro-batch", type=int, default=2)
    ap.add_argument("--fraction-context", type=int, default=128)
    ap.add_argument("--fraction-accum", type=int, default=4)
    ap.add_argument("--fraction-val-batches", type=int, default=5)
    ap.add_argument("--log-steps", type=int, default=45, help="0 = skip the real-run log check")
    ap.add_argument("--log-runs", type=int, default=1, help="pairs of real runs (1 or 2)")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    try:
        print(f"threads {torch.get_num_threads()}, files in {tmp}")
        saves = checkpoint_io(args, tmp)
        snap, seed_hash = snapshot_seconds(tmp, 3)
        seed_save = saves["small (seed, vocab 32768)"] + saves["seed gather"] + snap
        print(
            f"seed small (22.0M): gathering the checkpoint's tensors {saves['seed gather']:.3f} s, "
            f"weights-only snapshot {snap:.3f} s, weights_sha256 {seed_hash:.3f} s"
        )
        seed_copy = saves["seed gather"] + saves["small (seed, vocab 32768) copy"]
        eval_ckpt_fraction(args, tmp, seed_save, seed_copy, seed_hash)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
