"""Trackers fed by a real RunLog, read back with TensorBoard's own reader: every value equals
the log's (as float32), a resume's cut is purged, and a failing tracker is one warning while
the log keeps every record. In-process and a few seconds: no training, just records."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from octlm.config.train import ConfigError, TrainConfig
from octlm.runlog.reader import read_log
from octlm.runlog.writer import RunLog
from octlm.trackers.records import hparams
from octlm.trackers.sinks import Guarded, parse_trackers
from octlm.trackers.tensorboard_sink import TensorBoardSink
from tests.cli_in_process import main
from tests.trackers_read import as_float32, expected_scalars, tb_scalars, tb_texts

pytest.importorskip("tensorboard")


class Meter:
    def tokens_per_second(self, dt: float) -> float:
        return 64 / dt

    def mfu(self, tok_per_s: float) -> float | None:
        return None

    def memory_mb(self) -> float | None:
        return 123.0


def write_steps(log: RunLog, steps: range, salt: float) -> None:
    """Step records, and a val record every third step, whose values depend on `salt`: a
    stale value left in a tracker after a resume would differ from the log's."""
    for s in steps:
        numbers = SimpleNamespace(
            loss=5.0 - s / 10 + salt,
            lr=1e-3 * (s + 1),
            grad_norm=1.1 + salt,
            dt=0.01,
            skipped=False,
            epoch=None,
            z_loss=None,
        )
        state = SimpleNamespace(tokens=64 * (s + 1), elapsed=0.01 * s, skipped_steps=0)
        log.step(s, numbers, state, Meter())
        if s % 3 == 2:
            parts = {"plays": SimpleNamespace(loss=5.4 + salt, bpb=6.3)}  # a --data mixture's
            parts["code"] = SimpleNamespace(loss=5.6 + salt, bpb=6.5)
            ev = SimpleNamespace(loss=5.5 + salt, ppl=244.7 + salt, bpb=6.4, tokens=128)
            ev.sources = parts
            log.val(s, ev, None)


def tb_log(run: Path) -> RunLog:
    return RunLog(run, sinks=[Guarded("tensorboard", lambda: TensorBoardSink(run / "tb"))])


def expected(run: Path) -> dict[str, list[tuple[int, float]]]:
    return expected_scalars(read_log(run))


def test_tensorboard_equals_the_log_after_a_resume_that_drops_steps(tmp_path) -> None:
    first = tb_log(tmp_path)
    first.open()
    first.header({"config": TrainConfig().to_dict()})
    write_steps(first, range(0, 9), salt=0.0)
    first.event("stop", 9, reason="signal")
    first.close()
    # A crash after the checkpoint at 5: the log is cut back there, and the steps computed
    # again (with other values here) must replace the old ones, not sit beside them.
    resumed = tb_log(tmp_path)
    assert resumed.truncate_after(5) > 0
    resumed.open()
    resumed.event("resume", 5)
    write_steps(resumed, range(5, 12), salt=0.25)
    resumed.close()

    shown, want = tb_scalars(tmp_path / "tb"), expected(tmp_path)
    assert set(want) >= {"train/loss", "train/lr", "train/grad_norm", "train/tok_per_s"}
    assert {"val/loss", "val/ppl", "val/bpb"} <= set(want)
    assert {"val/bpb/plays", "val/loss/code"} <= set(want)  # a mixture's datasets, each
    assert shown == want  # every step once, in order, with the log's value
    events = tb_texts(tmp_path / "tb", "event")
    assert [s for s, _ in events] == [5] and "resume" in events[0][1]  # the stop was dropped
    assert "lr" in tb_texts(tmp_path / "tb", "header")[0][1]


def test_log_export_replays_the_same_values(tmp_path, capsys) -> None:
    log = RunLog(tmp_path)
    log.open()
    write_steps(log, range(7), salt=0.0)
    log.close()
    assert main(["log", "export", str(tmp_path), "--tensorboard", str(tmp_path / "out")]) == 0
    assert "wrote 9 records" in capsys.readouterr().out
    assert tb_scalars(tmp_path / "out") == expected(tmp_path)


def test_an_rl_runs_records_reach_tensorboard(tmp_path, capsys) -> None:
    """`octlm rl`'s log: a header with its settings (`rl`) and no training config, steps with
    rollout numbers and a hash, val records of pass@K ("@" in the name): every number shown."""
    log = tb_log(tmp_path)
    log.open()
    settings = {"task": "addition", "prompts": 4, "samples": 4, "top_k": None}
    log.header({"kind": "rl", "rl": settings, "world": 1})
    for s in range(1, 5):
        log.write("step", step=s, loss=-0.01 * s, reward=0.25 * s, cut=0.0, reply_len=2.5,
                  rollout_sha256="ab" * 32, tokens=40 * s)  # fmt: skip
        if s % 2 == 0:
            log.write("val", step=s, **{"pass@1": 0.1 * s, "pass@4": 0.2 * s}, heldout_cut=0.0)
    log.close()
    assert capsys.readouterr().err == ""  # no tracker switched itself off
    shown = tb_scalars(tmp_path / "tb")
    assert shown == expected(tmp_path)
    assert shown["train/reward"] == [(s, 0.25 * s) for s in range(1, 5)]
    assert shown["val/pass@1"] == [(2, as_float32(0.2)), (4, as_float32(0.4))]
    assert {"val/pass@4", "train/cut", "train/reply_len"} <= set(shown)
    assert '"task": "addition"' in tb_texts(tmp_path / "tb", "header")[0][1]
    assert hparams({"kind": "rl", "rl": settings})["top_k"] == ""  # the settings, None as ""


def test_a_file_where_the_tensorboard_folder_goes_is_one_warning(tmp_path, capsys) -> None:
    (tmp_path / "tb").write_text("not a folder")  # a real fault: makedirs fails
    log = tb_log(tmp_path)
    log.open()
    write_steps(log, range(6), salt=0.0)
    log.close()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("octlm: warning: the tensorboard tracker failed")
    assert [r["step"] for r in read_log(tmp_path) if r["type"] == "step"] == list(range(6))


def test_a_library_failing_mid_run_is_one_warning_and_no_lost_record(
    tmp_path, capsys, monkeypatch
) -> None:
    """A full disk cannot be caused here, so the writer is made to fail as it would."""
    log = tb_log(tmp_path)
    log.open()
    write_steps(log, range(3), salt=0.0)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(log.sinks[0].sink.writer, "add_scalar", full)
    write_steps(log, range(3, 8), salt=0.0)
    log.close()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "No space left on device" in err[0]
    assert [r["step"] for r in read_log(tmp_path) if r["type"] == "step"] == list(range(8))


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_missing_library_is_a_one_line_error_at_start(tmp_path, capsys, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    out = tmp_path / "run"
    args = ["train", "--model", "micro", "--steps", "2", "--warmup", "1", "--out", str(out)]
    args += ["--context", "32", "--log-to", name]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"octlm: error: --log-to {name} needs the {name} package, which is not installed; "
        f"install it with `pip install 'octlm[{name}]'`"
    ]
    assert not out.exists()  # refused before anything was written


def test_unknown_tracker_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown tracker 'mlflow'"):
        TrainConfig(log_to="tensorboard,mlflow")
    assert parse_trackers(" wandb, tensorboard,wandb,") == ("wandb", "tensorboard")
