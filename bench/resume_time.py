"""Time from process start to the first resumed step, at step 10 and at step 10,000.

    .venv/bin/python -m bench.resume_time [--repeats 5]

A resume must not grow with the step: the data order and the schedule are pure functions of
(seed, step), so nothing is replayed. Setup (untimed): a tiny run on the demo data trained to
step 10 and stopped (checkpoint at 10). The step-10,000 folder is made from it honestly: the
Run is resumed in-process, its counters (TrainState.step/tokens/elapsed and AdamW's
per-parameter `step`) are set to 10,000 and it is saved with `Run.save`, so the checkpoint is
exactly what a run at step 10,000 would write except for the weight values; its log is rebuilt
to the length a real 10,000-step run writes (10,000 `step` records, a `val` and a `hash` record
every 20 steps, the `stop` event), because resuming cuts the log back to the checkpoint's step.
A third folder, step 10,000 with the short 10-step log, separates the log's share.

Timed: `python -m octlm train ... --resume --stop-at STEP+1` as a subprocess on a fresh copy of
each folder (launched as `octlm.tools.subrun` launches every tool's runs: the settings in one
TOML file written beforehand), from just before the process starts to the moment the log holds
the first resumed `step` record (polled every 2 ms); variants interleaved, order alternating
per repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from octlm.config.files import make_config
from octlm.runlog.reader import read_log
from octlm.runlog.writer import RunLog
from octlm.tools import subrun
from octlm.trainer.loop import train
from octlm.trainer.run import build_run, resume

if not __package__:  # run as `python bench/resume_time.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import DATA

FAR = 10_000
SETTINGS = {
    "model": "tiny",
    "steps": 20_000,
    "warmup": 20,
    "lr": 1e-3,
    "micro_batch": 8,
    "accum": 2,
    "context": 128,
    "dtype": "fp32",
    "device": "cpu",
    "val_every": 20,
    "val_batches": 8,
    "ckpt_every": 1000,
}


def synthetic_log(short: list[dict], step: int, tokens_per_step: int) -> str:
    """The log a run stopped at `step` holds: built from a real run's records, renumbered."""
    header = next(r for r in short if r["type"] == "header")
    steps = [r for r in short if r["type"] == "step"]
    dt = statistics.median(
        b["elapsed"] - a["elapsed"] for a, b in zip(steps, steps[1:], strict=False)
    )
    lines = [json.dumps(header)]
    for s in range(step):
        rec = dict(steps[s % len(steps)])
        rec.update(step=s, tokens=(s + 1) * tokens_per_step, elapsed=round((s + 1) * dt, 3))
        lines.append(json.dumps(rec))
        if (s + 1) % SETTINGS["val_every"] == 0:
            val = {"type": "val", "step": s, "val_loss": 5.0, "val_ppl": 148.4, "val_bpb": 2.1}
            lines.append(json.dumps({**val, "val_tokens": 8192, "noise_scale": 1234.5}))
            lines.append(json.dumps({"type": "hash", "step": s, "weights_sha256": "0" * 64}))
    lines.append(json.dumps({"type": "event", "event": "stop", "step": step, "reason": "stop_at"}))
    return "\n".join(lines) + "\n"


def build_folders(root: Path, data: str) -> tuple[dict[str, tuple[Path, int]], Path]:
    """The three run folders (with the step each resumes at), and the TOML file of their
    settings that the timed resumes read."""
    cfg = make_config(None, data=data, progress=False, **SETTINGS)
    config = subrun.write_config(cfg, root / "config.toml")
    near = root / "at-10"
    train(cfg.replace(out=str(near), stop_at=10))
    far = root / "at-10000"
    shutil.copytree(near, far)
    run = build_run(cfg.replace(out=str(far), resume=True))
    resume(run)
    run.state.step = FAR
    run.state.tokens = FAR * run.tokens_per_step
    run.state.elapsed *= FAR / 10
    for state in run.optimizer.state.values():
        state["step"].fill_(FAR)
    run.save()
    run.saver.close()
    short_log = (far / "log.jsonl").read_text(encoding="utf-8")
    records = read_log(far)
    (far / "log.jsonl").write_text(
        synthetic_log(records, FAR, run.tokens_per_step), encoding="utf-8"
    )
    far_short = root / "at-10000-short-log"
    shutil.copytree(far, far_short)
    (far_short / "log.jsonl").write_text(short_log, encoding="utf-8")
    folders = {
        "step 10": (near, 10),
        f"step {FAR:,}": (far, FAR),
        f"step {FAR:,}, 10-step log": (far_short, FAR),
    }
    return folders, config


def first_step_seen(log: Path, step: int) -> bool:
    needle = f'"type": "step", "step": {step},'.encode()
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            return needle in f.read()
    except FileNotFoundError:
        return False


def time_resume(src: Path, step: int, config: Path, work: Path, threads: int) -> float:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    cmd = subrun.train_argv(config, work, "--resume", f"--stop-at={step + 1}")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log = work / "log.jsonl"
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen = None
    while seen is None:
        if first_step_seen(log, step):
            seen = time.perf_counter() - t0
        elif proc.poll() is not None:
            break
        else:
            time.sleep(0.002)
    _, err = proc.communicate()
    if seen is None or proc.returncode != 0:
        raise SystemExit(f"resume failed ({proc.returncode}): {err.decode()[-2000:]}")
    records = read_log(work)
    resumed = [r for r in records if r["type"] == "event" and r.get("event") == "resume"]
    assert resumed and resumed[-1]["step"] == step, resumed
    return seen


def truncate_ms(src: Path, step: int, work: Path, repeats: int) -> float:
    """Median ms of `RunLog.truncate_after(step)` (what a resume does to the log) on a copy."""
    times = []
    for _ in range(repeats):
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        shutil.copy(src / "log.jsonl", work / "log.jsonl")
        t0 = time.perf_counter()
        RunLog(work).truncate_after(step)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the trainer")
    ap.add_argument("--data", default=DATA)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    data = str(Path(args.data).resolve())
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        root = Path(tmp)
        folders, config = build_folders(root, data)
        for name, (path, _) in folders.items():
            n = len((path / "log.jsonl").read_text(encoding="utf-8").splitlines())
            size = sum(p.stat().st_size for p in (path / "checkpoints").glob("*.safetensors"))
            print(f"{name}: log {n:,} lines, checkpoints {size / 1e6:.1f} MB ({path.name})")
        times: dict[str, list[float]] = {name: [] for name in folders}
        for r in range(args.repeats):
            names = list(folders) if r % 2 == 0 else list(reversed(folders))
            for name in names:
                path, step = folders[name]
                times[name].append(time_resume(path, step, config, root / "work", args.threads))
            print(f"repeat {r}: " + "  ".join(f"{n} {times[n][-1]:.3f} s" for n in folders))
        trunc = {
            name: truncate_ms(path, step, root / "trunc", args.repeats)
            for name, (path, step) in folders.items()
        }
    base = "step 10"
    print(
        "\n| resumed at | seconds to first resumed step (median) | range | "
        "time / step-10 time (median paired) | its log cut (truncate_after), in-process ms |"
    )
    print("|---|---:|---|---:|---:|")
    for name, ts in times.items():
        ratio = statistics.median(a / b for a, b in zip(ts, times[base], strict=True))
        print(
            f"| {name} | {statistics.median(ts):.3f} | {min(ts):.3f} - {max(ts):.3f} | "
            f"{ratio:.3f} | {trunc[name]:.1f} |"
        )


if __name__ == "__main__":
    main()
