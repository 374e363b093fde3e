"""Split-vs-straight: a run stopped at K and resumed in a new process ends bit-identical.

Every run here is a real `python -m octlm train` subprocess on real shards. Each exactness
check has a negative control (a resume with the optimizer state wiped) that must differ, so
the comparison itself is shown able to fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from octlm.runlog import read_log
from octlm.train import checkpoint as ckpt

STEPS = 8


def octlm(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "OCTLM_CACHE": "/nonexistent-octlm-cache"}  # never prepare implicitly
    proc = subprocess.run(
        [sys.executable, "-m", "octlm", *args], capture_output=True, text=True, env=env, **kw
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"octlm {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


def train_args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--model",
        "tiny",
        "--data",
        str(data),
        "--out",
        str(out),
        "--steps",
        str(STEPS),
        "--warmup",
        "3",
        "--lr",
        "3e-3",
        "--context",
        "32",
        "--micro-batch",
        "2",
        "--accum",
        "2",
        "--val-every",
        "3",
        "--val-batches",
        "2",
        "--ckpt-every",
        "5",
        "--dtype",
        "fp32",
        "--no-progress",
        *extra,
    ]


def steps_of(run: Path) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss"], r["grad_norm"]) for r in read_log(run) if r["type"] == "step"]


def end_hash(run: Path) -> str:
    ends = [r for r in read_log(run) if r["type"] == "end"]
    assert len(ends) == 1, "exactly one end record"
    return ends[0]["weights_sha256"]


def optimizer_tensors(run: Path) -> dict[str, torch.Tensor]:
    path, sha = ckpt.find_checkpoint(run)
    _, tensors = ckpt.load_checkpoint(path, sha)
    return ckpt.split_tensors(tensors, "optim.")


@pytest.fixture(scope="module")
def straight(tiny_dataset: Path, tmp_path_factory) -> dict[str, Path]:
    runs = {}
    for dtype in ("fp32", "bf16"):
        out = tmp_path_factory.mktemp(f"straight-{dtype}")
        octlm(*train_args(tiny_dataset, out / "run", "--dtype", dtype))
        runs[dtype] = out / "run"
    return runs


def split_run(data: Path, out: Path, k: int, *extra: str) -> Path:
    stop = octlm(*train_args(data, out, "--stop-at", str(k), *extra))
    assert f"stopped at step {k}" in stop.stderr
    octlm(*train_args(data, out, "--resume", *extra))
    return out


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("k", [2, 3, 6])  # inside warmup, at its edge, in the cosine
def test_split_equals_straight(tiny_dataset, straight, tmp_path, dtype, k) -> None:
    ref = straight[dtype]
    run = split_run(tiny_dataset, tmp_path / "split", k, "--dtype", dtype)
    assert end_hash(run) == end_hash(ref)
    assert steps_of(run) == steps_of(ref)  # every loss and grad norm, bit for bit
    a, b = optimizer_tensors(run), optimizer_tensors(ref)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_log_reads_as_one_run(tiny_dataset, tmp_path) -> None:
    run = split_run(tiny_dataset, tmp_path / "split", 4)
    records = read_log(run)
    steps = [r["step"] for r in records if r["type"] == "step"]
    assert steps == list(range(STEPS))
    vals = [r["step"] for r in records if r["type"] == "val"]
    assert vals == sorted(set(vals)) == [2, 5, 7]
    resumes = [r for r in records if r.get("event") == "resume"]
    assert len(resumes) == 1 and resumes[0]["step"] == 4
    assert records[0]["type"] == "header" and records[-1]["type"] == "end"


def test_control_fresh_optimizer_differs(tiny_dataset, straight, tmp_path) -> None:
    """Negative control: wipe AdamW's moments in the checkpoint, and the run must differ."""
    out = tmp_path / "control"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "4"))
    path, sha = ckpt.find_checkpoint(out)
    meta, tensors = ckpt.load_checkpoint(path, sha)
    wiped = {k: (torch.zeros_like(v) if k.startswith("optim.") else v) for k, v in tensors.items()}
    header = {k: v for k, v in meta.items() if k not in ("format", "format_version")}
    ckpt.save_checkpoint(out, 4, header, wiped)
    octlm(*train_args(tiny_dataset, out, "--resume"))
    assert end_hash(out) != end_hash(straight["fp32"])
    ref_losses = [x[1] for x in steps_of(straight["fp32"])]
    losses = [x[1] for x in steps_of(out)]
    assert losses[:4] == ref_losses[:4] and losses[4:] != ref_losses[4:]


def test_sigterm_checkpoints_and_resumes_exactly(tiny_dataset, straight, tmp_path) -> None:
    out = tmp_path / "sig"
    env = {**os.environ, "OCTLM_CACHE": "/nonexistent-octlm-cache"}
    args = [sys.executable, "-m", "octlm", *train_args(tiny_dataset, out)]
    args[args.index("--steps") + 1] = str(STEPS)
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
    log = out / "log.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline:  # wait for the first step record, then interrupt
        if log.exists() and '"type": "step"' in log.read_text():
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    if "done:" in err:  # the run beat the signal; nothing to resume
        pytest.skip("run finished before SIGTERM arrived")
    assert "SIGTERM" in err and "checkpoint saved" in err
    stopped = [r for r in read_log(out) if r.get("event") == "stop"]
    assert stopped and stopped[0]["reason"] == "SIGTERM"
    octlm(*train_args(tiny_dataset, out, "--resume"))
    assert end_hash(out) == end_hash(straight["fp32"])


def test_resume_refuses_changed_trajectory(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "run"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "2"))
    proc = octlm(*train_args(tiny_dataset, out, "--resume", "--lr", "1e-3"), check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("octlm: error:")
    assert "config fingerprint" in lines[0] and "lr: 0.003 -> 0.001" in lines[0]
    # Intervals are not part of the trajectory: changing them resumes fine.
    octlm(*train_args(tiny_dataset, out, "--resume", "--val-every", "4", "--ckpt-every", "3"))


def test_new_run_refuses_existing_out(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "run"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "1"))
    before = (out / "log.jsonl").read_bytes()
    proc = octlm(*train_args(tiny_dataset, out), check=False)
    assert proc.returncode == 1 and "already holds a run" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (out / "log.jsonl").read_bytes() == before


def test_checkpoint_has_every_state_and_no_pickle(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "run"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "2", "--keep-ckpts"))
    path, sha = ckpt.find_checkpoint(out)
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])  # safetensors: a JSON header, then raw tensor bytes
    meta = json.loads(header["__metadata__"]["octlm"])
    assert meta["format"] == "octlm-checkpoint" and meta["format_version"] == 1
    for key in ("train_state", "sampler", "optimizer", "rng", "fingerprints", "build", "config"):
        assert key in meta
    assert set(meta["fingerprints"]) == {"config", "data", "tokenizer"}
    assert meta["rng"]["python"] and meta["rng"]["numpy"]
    names = set(header) - {"__metadata__"}
    assert "rng.torch_cpu" in names
    assert any(k.endswith(".exp_avg") for k in names) and any(k.startswith("model.") for k in names)
    assert (out / "snapshots" / "step_000002.safetensors").is_file()
    hashed = octlm("hash", str(out / "snapshots" / "step_000002.safetensors")).stdout.split()[0]
    assert hashed == octlm("hash", str(out)).stdout.split()[0]
