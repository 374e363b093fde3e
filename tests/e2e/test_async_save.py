"""Background checkpoint writes (the default): a write overlaps the steps after it and still holds
exactly the state of its own step; a failed write stops the run within steps, not at the end."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest
import torch

from octlm.runlog.reader import read_log
from octlm.runlog.writer import RunLog
from octlm.trainer import checkpoint as ckpt
from octlm.trainer import loop
from tests.e2e.helpers import end_hash, listed, run_cfg

pytestmark = pytest.mark.slow


def checkpoint_at(out: Path, step: int) -> tuple[dict, dict[str, torch.Tensor]]:
    entry = next(e for e in listed(out) if e["step"] == step)
    info, tensors = ckpt.load_checkpoint(out / "checkpoints" / entry["file"], entry["checksum"])
    return info.as_written(), tensors


def test_write_overlaps_later_steps_and_holds_its_own_step(tiny_dataset, tmp_path, monkeypatch):
    ref = tmp_path / "sync"
    loop.train(run_cfg(tiny_dataset, ref, async_checkpoint=False, keep_last=10))

    # Hold the step-2 write until the loop has logged two more steps: only a write that runs
    # beside the loop can see that happen (a synchronous one would time out).
    later_steps_logged = threading.Event()
    real_log_write, real_save = RunLog.write, ckpt.save_checkpoint
    seen: dict[int, bool] = {}

    def log_write(self, kind, **record):
        real_log_write(self, kind, **record)
        if kind == "step" and record["step"] >= 4:  # steps 3 and 4 done after the step-2 save
            later_steps_logged.set()

    def held_save(run_dir, step, meta, tensors, keep_last):
        if step == 2:
            seen[step] = later_steps_logged.wait(timeout=20)
        return real_save(run_dir, step, meta, tensors, keep_last=keep_last)

    monkeypatch.setattr(RunLog, "write", log_write)
    monkeypatch.setattr(ckpt, "save_checkpoint", held_save)
    out = tmp_path / "async"
    loop.train(run_cfg(tiny_dataset, out, keep_last=10))
    monkeypatch.undo()

    assert seen == {2: True}, "the step-2 checkpoint was not written beside steps 3 and 4"
    assert [e["step"] for e in listed(out)] == [2, 4, 6]
    for step in (2, 4, 6):  # a private copy: later steps changed nothing in it
        (meta_a, a), (meta_s, s) = checkpoint_at(out, step), checkpoint_at(ref, step)
        assert a.keys() == s.keys()
        assert all(torch.equal(a[k], s[k]) for k in a), f"step {step} differs"
        clock = {"elapsed"}  # wall time, the one thing two runs never share
        assert {k: v for k, v in meta_a["train_state"].items() if k not in clock} == {
            k: v for k, v in meta_s["train_state"].items() if k not in clock
        }
        assert meta_a["rng"] == meta_s["rng"] and meta_a["sampler"] == meta_s["sampler"]
    assert end_hash(out) == end_hash(ref)


def test_failed_background_write_stops_the_run_soon(tiny_dataset, tmp_path, monkeypatch):
    real_save = ckpt.save_checkpoint

    def fails_at_8(run_dir, step, meta, tensors, keep_last):
        if step == 8:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(run_dir, step, meta, tensors, keep_last=keep_last)

    monkeypatch.setattr(ckpt, "save_checkpoint", fails_at_8)
    out = tmp_path / "full"
    with pytest.raises(OSError, match="No space"):
        loop.train(run_cfg(tiny_dataset, out, steps=16, ckpt_every=4))
    monkeypatch.undo()
    steps = [r["step"] for r in read_log(out) if r["type"] == "step"]
    # Noticed by the per-step check, not first by the step-12 save waiting for it.
    assert 8 <= max(steps) < 12
    assert [e["step"] for e in listed(out)] == [4]
    assert not list((out / "checkpoints").glob(".*.tmp-*"))
    loop.train(run_cfg(tiny_dataset, out, steps=16, ckpt_every=4, resume=True))
    ref = tmp_path / "ref"
    loop.train(run_cfg(tiny_dataset, ref, steps=16, ckpt_every=4))
    assert end_hash(out) == end_hash(ref)
