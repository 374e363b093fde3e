"""--eval-tasks scores multiple-choice tasks at every validation without moving a training bit
(the same end weights and step records as the run without it), logs acc and acc_norm per task,
and `octlm eval RUN --tasks FILE:N` prints them; a bad task file is one line before training.
The task: "which line follows this one" among four lines of a work the run trained on.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from octlm.runlog.reader import read_log
from tests.e2e.helpers import end_hash, octlm, steps_of, train_args
from tests.shared import shared

pytestmark = pytest.mark.slow


def next_line_questions(text: str, n: int) -> list[dict]:
    lines = [line.strip() for line in text.splitlines() if 20 <= len(line.strip()) <= 60]
    rng = random.Random(5)
    out = []
    for i in rng.sample(range(len(lines) - 1), n):
        wrong = rng.sample([x for x in lines if x not in (lines[i], lines[i + 1])], 3)
        gold = rng.randrange(4)
        choices = wrong[:gold] + [lines[i + 1]] + wrong[gold:]
        out.append({"context": lines[i], "choices": choices, "gold": gold, "delimiter": "\n"})
    return out


@pytest.fixture(scope="module")
def task_file(corpus_docs, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tasks") / "next_line.jsonl"
    work = sorted(corpus_docs, key=lambda d: d.id)[0]
    path.write_text("".join(json.dumps(q) + "\n" for q in next_line_questions(work.text, 24)))
    return path


@pytest.fixture(scope="module")
def with_tasks(tiny_dataset, task_file, tmp_path_factory) -> Path:
    def build(folder: Path) -> None:
        octlm(*train_args(tiny_dataset, folder / "run", "--eval-tasks", f"{task_file}:20"))

    return shared(tmp_path_factory, "eval_tasks_run", build) / "run"


def test_scoring_tasks_moves_no_training_bit(with_tasks, straight_run) -> None:
    assert end_hash(with_tasks) == end_hash(straight_run())
    assert steps_of(with_tasks) == steps_of(straight_run())


def test_accuracy_is_logged_at_every_validation(with_tasks, straight_run) -> None:
    vals = [r for r in read_log(with_tasks) if r["type"] == "val"]
    plain = [r for r in read_log(straight_run()) if r["type"] == "val"]
    assert [v["step"] for v in vals] == [v["step"] for v in plain] and vals
    for v in vals:
        assert 0 <= v["acc/next_line"] <= 1 and 0 <= v["acc_norm/next_line"] <= 1
        assert (20 * v["acc/next_line"]) % 1 == 0  # a share of the 20 questions
        assert v["val_loss"] == next(p for p in plain if p["step"] == v["step"])["val_loss"]


def test_octlm_eval_tasks_prints_each_task(with_tasks, task_file) -> None:
    proc = octlm("eval", str(with_tasks), "--tasks", f"{task_file}:10")
    (line,) = proc.stdout.strip().splitlines()
    assert "task next_line: acc " in line and "acc_norm " in line and "(10 questions)" in line


def test_a_bad_task_file_is_one_line_before_training(tiny_dataset, tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "a", "choices": ["b", "c"], "gold": 2}\n')
    proc = octlm(*train_args(tiny_dataset, tmp_path / "r", "--eval-tasks", str(bad)), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "gold 2 is not one of the choices" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "r" / "log.jsonl").exists()
