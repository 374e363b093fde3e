"""`--profile-steps A:B` writes a trace and a per-op table and changes no bit;
`--memory-snapshot` is CUDA's (refused in one line on this CPU, unverified on a GPU here)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import STEPS, end_hash, octlm, steps_of, train_args

pytestmark = pytest.mark.slow


def test_a_profiled_run_writes_its_trace_and_ends_on_the_plain_runs_bits(
    tiny_dataset, straight_run, tmp_path
) -> None:
    out = tmp_path / "profiled"
    octlm(*train_args(tiny_dataset, out, "--profile-steps", "2:3"))
    plain = straight_run()
    assert end_hash(out) == end_hash(plain)
    assert steps_of(out) == steps_of(plain)
    trace = json.loads((out / "profile" / "trace.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert "aten::mm" in names and "Optimizer.step#AdamW.step" in names
    table = (out / "profile" / "ops.txt").read_text()
    assert "aten::mm" in table and "Self CPU" in table


def test_a_run_stopped_inside_the_window_writes_what_it_saw(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "stopped"
    octlm(*train_args(tiny_dataset, out, "--profile-steps", "2:6", "--stop-at", "3"))
    assert "aten::mm" in (out / "profile" / "ops.txt").read_text()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--memory-snapshot",), "--memory-snapshot records CUDA's allocator; this run is on cpu"),
        (("--profile-steps", "3:2"), "--profile-steps '3:2' is not A:B"),
        (("--profile-steps", "0:1"), "--profile-steps '0:1' is not A:B"),
        (("--profile-steps", f"2:{STEPS + 1}"), f"--profile-steps '2:{STEPS + 1}' is not A:B"),
        (("--profile-steps", "two"), "--profile-steps 'two' is not A:B"),
    ],
    ids=["snapshot-on-cpu", "backwards", "zero", "past-the-end", "not-numbers"],
)
def test_bad_profile_settings_are_one_line(tiny_dataset, tmp_path, flags, expected) -> None:
    out = tmp_path / "run"
    proc = octlm(*train_args(tiny_dataset, out, *flags), check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert expected in proc.stderr
    assert not out.exists()
