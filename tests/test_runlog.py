"""Tests for octlm.runlog: strict JSON lines, and the in-place truncation for resumes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from octlm.runlog import LOG_NAME, RunLog, read_log


def strict(line: str) -> dict:
    """json.loads that refuses NaN/Infinity, as JavaScript's JSON.parse does."""

    def refuse(name: str) -> None:
        raise ValueError(f"non-JSON constant {name}")

    return json.loads(line, parse_constant=refuse)


def write_run(run_dir: Path) -> list[dict]:
    """A log as a run writes it, up to step 6 and its end; returns the records written."""
    log = RunLog(run_dir)
    log.open()
    records = [("header", {"config": {"lr": 1e-3}, "params": 123})]
    for s in range(6):
        records.append(("step", {"step": s, "loss": 5.0 - s / 10, "lr": 1e-3}))
        if s % 2 == 1:
            records.append(("val", {"step": s, "val_loss": 5.5 - s / 10}))
        if s % 2 == 0:
            records.append(("event", {"event": "checkpoint", "step": s + 1}))
    records.append(("end", {"step": 6, "weights_sha256": "ab" * 32}))
    for kind, fields in records:
        log.write(kind, **fields)
    log.close()
    return [{"type": kind, **fields} for kind, fields in records]


def test_records_are_one_json_object_per_line(tmp_path: Path) -> None:
    written = write_run(tmp_path)
    text = (tmp_path / LOG_NAME).read_text(encoding="utf-8")
    assert text.endswith("\n")
    lines = text.splitlines()
    assert [strict(line) for line in lines] == written
    assert read_log(tmp_path) == written
    assert read_log(tmp_path / LOG_NAME) == written


def test_nan_and_inf_are_written_as_strings(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    log.open()
    log.write("step", step=0, loss=float("nan"), grad_norm=float("inf"), lr=1e-3)
    log.write("val", step=0, val_loss=float("-inf"), val_bpb=float("nan"), val_tokens=3)
    log.write("header", config={"peak_tflops": float("inf")}, notes=[float("nan"), 1.5])
    log.close()
    lines = (tmp_path / LOG_NAME).read_text(encoding="utf-8").splitlines()
    step, val, header = (strict(line) for line in lines)
    assert (step["loss"], step["grad_norm"], step["lr"]) == ("nan", "inf", 1e-3)
    assert (val["val_loss"], val["val_bpb"], val["val_tokens"]) == ("-inf", "nan", 3)
    assert header["config"] == {"peak_tflops": "inf"}
    assert header["notes"] == ["nan", 1.5]


def test_each_line_is_flushed_as_it_is_written(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    log.open()
    log.write("step", step=0, loss=1.0)
    assert read_log(tmp_path) == [{"type": "step", "step": 0, "loss": 1.0}]  # before close
    log.close()


def test_a_disabled_log_writes_nothing(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "run", enabled=False)
    log.open()
    log.write("step", step=0, loss=1.0)
    log.close()
    assert not (tmp_path / "run").exists()


def test_reopening_appends(tmp_path: Path) -> None:
    written = write_run(tmp_path)
    log = RunLog(tmp_path)
    log.open()
    log.write("event", event="resume", step=6)
    log.close()
    assert read_log(tmp_path) == [*written, {"type": "event", "event": "resume", "step": 6}]


@pytest.mark.parametrize("k", [0, 1, 4, 7])
def test_truncate_after_drops_records_at_or_past_the_step(tmp_path: Path, k: int) -> None:
    written = write_run(tmp_path)
    original = (tmp_path / LOG_NAME).read_text(encoding="utf-8").splitlines()
    dropped = RunLog(tmp_path).truncate_after(k)
    expected = [r for r in written if r["type"] == "header" or r["step"] < k]
    assert read_log(tmp_path) == expected
    assert dropped == len(written) - len(expected)
    assert expected[0]["type"] == "header"
    # Kept lines are byte-identical and in their order.
    kept = (tmp_path / LOG_NAME).read_text(encoding="utf-8").splitlines()
    assert kept == [line for line in original if strict(line) in expected]
    assert sorted(os.listdir(tmp_path)) == [LOG_NAME]  # no temporary file left behind


def test_truncate_after_drops_a_half_written_last_line(tmp_path: Path) -> None:
    written = write_run(tmp_path)
    path = tmp_path / LOG_NAME
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"type": "step", "step": 2, "lo')  # a crash mid-write
    dropped = RunLog(tmp_path).truncate_after(3)
    expected = [r for r in written if r["type"] == "header" or r["step"] < 3]
    assert read_log(tmp_path) == expected
    assert dropped == len(written) - len(expected) + 1
    assert path.read_text(encoding="utf-8").endswith("}\n")
    # The resumed run appends clean lines after the kept ones.
    log = RunLog(tmp_path)
    log.open()
    log.write("event", event="resume", step=3)
    log.close()
    assert read_log(tmp_path)[-1] == {"type": "event", "event": "resume", "step": 3}


def test_truncate_after_without_a_log_is_a_no_op(tmp_path: Path) -> None:
    assert RunLog(tmp_path).truncate_after(3) == 0
    assert not (tmp_path / LOG_NAME).exists()


@pytest.mark.parametrize("k", [0, 1, 2_999, 5_000, 9_999, 10_000])
def test_truncating_a_long_log_cuts_exactly_across_read_blocks(tmp_path: Path, k: int) -> None:
    """A 10,000-step log (several read blocks; lines of varying length): the kept bytes are a
    prefix of the file, untouched in place (same inode), and exactly the records before k."""
    log = RunLog(tmp_path)
    log.open()
    log.write("header", config={"lr": 1e-3})
    for s in range(10_000):
        log.write("step", step=s, loss=5.0 / (s + 1), note="x" * (s % 37))
        if s % 20 == 19:
            log.write("val", step=s, val_loss=1.0)
    log.write("end", step=10_000)
    log.close()
    path = tmp_path / LOG_NAME
    before, inode = path.read_bytes(), path.stat().st_ino
    lines = before.decode().splitlines(keepends=True)
    keep = [ln for ln in lines if json.loads(ln)["type"] == "header" or json.loads(ln)["step"] < k]
    assert RunLog(tmp_path).truncate_after(k) == len(lines) - len(keep)
    assert path.read_bytes() == "".join(keep).encode() == before[: len("".join(keep))]
    assert path.stat().st_ino == inode
    assert sorted(os.listdir(tmp_path)) == [LOG_NAME]


def test_a_kept_last_line_without_its_newline_gets_one(tmp_path: Path) -> None:
    path = tmp_path / LOG_NAME
    path.write_bytes(b'{"type": "header"}\n{"type": "step", "step": 0}')  # "\n" lost in a crash
    assert RunLog(tmp_path).truncate_after(1) == 0
    assert path.read_bytes() == b'{"type": "header"}\n{"type": "step", "step": 0}\n'
