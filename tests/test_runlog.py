"""Tests for octlm.runlog: strict JSON lines, and the in-place truncation for resumes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from octlm.runlog.reader import LOG_NAME, LOG_SCHEMA, read_log
from octlm.runlog.writer import RunLog


def strict(line: str) -> dict:
    """json.loads that refuses NaN/Infinity, as JavaScript's JSON.parse does."""

    def refuse(name: str) -> None:
        raise ValueError(f"non-JSON constant {name}")

    return json.loads(line, parse_constant=refuse)


def write_run(run_dir: Path) -> list[dict]:
    """A log as a run writes it, steps 1 to 6 and its end; returns the records written."""
    log = RunLog(run_dir)
    log.open()
    log.header({"config": {"lr": 1e-3}, "params": 123})
    records = [{"type": "header", "log_schema": LOG_SCHEMA, "config": {"lr": 1e-3}, "params": 123}]
    for n in range(1, 7):
        records.append({"type": "step", "step": n, "loss": 5.0 - n / 10, "lr": 1e-3})
        if n % 2 == 0:
            records.append({"type": "val", "step": n, "val_loss": 5.5 - n / 10})
        if n % 2 == 1:
            records.append({"type": "event", "event": "checkpoint", "step": n})
    records.append({"type": "end", "step": 6, "weights_sha256": "ab" * 32})
    for record in records[1:]:
        log.write(record["type"], **{k: v for k, v in record.items() if k != "type"})
    log.close()
    return records


def kept(record: dict, done: int) -> bool:
    """What a resume after `done` steps keeps: the records of steps 1..done, and the events
    before its boundary."""
    if record["type"] == "header":
        return True
    if record["type"] in ("step", "val", "hash"):
        return record["step"] <= done
    return record["step"] < done


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
def test_truncate_after_drops_the_records_a_resume_redoes(tmp_path: Path, k: int) -> None:
    written = write_run(tmp_path)
    original = (tmp_path / LOG_NAME).read_text(encoding="utf-8").splitlines()
    dropped = RunLog(tmp_path).truncate_after(k)
    expected = [r for r in written if kept(r, k)]
    assert read_log(tmp_path) == expected
    assert dropped == len(written) - len(expected)
    assert expected[0]["type"] == "header"
    # Kept lines are byte-identical and in their order.
    lines = (tmp_path / LOG_NAME).read_text(encoding="utf-8").splitlines()
    assert lines == [line for line in original if strict(line) in expected]
    assert sorted(os.listdir(tmp_path)) == [LOG_NAME]  # no temporary file left behind


def test_truncate_after_drops_a_half_written_last_line(tmp_path: Path) -> None:
    written = write_run(tmp_path)
    path = tmp_path / LOG_NAME
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"type": "step", "step": 2, "lo')  # a crash mid-write
    dropped = RunLog(tmp_path).truncate_after(3)
    expected = [r for r in written if kept(r, 3)]
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


def test_a_schema_1_log_reads_in_todays_numbering_and_stays_schema_1(tmp_path: Path) -> None:
    """Logs written before `log_schema` numbered step/val/hash/nonfinite records from 0: read
    shifted by one, truncated by their own rule, and appended to in their own numbering."""
    path = tmp_path / LOG_NAME
    old = [
        {"type": "header", "config": {}},
        {"type": "step", "step": 0, "loss": 2.0},
        {"type": "step", "step": 1, "loss": 1.5},
        {"type": "val", "step": 1, "val_loss": 1.6},
        {"type": "event", "event": "stop", "step": 2},
        {"type": "step", "step": 2, "loss": 1.2},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in old), encoding="utf-8")
    assert [(r["type"], r.get("step")) for r in read_log(tmp_path)] == [
        ("header", None), ("step", 1), ("step", 2), ("val", 2), ("event", 2), ("step", 3)
    ]  # fmt: skip
    log = RunLog(tmp_path)
    assert log.truncate_after(2) == 2  # the stop at 2 and step index 2 (the third step)
    log.open()
    assert log.schema == 1
    log.event("resume", 2)
    log.step(3, Numbers(), Counts(), Meter())  # the third step, written as index 2
    log.close()
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [(r["type"], r["step"]) for r in raw[1:]] == [
        ("step", 0), ("step", 1), ("val", 1), ("event", 2), ("step", 2)
    ]  # fmt: skip
    assert read_log(tmp_path)[-1]["step"] == 3


class Numbers:
    loss, lr, grad_norm, dt, skipped, epoch, z_loss = 1.0, 1e-3, 0.5, 0.1, False, None, None


class Counts:
    tokens, elapsed, skipped_steps = 10, 1.0, 0


class Meter:
    def tokens_per_second(self, dt: float) -> float:
        return 100.0

    def mfu(self, tok_per_s: float) -> float | None:
        return None

    def memory_mb(self) -> float | None:
        return 123.0
