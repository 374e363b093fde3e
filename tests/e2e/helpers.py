"""Helpers the end-to-end modules share: the `octlm` CLI in a subprocess, the standard tiny
training arguments, and readers for a finished run's log and checkpoints.

Test modules import from here, never from each other.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

from octlm.config.files import make_config
from octlm.runlog.reader import read_log
from octlm.trainer import checkpoint as ckpt
from tests import octlm_process

STEPS = 8
QUICK_CONTEXT = 32
QUICK_RUN = ("--context", str(QUICK_CONTEXT), "--micro-batch", "2", "--accum", "1", "--warmup", "1")
QUICK_RUN += ("--lr", "3e-3", "--dtype", "fp32", "--val-every", "0", "--val-batches", "1")
QUICK_RUN += ("--ckpt-every", "0", "--no-async-checkpoint", "--no-progress")
"""A few steps' settings without validation or checkpoints but the last (init-from tests)."""


def octlm(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """`python -m octlm ARGS` in a new process (tests/octlm_process.py); `kw`: cwd, timeout,
    input, as subprocess.run takes them."""
    env = {**os.environ, "OCTLM_CACHE": "/nonexistent-octlm-cache"}  # never prepare implicitly
    proc = octlm_process.run(list(args), env, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"octlm {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


NAN_SITE = """
import sys

if {marker!r} in sys.argv:
    from octlm.trainer import step as step_module

    real = step_module._backward

    def poisoned(setup, *args):
        loss, z_term = real(setup, *args)
        return loss * float("nan"), z_term

    step_module._backward = poisoned
"""


def nan_loss_pythonpath(folder: Path, marker: str) -> str:
    """A PYTHONPATH (the current one after it) whose sitecustomize makes the loss NaN at every
    step, after the real forward and backward, in each octlm process whose command line holds
    `marker`: a non-finite run on every machine, where a high learning rate would diverge or
    not by the CPU's rounding (test_crash.py poisons in-process the same way)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(NAN_SITE.format(marker=marker))
    return os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)


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


DIST_STEPS = 6
DIST_FLAGS = ("--steps", str(DIST_STEPS), "--warmup", "2", "--ckpt-every", "2")
"""What `dist_args` adds to `train_args`."""


def dist_args(data: Path, out: Path, *extra: str) -> list[str]:
    """A 6-step tiny run for the multi-process tests (DDP/FSDP, nodes, faults); give --accum."""
    return train_args(data, out, *DIST_FLAGS, *extra)


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


def split_run(data: Path, out: Path, k: int, *extra: str) -> Path:
    stop = octlm(*train_args(data, out, "--stop-at", str(k), *extra))
    assert f"stopped at step {k}" in stop.stderr
    octlm(*train_args(data, out, "--resume", *extra))
    return out


def assert_same_run(run: Path, ref: Path) -> None:
    assert end_hash(run) == end_hash(ref)
    assert steps_of(run) == steps_of(ref)
    a, b = optimizer_tensors(run), optimizer_tensors(ref)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def listed(out: Path) -> list[dict]:
    return json.loads((out / "checkpoints" / "latest.json").read_text())["checkpoints"]


def run_cfg(data: Path, out: Path, **kw):
    base = dict(
        model="tiny",
        data=str(data),
        out=str(out),
        steps=6,
        warmup=2,
        lr=3e-3,
        context=32,
        micro_batch=2,
        accum=2,
        dtype="fp32",
        val_every=0,
        ckpt_every=2,
        progress=False,
    )
    return make_config(None, **{**base, **kw})


def stop_a_worker_and_read(proc: subprocess.Popen, pid: int) -> tuple[int, str]:
    """SIGSTOP worker `pid` of the launcher `proc`, read the launcher's stderr to its end, and
    return (exit code, stderr). The worker is woken (SIGCONT) at the first error line, as
    whoever stopped it would: the agent, stopping the group after the failure, otherwise waits
    30 s for it to end before it kills it (it may have killed it already: nothing to wake)."""
    import contextlib
    import signal

    os.kill(pid, signal.SIGSTOP)
    err = ""
    try:
        for line in proc.stderr:  # type: ignore[union-attr]
            err += line
            if line.startswith("octlm: error:"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        return proc.wait(timeout=120), err
    finally:
        with contextlib.suppress(ProcessLookupError):  # the agent may have killed it
            os.kill(pid, signal.SIGCONT)
