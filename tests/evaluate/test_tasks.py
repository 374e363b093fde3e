"""Tests for octlm.evaluate.tasks: the three task layouts and FILE:N, one-line errors for bad
files, and scores (the one categorical scorer, through the task protocol) equal to a
brute-force forward per choice (acc, and acc_norm over the choice's characters as lm-eval
divides), leaving the model's mode and the generators as they were."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from octlm.errors import OctlmError
from octlm.evaluate.items import CategoricalTask, Item
from octlm.evaluate.likelihood import encode_pair
from octlm.evaluate.protocol import read_tasks, score, score_line, task_fields
from octlm.evaluate.tasks import read_task
from octlm.model.gpt import GPT
from tests.unit_model import unit_config


def write(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_the_three_layouts_and_a_first_n_subset(tmp_path) -> None:
    ours = {"context": "A cat", "choices": [" sat", " flew"], "gold": 0, "delimiter": ""}
    hella = {"ctx": "He opens", "endings": ["the door", "a sky"], "label": "1"}
    arc = {"question": "2+2?", "choices": {"text": ["3", "4"], "label": ["A", "B"]},
           "answerKey": "B"}  # fmt: skip
    task = read_task(str(write(tmp_path / "mix.jsonl", [ours, hella, arc, ours])))
    assert task.name == "mix" and len(task.items) == 4 and task.metrics == "lm-eval"
    assert task.items[0] == Item(("A cat",), (" sat", " flew"), 0, "mc", "")
    assert task.items[1] == Item(("He opens",), ("the door", "a sky"), 1)
    assert task.items[2] == Item(("Question: 2+2?\nAnswer:",), ("3", "4"), 1)
    assert len(read_task(f"{tmp_path / 'mix.jsonl'}:2").items) == 2


@pytest.mark.parametrize(
    "lines, problem",
    [
        (['{"context": "a", "choices": ["b"], "gold": 3}'], "gold 3 is not one of the choices"),
        (["{broken"], "is not a task question"),
        (['{"text": "x"}'], "has none of the task layouts"),
        ([""], "holds no question"),
    ],
)
def test_bad_task_files_are_one_line_errors(tmp_path, lines, problem) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(OctlmError, match=problem):
        read_task(str(path))
    with pytest.raises(OctlmError, match="does not exist"):
        read_task(str(tmp_path / "missing.jsonl:5"))
    twice = f"{path},{path}"
    with pytest.raises(OctlmError):
        read_tasks(twice)


def test_scores_equal_one_forward_per_choice(tiny_tokenizer, tmp_path) -> None:
    """An octlm-layout file, read and scored as `octlm eval --tasks` does: acc and acc_norm are
    exactly the counts a forward per choice gives (the old score_task's numbers)."""
    torch.manual_seed(0)
    assert tiny_tokenizer.vocab_size == 512  # the unit shape's vocabulary
    model = GPT(unit_config(64)).train()
    words = ["the king", "a horse", "my lord", "good night", "sweet love", "the sea"]
    questions = [
        {"context": f"{words[i]} and", "choices": [f"{w}{'!' * (i % 3)}" for w in words[:4]],
         "gold": i % 4}
        for i in range(6)
    ]  # fmt: skip
    [task] = read_tasks(str(write(tmp_path / "unit.jsonl", questions)))
    state = torch.get_rng_state()
    result = score(model, task, tiny_tokenizer, 64, torch.device("cpu"))
    assert model.training and torch.equal(state, torch.get_rng_state())
    right = right_norm = 0
    model.eval()
    with torch.no_grad():
        for q in questions:
            lls = []
            for choice in q["choices"]:
                head, tail = encode_pair(tiny_tokenizer, q["context"], " " + choice)
                ids = torch.tensor([head + tail])
                logp = torch.log_softmax(model(ids[:, :-1]).float(), -1)[0]
                picked = logp[len(head) - 1 :].gather(1, ids[0, len(head) :, None])
                lls.append(float(picked.sum()))
            norm = [ll / len(c) for ll, c in zip(lls, q["choices"], strict=True)]
            right += max(range(4), key=lls.__getitem__) == q["gold"]
            right_norm += max(range(4), key=norm.__getitem__) == q["gold"]
    assert result.items == 6
    assert (result.acc_sum, result.acc_char) == (right / 6, right_norm / 6)
    assert task_fields({"unit": result}) == {"acc/unit": right / 6, "acc_norm/unit": right_norm / 6}
    line = f"unit: acc {right / 6:.4f}  acc_norm {right_norm / 6:.4f}  (6 questions)"
    assert score_line("unit", result) == line
    # The same items as a standard mc file: the same acc and acc_norm beside CORE's numbers.
    core = score(
        model, CategoricalTask("unit", task.items), tiny_tokenizer, 64, torch.device("cpu")
    )
    assert (core.acc_sum, core.acc_char) == (result.acc_sum, result.acc_char)
    assert set(task_fields({"unit": core})) == {"acc/unit", "centered/unit", "bpb/unit"}


def test_the_shipped_task_is_read_by_name() -> None:
    task = read_task("next_line:30")
    assert task.name == "next_line" and len(task.items) == 30
    assert all(len(i.continuations) == 4 and i.delimiter == "\n" for i in task.items)
    with pytest.raises(OctlmError, match="or a task octlm ships: next_line"):
        read_task("no_such_task")


def test_a_task_file_in_each_standard_format(tmp_path, tiny_tokenizer) -> None:
    """A user's own file with `"format"` lines: mc, schema, lm, bpb, each its own task with
    its chance level, scored by the suites' rules; one format per file."""
    lines = {
        "mc": {"format": "mc", "context": "A cat", "choices": [" sat", " flew", " ran"],
               "gold": 0, "delimiter": "", "shots": ["A dog barked"]},
        "schema": {"format": "schema", "contexts": ["The king", "The horse"],
                   "continuation": "ate hay", "gold": 1},
        "lm": {"format": "lm", "context": "the king", "continuation": "said"},
        "bpb": {"format": "bpb", "context": "the king", "continuation": "said"},
    }  # fmt: skip
    chances = {"mc": 1 / 3, "schema": 0.5, "lm": 0.0, "bpb": 0.0}
    model = GPT(unit_config(64))
    for kind, line in lines.items():
        task = read_task(str(write(tmp_path / f"{kind}.jsonl", [line, line])))
        assert isinstance(task, CategoricalTask) and task.name == kind and task.metrics == "core"
        assert [i.kind for i in task.items] == [kind, kind]
        assert task.baseline == pytest.approx(chances[kind])
        result = score(model, task, tiny_tokenizer, 64, torch.device("cpu"))
        assert result.items == 2 and (result.centered is None) == (kind == "bpb")
    mixed = write(tmp_path / "mixed.jsonl", [lines["lm"], lines["mc"]])
    with pytest.raises(OctlmError, match="mixed.jsonl:2: is a mc line in a file of lm"):
        read_task(str(mixed))
    bad = write(tmp_path / "bad.jsonl", [{**lines["schema"], "gold": 2}])
    with pytest.raises(OctlmError, match="bad.jsonl:1: field 'gold'"):
        read_task(str(bad))
    unknown = write(tmp_path / "unknown.jsonl", [{**lines["lm"], "format": "essay"}])
    with pytest.raises(OctlmError, match="field 'format': 'essay' is not one of"):
        read_task(str(unknown))


def test_no_isinstance_on_a_task_kind_outside_the_protocol() -> None:
    """The kind of a task or of its score is branched on in `evaluate/protocol.py` only (the
    behaviour is held by the tests of each kind; this holds the place)."""
    package = Path(__file__).resolve().parents[2] / "octlm"
    kinds = r"isinstance\([^)]*\b(\w*Task|TaskScore|TaskResult|Item|\w*Score)\b"
    found = [
        f"{path.relative_to(package)}:{n}"
        for path in package.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(kinds, line)
    ]
    assert found and all(f.startswith("evaluate/protocol.py:") for f in found)


def test_a_bad_task_spec_is_named_by_the_setting_that_gave_it(tmp_path) -> None:
    """`train --eval-tasks` and `eval --tasks` read tasks alike: a refusal starts with the
    setting (which `cli/flags.named_as_typed` spells as the user typed it)."""
    for label in ("eval_tasks", "--tasks"):
        with pytest.raises(OctlmError) as caught:
            read_tasks(f"next_line,{tmp_path / 'nosuch.jsonl'}", label)
        assert caught.value.problem.startswith(f"{label}: task file ")
        assert "does not exist" in caught.value.problem
