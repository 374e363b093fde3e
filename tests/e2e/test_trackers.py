"""Trackers on real `octlm train` runs: a run stopped, its newest checkpoint damaged (so the
resume falls back and redoes steps already logged), and resumed, with TensorBoard and W&B
(offline, no key, no network) on, ends with the bits of a straight run without them; the
event files hold exactly the log's values; W&B continued the same run id.
Three subprocesses of the micro model, about 30 s on 2 busy cores."""

from __future__ import annotations

import pytest

from octlm.runlog.reader import read_log
from tests.e2e.helpers import (
    end_hash,
    listed,
    nan_loss_pythonpath,
    octlm,
    steps_of,
    train_args,
)
from tests.trackers_read import (
    expected_scalars,
    log_numbers,
    tb_scalars,
    tb_texts,
    wandb_config,
    wandb_exit_codes,
    wandb_history,
    wandb_numbers,
    wandb_run_ids,
)

pytestmark = pytest.mark.slow
pytest.importorskip("tensorboard")
pytest.importorskip("wandb")

MICRO = ("--model", "micro")
SINKS = ("--log-to", "tensorboard,wandb")


def offline_wandb(tmp_path, monkeypatch) -> None:
    """W&B offline under tmp_path/wandb: no key, no network."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "wandb").mkdir()


def test_split_with_trackers_equals_straight_without(tiny_dataset, tmp_path, monkeypatch):
    offline_wandb(tmp_path, monkeypatch)
    ref, run = tmp_path / "straight", tmp_path / "split"
    octlm(*train_args(tiny_dataset, ref, *MICRO))
    first = octlm(*train_args(tiny_dataset, run, *MICRO, "--stop-at", "7", *SINKS))
    first_log = read_log(run)
    # Damage the newest checkpoint: the resume falls back to the one before, so records the
    # first session logged (and sent to the trackers) are cut from the log and computed again.
    newest = run / "checkpoints" / listed(run)[-1]["file"]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    second = octlm(*train_args(tiny_dataset, run, *MICRO, "--resume", *SINKS))
    assert "falling back" in second.stderr
    assert "warning" not in first.stderr + second.stderr

    assert end_hash(run) == end_hash(ref)  # the sinks changed no bit
    assert steps_of(run) == steps_of(ref)
    log = read_log(run)
    (cut,) = [r["step"] for r in log if r.get("event") == "resume"]
    assert any(r["type"] == "step" and r["step"] >= cut for r in first_log)  # stale ones existed

    # TensorBoard: exactly the log, every step once, nothing stale from the first session.
    assert tb_scalars(run / "tensorboard") == expected_scalars(log)
    assert [s for s, _ in tb_texts(run / "tensorboard", "event")] == [cut]  # stop event purged
    assert len(tb_texts(run / "tensorboard", "end")) == 1

    # W&B offline: one folder per session, the same run id (kept in the run folder), each
    # holding what that session sent. W&B cannot delete: the first still has the stale steps.
    folders = sorted((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    run_id = (run / "wandb_id").read_text().strip()
    assert len(folders) == 2 and all(wandb_run_ids(f) == {run_id} for f in folders)
    assert [wandb_exit_codes(f) for f in folders] == [[0], [0]]  # a stop, then the finish
    first_rows, second_rows = (wandb_numbers(wandb_history(f)) for f in folders)
    assert first_rows == log_numbers(first_log)
    assert second_rows == log_numbers([r for r in log if r.get("step", -1) >= cut])
    header = log[0]["config"]
    assert wandb_config(folders[0])["lr"] == header["lr"]
    assert wandb_config(folders[0])["log_to"] == header["log_to"]


def test_a_run_that_fails_is_marked_failed_in_wandb(tiny_dataset, tmp_path, monkeypatch):
    """A run ended by an error (here the non-finite stop, its loss poisoned) reports a non-zero
    exit code, so W&B shows it failed rather than finished; the control is the test above,
    whose sessions report 0."""
    offline_wandb(tmp_path, monkeypatch)
    out = tmp_path / "nan"
    monkeypatch.setenv("PYTHONPATH", nan_loss_pythonpath(tmp_path / "site", str(out)))
    # A real `python -m octlm`: a fork of tests/octlm_process.py's server would have run its
    # sitecustomize with the server's command line, not the run's.
    monkeypatch.setenv("OCTLM_TEST_FRESH", "1")
    flags = ("--warmup", "0", "--accum", "1")
    proc = octlm(*train_args(tiny_dataset, out, *MICRO, *flags, "--log-to", "wandb"), check=False)
    assert proc.returncode == 1 and "non-finite" in proc.stderr
    (folder,) = (tmp_path / "wandb" / "wandb").glob("offline-run-*")
    assert wandb_exit_codes(folder) == [1]
