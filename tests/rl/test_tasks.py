"""The verifiable tasks (`octlm.rl.tasks`), their chat data (`octlm.rl.task_data`) and `octlm
rl-data`: problems a pure function of (seed, step, index), in this process and a fresh one;
answers checked against an oracle; the strict checker's rewards; a fixed held-out set no
training or chat draw ever lands in; chat data that `octlm prepare --format chat` reads back;
bad input refused in one line with nothing written.

Run: pytest tests/rl/test_tasks.py -p no:cacheprovider
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from octlm.cli.main import main
from octlm.data.packing import START, TARGET
from octlm.data.shards import ShardDataset
from octlm.errors import OctlmError
from octlm.rl.task_data import CHAT_STREAM, chat_problems, conversation, write_chat_data
from octlm.rl.tasks import (
    HELDOUT_SHARE,
    REWARD_CORRECT,
    REWARD_MALFORMED,
    REWARD_WELL_FORMED,
    Addition,
    Count,
    Problem,
    Sorting,
    Task,
    get_task,
)
from octlm.tokenizer.core import Tokenizer
from tests.test_bad_input import tree

TOKENIZER = Path(__file__).parents[1] / "golden" / "v1-micro" / "data" / "tokenizer.json"
SPECS = ("addition", "addition:1", "addition:7", "sorting", "sorting:2", "count")
PINNED = {
    # (spec, seed, step, index) -> (prompt, answer). A change here changes every run's problems:
    # bump TASKS_VERSION with it, so a resume across the change is refused.
    ("addition", 1337, 0, 0): ("What is 90 + 80? Reply with the number only.", "170"),
    ("addition:5", 1337, 0, 0): ("What is 43578 + 26982? Reply with the number only.", "70560"),
    ("sorting", 1337, 0, 0): (
        "Sort these numbers from smallest to largest: 25 98 21 58",
        "21 25 58 98",
    ),
    ("count", 1337, 0, 0): (
        'How many times does the letter "g" appear in "golden"? Reply with the number only.',
        "1",
    ),
}


def oracle(task: Task, problem: Problem) -> str:
    """The answer computed here from the problem's data, not by the task."""
    if isinstance(task, Addition):
        a, b = problem.data
        assert len(str(a)) == len(str(b)) == task.digits and f"{a} + {b}" in problem.prompt
        return str(a + b)
    if isinstance(task, Sorting):
        assert len(problem.data) == task.length and all(0 <= x < 100 for x in problem.data)
        return " ".join(str(x) for x in sorted(problem.data))
    word, letter = problem.data
    assert f'"{letter}"' in problem.prompt and f'"{word}"' in problem.prompt
    return str(word.count(letter))


def test_pinned_problems_are_the_same_in_a_fresh_process() -> None:
    here = {
        key: (p.prompt, p.answer) for key in PINNED for p in [get_task(key[0]).problem(*key[1:])]
    }
    assert here == PINNED
    code = (
        "import json; from octlm.rl.tasks import get_task\n"
        f"keys = {list(PINNED)!r}\n"
        "problems = [get_task(k[0]).problem(*k[1:]) for k in keys]\n"
        "print(json.dumps([[p.prompt, p.answer] for p in problems]))"
    )
    env_seed = {"PYTHONHASHSEED": "12345"}  # str hashes differ: the problems must not
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env_seed},
    )
    assert [tuple(x) for x in json.loads(out.stdout)] == list(PINNED.values())


@pytest.mark.parametrize("spec", SPECS)
def test_a_problem_is_a_pure_function_of_seed_step_and_index(spec) -> None:
    task = get_task(spec)
    assert task.problem(7, 3, 2) == get_task(spec).problem(7, 3, 2)
    state = random.getstate()
    keys = [(s, t, i) for s in (0, 1) for t in (0, 1, 2) for i in range(12)]
    prompts = {task.problem(*k).prompt for k in keys}
    assert random.getstate() == state  # no global RNG drawn from
    if spec != "addition:1":  # 100 problems: collisions are expected there
        assert len(prompts) >= 0.9 * len(keys)


@pytest.mark.parametrize("spec", SPECS)
def test_every_answer_is_the_oracles_and_earns_the_full_reward(spec) -> None:
    task = get_task(spec)
    for i in range(200):
        p = task.problem(1, i // 8, i % 8)
        assert p.answer == oracle(task, p)
        assert task.reward(p, p.answer) == REWARD_CORRECT and task.correct(p, p.answer)
        assert task.reward(p, f"  {p.answer}\n") == REWARD_CORRECT


def test_no_count_answer_is_a_reply_that_needs_no_counting() -> None:
    """Drawn letter-first, "1" was the answer to 54% of count problems: a model answering "1"
    to everything scored that. The count is drawn first now, so no answer is that common."""
    answers = Counter(Count().problem(0, 0, i).answer for i in range(5000))
    assert set(answers) >= {"0", "1", "2", "3"} and max(answers.values()) < 0.4 * 5000


ADDITION = Problem("What is 123 + 456? Reply with the number only.", "579", (123, 456))
SORTING = Problem("Sort these numbers from smallest to largest: 9 3 5", "3 5 9", (9, 3, 5))
COUNT = Problem('How many times does the letter "p" appear in "apple"?', "2", ("apple", "p"))
REPLIES = [
    (Addition(3), ADDITION, "579", REWARD_CORRECT),
    (Addition(3), ADDITION, " 579 \n", REWARD_CORRECT),
    (Addition(3), ADDITION, "580", REWARD_WELL_FORMED),
    (Addition(3), ADDITION, "0579", REWARD_WELL_FORMED),  # the canonical form has no zeros
    (Addition(3), ADDITION, "+579", REWARD_MALFORMED),
    (Addition(3), ADDITION, "579.", REWARD_MALFORMED),
    (Addition(3), ADDITION, "The answer is 579", REWARD_MALFORMED),
    (Addition(3), ADDITION, "579\nuser\nWhat", REWARD_MALFORMED),
    (Addition(3), ADDITION, "5 79", REWARD_MALFORMED),
    (Addition(3), ADDITION, "-579", REWARD_MALFORMED),
    (Addition(3), ADDITION, "\u0665\u0667\u0669", REWARD_MALFORMED),  # Arabic-Indic digits
    (Addition(3), ADDITION, "", REWARD_MALFORMED),
    (Sorting(3), SORTING, "3 5 9", REWARD_CORRECT),
    (Sorting(3), SORTING, "\t3 5 9 ", REWARD_CORRECT),
    (Sorting(3), SORTING, "9 5 3", REWARD_WELL_FORMED),
    (Sorting(3), SORTING, "3 5", REWARD_WELL_FORMED),
    (Sorting(3), SORTING, "3  5 9", REWARD_MALFORMED),
    (Sorting(3), SORTING, "3, 5, 9", REWARD_MALFORMED),
    (Sorting(3), SORTING, "[3, 5, 9]", REWARD_MALFORMED),
    (Sorting(3), SORTING, "3\n5\n9", REWARD_MALFORMED),
    (Count(), COUNT, "2", REWARD_CORRECT),
    (Count(), COUNT, "02", REWARD_WELL_FORMED),
    (Count(), COUNT, "3", REWARD_WELL_FORMED),
    (Count(), COUNT, "two", REWARD_MALFORMED),
    (Count(), COUNT, "2 times", REWARD_MALFORMED),
]


@pytest.mark.parametrize("task, problem, reply, expected", REPLIES)
def test_the_checker_is_strict(task, problem, reply, expected) -> None:
    assert task.reward(problem, reply) == expected
    assert task.correct(problem, reply) == (expected == REWARD_CORRECT)


def test_the_reward_scale_ranks_correct_over_well_formed_over_malformed() -> None:
    assert REWARD_MALFORMED == 0.0 < REWARD_WELL_FORMED < REWARD_CORRECT == 1.0
    # A group of four replies, one of each kind and a malformed one: the mean-centered
    # advantage of the correct reply is the largest, the well-formed one's above the malformed.
    rewards = np.array([REWARD_CORRECT, REWARD_WELL_FORMED, REWARD_MALFORMED, REWARD_MALFORMED])
    advantage = rewards - rewards.mean()
    assert advantage[0] > advantage[1] > advantage[2] and advantage[0] > 4 * advantage[1]


@pytest.mark.parametrize("spec", SPECS)
def test_the_held_out_set_is_fixed_and_no_training_or_chat_draw_lands_in_it(spec) -> None:
    task = get_task(spec)
    held = task.heldout(60)
    assert held == get_task(spec).heldout(60) and held[:3] == task.heldout(3)
    assert all(task.is_held_out(p) for p in held)
    prompts = {p.prompt for p in held}
    if spec in ("addition:7", "sorting"):  # large spaces: no prompt twice
        assert len(prompts) == len(held)
    drawn = [task.problem(s, t, i) for s in (0, 5) for t in range(10) for i in range(20)]
    drawn += list(chat_problems(task, 400, seed=3))
    assert not any(task.is_held_out(p) or p.prompt in prompts for p in drawn)


def test_the_held_out_answers_come_in_the_tasks_own_mix() -> None:
    """Count has ~4,000 prompts, most with the answer 0 but drawn a third of the time: the
    held-out set repeats prompts rather than run out of the common answers."""
    task = Count()
    held = Counter(p.answer for p in task.heldout(1000))
    drawn = Counter(task.problem(0, 0, i).answer for i in range(5000))
    assert abs(held["0"] / 1000 - drawn["0"] / 5000) < 0.06
    assert len({p.prompt for p in get_task("addition:1").heldout(50)}) < 50  # 100 sums in all


def test_about_one_problem_in_ten_is_held_out() -> None:
    task = Addition(3)
    share = np.mean([task.is_held_out(task.make(seed)) for seed in range(4000)])
    assert abs(share - 1 / HELDOUT_SHARE) < 0.02


BAD_SPECS = {
    "foo": "unknown task 'foo'",
    "": "unknown task ''",
    "Addition": "unknown task",
    "addition:0": "from 1 to 15",
    "addition:x": "from 1 to 15",
    "addition:40": "from 1 to 15",
    "addition:": "from 1 to 15",
    "addition:+3": "from 1 to 15",
    "sorting:1": "from 2 to 16",
    "sorting:17": "from 2 to 16",
    "count:3": "takes no parameter",
}


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_a_bad_task_spec_is_one_line(spec) -> None:
    with pytest.raises(OctlmError, match=BAD_SPECS[spec]) as info:
        get_task(spec)
    assert "\n" not in str(info.value) and "; " in str(info.value)


def test_spec_forms_name_one_task() -> None:
    assert get_task("addition") == get_task("addition:2") == Addition(2)
    assert get_task("addition:07").name == "addition:7" and get_task("sorting").name == "sorting:4"
    assert get_task("count").version == get_task("addition").version


def test_reasoning_gym_tasks_read_through_the_same_interface() -> None:
    pytest.importorskip("reasoning_gym")
    task = get_task("reasoning_gym:chain_sum")
    assert task.name == "reasoning_gym:chain_sum" and task.version.startswith("reasoning_gym ")
    state, np_state = random.getstate(), np.random.get_state()
    problems = [task.problem(1, 0, i) for i in range(5)]
    get_task("reasoning_gym:pool_matrix").problem(1, 0, 0)  # it seeds numpy's global RNG
    assert random.getstate() == state and np.random.get_state()[1].tolist() == np_state[1].tolist()
    p = problems[0]
    assert task.reward(p, p.answer) == 1.0 and task.correct(p, f" {p.answer}\n")
    assert task.reward(p, "") == 0.0 and not task.correct(p, "no")
    held = task.heldout(10)
    assert not {q.prompt for q in held} & {q.prompt for q in problems}
    code = "from octlm.rl.tasks import get_task; "
    code += "print(get_task('reasoning_gym:chain_sum').problem(1, 0, 3))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(problems[3])
    with pytest.raises(OctlmError, match="did you mean chain_sum"):
        get_task("reasoning_gym:chain_sun")


def test_reasoning_gym_errors_inside_the_package_are_one_line_or_a_zero_reward() -> None:
    """A generator that needs a configuration is refused when the task is named; a reply the
    package's scorer raises on (prime_factorization parses integers) is malformed: 0."""
    pytest.importorskip("reasoning_gym")
    with pytest.raises(OctlmError, match="needs a configuration octlm does not pass") as info:
        get_task("reasoning_gym:composite")
    assert "\n" not in str(info.value) and "reasoning_gym:composite" in str(info.value)
    task = get_task("reasoning_gym:prime_factorization")
    p = task.problem(1, 0, 0)
    assert task.reward(p, "not a number") == REWARD_MALFORMED and not task.correct(p, "x")
    assert task.reward(p, p.answer) == 1.0


def test_reasoning_gym_missing_is_one_line(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import` raises ImportError
    with pytest.raises(OctlmError, match="pip install reasoning-gym") as info:
        get_task("reasoning_gym:chain_sum")
    assert "\n" not in str(info.value)


def test_chat_data_is_the_chat_stream_as_json_lines(tmp_path) -> None:
    task = get_task("sorting")
    out = write_chat_data(task, 25, tmp_path / "sub" / "chats.jsonl", seed=4)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records == [conversation(p) for p in chat_problems(task, 25, seed=4)]
    assert (
        records[0]["messages"][0]["role"] == "user"
        and records[0]["messages"][1]["role"] == "assistant"
    )
    assert [task.draw(CHAT_STREAM, 4, i) for i in range(3)] != [
        task.problem(4, 0, i) for i in range(3)
    ]
    assert [p.name for p in tmp_path.joinpath("sub").iterdir()] == ["chats.jsonl"]  # no temp file


def test_rl_data_round_trips_through_prepare_chat(tmp_path, capsys) -> None:
    chats, data = tmp_path / "add.jsonl", tmp_path / "data"
    assert main(["rl-data", "--task", "addition:3", "--count", "60", "--out", str(chats)]) == 0
    assert "wrote 60 conversations of addition:3" in capsys.readouterr().out
    args = ["prepare", str(chats), "--format", "chat", "--tokenizer", str(TOKENIZER)]
    assert main([*args, "--context", "64", "--out", str(data)]) == 0
    tok, ds = Tokenizer.load(TOKENIZER), ShardDataset.open(data, verify_checksums=True)
    answers = []
    for split in ("train", "val"):
        streams = (getattr(ds, split), getattr(ds, f"{split}_mask"))
        tokens, mask = (np.asarray(s.window(0, len(s))) for s in streams)
        starts = [*np.flatnonzero(mask == START).tolist(), len(mask)]
        for a, b in zip(starts, starts[1:], strict=False):
            target = tokens[a:b][mask[a:b] == TARGET].tolist()
            assert target[-1] == tok.eos_id  # the reply ends its turn
            answers.append(tok.decode(target[:-1]))
    expected = [p.answer for p in chat_problems(get_task("addition:3"), 60, seed=0)]
    assert sorted(answers) == sorted(expected)


BAD_RUNS = {
    "unknown_task": (["--task", "division", "--count", "5", "--out", "a.jsonl"], "unknown task"),
    "bad_digits": (["--task", "addition:40", "--count", "5", "--out", "a.jsonl"], "from 1 to 15"),
    "gym_name": (["--task", "reasoning_gym:", "--count", "5", "--out", "a.jsonl"], "reasoning"),
    "count_zero": (["--task", "count", "--count", "0", "--out", "a.jsonl"], "--count 0 must be"),
    "count_negative": (["--task", "count", "--count", "-3", "--out", "a.jsonl"], "--count -3"),
    "count_word": (["--task", "count", "--count", "many", "--out", "a.jsonl"], "not a number"),
    "seed_negative": (
        ["--task", "count", "--count", "5", "--seed", "-1", "--out", "a.jsonl"],
        "--seed -1",
    ),
    "out_folder": (["--task", "count", "--count", "5", "--out", "busy.jsonl"], "is a folder"),
    "out_exists": (["--task", "count", "--count", "5", "--out", "old.jsonl"], "already exists"),
    "out_suffix": (
        ["--task", "count", "--count", "5", "--out", "chats.txt"],
        "does not end in .jsonl",
    ),
    "out_under_file": (
        ["--task", "count", "--count", "5", "--out", "old.jsonl/a.jsonl"],
        "which is a file",
    ),
    "out_empty": (["--task", "count", "--count", "5", "--out", ""], "--out"),
}


@pytest.mark.parametrize("case", BAD_RUNS)
def test_rl_data_bad_input_is_one_line_and_writes_nothing(
    case, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "busy.jsonl").mkdir()
    (tmp_path / "old.jsonl").write_text("keep me\n")
    before = tree(tmp_path)
    args, expected = BAD_RUNS[case]
    try:
        code = main(["rl-data", *args])
    except SystemExit as exc:  # argparse: a usage line, then the one error line
        code = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("usage:")]
    assert code not in (0, None) and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("octlm: error: ") and expected in lines[0], lines[0]
    assert tree(tmp_path) == before


def test_rl_data_force_replaces_an_existing_file(tmp_path, capsys) -> None:
    out = tmp_path / "old.jsonl"
    out.write_text("keep me\n")
    assert main(["rl-data", "--task", "count", "--count", "3", "--out", str(out), "--force"]) == 0
    assert len(out.read_text().splitlines()) == 3 and "keep me" not in out.read_text()


def test_the_task_modules_import_no_torch() -> None:
    code = "import sys, octlm.rl.tasks, octlm.rl.task_data, octlm.cli.tasks; "
    code += "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
