"""Crash safety: damaged checkpoints, auto-resume, the run lock, non-finite steps, save faults.

Subprocess runs for what a user does; in-process runs with an injected OSError for the faults
that cannot be caused for real (a disk filling at an exact point of the save protocol).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

import pytest

from octlm.errors import OctlmError
from octlm.hashing import file_checksum
from octlm.runlog.reader import read_log
from octlm.trainer import checkpoint as ckpt
from octlm.trainer import loop
from octlm.trainer import step as step_module
from tests.e2e.helpers import end_hash, listed, octlm, run_cfg, train_args

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def straight_hash(straight_run) -> str:
    return end_hash(straight_run())


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_newest_checkpoint_falls_back(tiny_dataset, straight_hash, tmp_path, damage):
    out = tmp_path / "run"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "6", "--ckpt-every", "2"))
    entries = listed(out)
    assert [e["step"] for e in entries] == [4, 6]  # keep_last 2: the older ones are gone
    newest = out / "checkpoints" / entries[-1]["file"]
    data = bytearray(newest.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
        newest.write_bytes(bytes(data))
    elif damage == "truncate":
        newest.write_bytes(bytes(data[: len(data) // 3]))
    else:
        newest.unlink()
    proc = octlm(*train_args(tiny_dataset, out, "--resume", "--ckpt-every", "2"))
    notes = [ln for ln in proc.stderr.splitlines() if "falling back" in ln]
    assert len(notes) == 1 and entries[-1]["file"] in notes[0]
    assert "resumed from" in proc.stderr and "step_000004" in proc.stderr
    assert end_hash(out) == straight_hash  # exact, from the older checkpoint


def test_all_checkpoints_damaged_is_a_clear_error(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "run"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "4", "--ckpt-every", "2"))
    for entry in listed(out):
        (out / "checkpoints" / entry["file"]).write_bytes(b"")
    proc = octlm(*train_args(tiny_dataset, out, "--resume"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "none of the 2 checkpoints" in proc.stderr.strip().splitlines()[-1]


def test_resume_on_empty_out_starts_fresh(tiny_dataset, straight_hash, tmp_path) -> None:
    out = tmp_path / "auto"
    proc = octlm(*train_args(tiny_dataset, out, "--resume"))
    assert "starting fresh" in proc.stderr
    assert end_hash(out) == straight_hash
    # The same command again, on a finished run, is harmless.
    again = octlm(*train_args(tiny_dataset, out, "--resume"))
    assert "resumed from" in again.stderr and end_hash(out) == straight_hash


def test_second_trainer_on_the_same_out_refuses(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "locked"
    out.mkdir()
    with open(out / ".lock", "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.write("4242")
        holder.flush()
        proc = octlm(*train_args(tiny_dataset, out), check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"octlm: error: {out} is in use by another trainer (pid 4242); "
        "wait for it to finish, or choose another --out"
    )
    assert not (out / "log.jsonl").exists()
    # A lock file left behind by a dead process (nobody holds the lock) does not block.
    octlm(*train_args(tiny_dataset, out, "--stop-at", "1"))


BAD_STEP = 5
"""The step the poisoned runs below make non-finite: after the checkpoint at step 4."""


def _poison_step(monkeypatch, where: str) -> None:
    """Make step BAD_STEP non-finite on every machine: the real forward and backward run, then
    the step's loss (or one gradient) is replaced by NaN before the loop's own check. A high
    learning rate would diverge at a step that depends on the CPU's rounding."""
    real = step_module._backward
    calls = {"n": 0}

    def poisoned(setup, *args):
        loss, z_term = real(setup, *args)  # z_term: the z-loss's, None without one
        calls["n"] += 1  # one call per optimizer step, in this fresh process
        if calls["n"] == BAD_STEP:
            if where == "loss":
                return loss * float("nan"), z_term
            param = next(p for p in setup.forward.parameters() if p.grad is not None)
            param.grad.view(-1)[0] = float("nan")  # the loss stays finite, the norm does not
        return loss, z_term

    monkeypatch.setattr(step_module, "_backward", poisoned)


@pytest.mark.parametrize("where", ["loss", "grad"])
def test_nonfinite_stops_and_keeps_the_last_good_checkpoint(
    tiny_dataset, tmp_path, monkeypatch, where
):
    out = tmp_path / "nan"
    _poison_step(monkeypatch, where)
    with pytest.raises(OctlmError) as err:
        loop.train(run_cfg(tiny_dataset, out, steps=8, ckpt_every=2))
    assert err.value.problem.startswith(f"non-finite loss or gradient norm at step {BAD_STEP} ")
    assert "--skip-nonfinite" in err.value.fix
    assert [e["step"] for e in listed(out)] == [2, 4]  # nothing saved at or after the bad step
    path, sha = ckpt.find_checkpoint(out)
    read, _ = ckpt.load_checkpoint(path, sha)  # the kept checkpoint is intact
    meta = read.as_written()
    assert meta["train_state"]["step"] == 4
    events = [r for r in read_log(out) if r.get("event") == "nonfinite"]
    assert [e["step"] for e in events] == [BAD_STEP]
    steps = [r["step"] for r in read_log(out) if r["type"] == "step"]
    assert steps == [1, 2, 3, 4]


def test_skip_nonfinite_skips_only_the_poisoned_step(tiny_dataset, tmp_path, monkeypatch):
    skip = tmp_path / "skip"
    _poison_step(monkeypatch, "loss")
    loop.train(run_cfg(tiny_dataset, skip, steps=8, skip_nonfinite=True))
    records = read_log(skip)
    skipped = [r for r in records if r["type"] == "step" and r.get("skipped")]
    assert [(r["step"], r["skipped_steps"]) for r in skipped] == [(BAD_STEP, 1)]
    assert records[-1]["type"] == "end"


def test_allow_config_change(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "more"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "4"))
    refused = octlm(*train_args(tiny_dataset, out, "--resume", "--steps", "10"), check=False)
    assert refused.returncode == 1 and "--steps 8 -> 10" in refused.stderr
    assert "--allow-config-change" in refused.stderr
    octlm(*train_args(tiny_dataset, out, "--resume", "--steps", "10", "--allow-config-change"))
    records = read_log(out)
    assert [r["step"] for r in records if r["type"] == "step"] == list(range(1, 11))
    resume = [r for r in records if r.get("event") == "resume"][0]
    assert any("no longer exact" in note for note in resume["notes"])


# -- write faults at each point of the save protocol (injected: a full disk cannot be timed) ---


@pytest.mark.parametrize("point", ["write", "rename", "dir_fsync"])
def test_save_fault_keeps_previous_checkpoint(tiny_dataset, tmp_path, monkeypatch, point):
    out = tmp_path / "fault"
    disk_full = OSError(errno.ENOSPC, "No space left on device")

    def second_save_fails(real):
        def wrapper(*args, **kwargs):
            if any("step_000004" in str(a) for a in args):  # the second checkpoint's save
                raise disk_full
            return real(*args, **kwargs)

        return wrapper

    if point == "write":
        monkeypatch.setattr(ckpt, "write_safetensors", second_save_fails(ckpt.write_safetensors))
    elif point == "rename":
        monkeypatch.setattr("octlm.fsutil.os.replace", second_save_fails(os.replace))
    else:  # fail the folder fsync right after the checkpoint's rename
        import octlm.fsutil as fsutil

        real_replace, real_fsync = os.replace, fsutil.fsync_path
        calls = {"armed": False}

        def replace(src, dst):
            real_replace(src, dst)
            calls["armed"] = "step_000004" in str(dst)

        def fsync(path):
            if calls["armed"] and Path(path).is_dir():
                raise disk_full
            return real_fsync(path)

        monkeypatch.setattr("octlm.fsutil.os.replace", replace)
        monkeypatch.setattr(fsutil, "fsync_path", fsync)
    with pytest.raises(OSError):
        loop.train(run_cfg(tiny_dataset, out))
    monkeypatch.undo()
    assert [e["step"] for e in listed(out)] == [2]  # the list still names the good one
    path, sha = ckpt.find_checkpoint(out)
    read, _ = ckpt.load_checkpoint(path, sha)
    meta = read.as_written()
    assert meta["train_state"]["step"] == 2
    assert not list((out / "checkpoints").glob(".*.tmp-*"))
    # And the run resumes from it to the same bits as a run that never failed.
    loop.train(run_cfg(tiny_dataset, out, resume=True))
    ref = tmp_path / "ref"
    loop.train(run_cfg(tiny_dataset, ref))
    assert end_hash(out) == end_hash(ref)


def test_unwritable_out_is_one_line(tiny_dataset, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = octlm(*train_args(tiny_dataset, blocker / "run"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("octlm: error:") and str(blocker) in lines[0]
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("kind", ["empty", "not_safetensors", "newer_format"])
def test_bad_checkpoint_files_are_one_line(tiny_dataset, tmp_path, kind) -> None:
    bad = tmp_path / "bad.safetensors"
    if kind == "empty":
        bad.write_bytes(b"")
    elif kind == "not_safetensors":
        bad.write_text("hello, I am text")
    else:
        out = tmp_path / "run"
        octlm(*train_args(tiny_dataset, out, "--stop-at", "1"))
        path, sha = ckpt.find_checkpoint(out)
        read, tensors = ckpt.load_checkpoint(path, sha)
        meta = read.as_written()
        from safetensors.torch import save_file

        save_file(tensors, str(bad), metadata={"octlm": json.dumps({**meta, "format_version": 99})})
    proc = octlm("eval", str(bad), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("octlm: error:")
    if kind == "newer_format":
        assert "format version 99" in lines[0] and "upgrade octlm" in lines[0]


def test_misspelled_flag_is_one_line() -> None:
    proc = octlm("train", "--setps", "5", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unrecognized arguments: --setps" in lines[0]


def test_chaos_few_kills(tiny_dataset, tmp_path) -> None:
    """bench/chaos.py with a few SIGKILLs (some mid-save) ends bit-identical."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    config = tmp_path / "c.toml"
    config.write_text(
        'model = "tiny"\nsteps = 16\nwarmup = 2\nlr = 3e-3\ncontext = 32\nmicro_batch = 2\n'
        'accum = 2\ndtype = "fp32"\nval_every = 4\nval_batches = 1\n'
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "bench" / "chaos.py"),
            "--kills",
            "4",
            "--config",
            str(config),
            "--data",
            str(tiny_dataset),
            "--ckpt-every",
            "2",
            "--min-delay",
            "1.5",
            "--max-delay",
            "3.5",
            "--save-pause",
            "0.2",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "kills survived: 4" in proc.stdout and "\nidentical\n" in proc.stdout


class _Payload:
    """Unpickling this runs code: it would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_without_running(tiny_dataset, tmp_path) -> None:
    import torch

    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.pt"
    torch.save({"model": _Payload(marker)}, evil)
    for command in ("eval", "generate", "hash"):
        extra = ["--prompt", "x"] if command == "generate" else []
        proc = octlm(command, str(evil), *extra, check=False)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert "not a readable checkpoint" in proc.stderr
    # The same file listed (with its true checksum) as a run's newest checkpoint for --resume.
    out = tmp_path / "run"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "2"))
    folder = out / "checkpoints"
    evil_copy = folder / "step_000003.safetensors"
    evil_copy.write_bytes(evil.read_bytes())
    entries = listed(out) + [
        {"file": evil_copy.name, "step": 3, "checksum": file_checksum(evil_copy)}
    ]
    (folder / "latest.json").write_text(json.dumps({"checkpoints": entries}))
    proc = octlm(*train_args(tiny_dataset, out, "--resume"))
    assert "not a readable checkpoint" in proc.stderr and "falling back" in proc.stderr
    assert not marker.exists()
