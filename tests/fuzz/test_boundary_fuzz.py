"""The fuzz of issue 62's surface, seeded and bounded: task files in each layout `octlm eval
--task FILE` reads (octlm's, HellaSwag's, ARC's, and the standard mc/schema/lm/bpb lines), RL
task specs and `octlm rl-data`'s arguments, and RL settings through `--print-config`. Each input
works or is refused with one `OctlmError` line (in process, for speed; a few through the real
command), never another exception, never a partial file. Found cases stay as plain tests below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from octlm.config.files import make_rl_config, sectioned_toml
from octlm.config.rl import KEY_ORDER
from octlm.errors import OctlmError
from octlm.evaluate.protocol import read_tasks
from octlm.rl.tasks import get_task
from tests.fuzz.harness import problems, run_cli

BOUNDED = settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LAYOUTS = (
    {"context": "The sky is", "choices": ["blue", "green"], "gold": 0},
    {"ctx": "A man", "endings": ["runs", "sits"], "label": 1},
    {"question": "q?", "choices": {"text": ["x", "y"], "label": ["A", "B"]}, "answerKey": "B"},
    {"format": "mc", "context": "a", "choices": ["b", "c"], "gold": 1},
    {"format": "schema", "contexts": ["a", "b"], "continuation": "c", "gold": 0},
    {"format": "lm", "context": "a", "continuation": "b"},
    {"format": "bpb", "context": "a", "continuation": "b", "delimiter": ""},
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


def one_line(exc: OctlmError) -> None:
    assert "\n" not in exc.message and exc.problem, exc.message


@st.composite
def task_lines(draw) -> list[object]:
    """Lines of one layout, each with fields dropped or swapped for any JSON value."""
    layout = draw(st.sampled_from(LAYOUTS))
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        line = dict(layout)
        for key in draw(st.lists(st.sampled_from(sorted(layout)), max_size=2, unique=True)):
            if draw(st.booleans()):
                del line[key]
            else:
                line[key] = draw(JSON)
        lines.append(line if draw(st.integers(0, 9)) else draw(JSON))
    return lines


@BOUNDED
@given(task_lines())
def test_a_task_file_of_any_layout_is_read_or_refused_in_one_line(tmp_path, lines) -> None:
    file = tmp_path / "task.jsonl"
    file.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    try:
        tasks = read_tasks(str(file))
    except OctlmError as exc:
        one_line(exc)
        return
    assert tasks and all(item.continuations for t in tasks for item in t.items)


SPECS = st.text(max_size=12) | st.builds(
    "{}{}{}".format,
    st.sampled_from(["addition", "sorting", "count", "reasoning_gym", "nope"]),
    st.sampled_from(["", ":", "::"]),
    st.text(max_size=4) | st.integers(-2, 20).map(str),
)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(SPECS, st.integers(0, 2**53 - 1))
def test_an_rl_task_spec_names_a_task_or_is_refused_in_one_line(spec, seed) -> None:
    try:
        task = get_task(spec)
    except OctlmError as exc:
        one_line(exc)
        return
    problem = task.problem(seed, 0, 0)  # a named task makes its problems and scores a reply
    assert 0.0 <= task.reward(problem, "") <= 1.0


@BOUNDED
@given(
    SPECS.filter(lambda s: not s.startswith("reasoning_gym")),
    st.sampled_from(["0", "-1", "2", "1e3", "x", ""]),
    st.sampled_from(["a.jsonl", "a.txt", "", " ", "sub/a.jsonl", "a.jsonl/"]),
    st.sampled_from(["0", "-1", "7", str(2**64)]),
)
def test_rl_data_writes_its_file_or_leaves_nothing(tmp_path_factory, spec, count, out, seed):
    root = tmp_path_factory.mktemp("rl_data")
    args = ["rl-data", "--task", spec, "--count", count, "--out", out, "--seed", seed]
    outcome = run_cli(args, root)
    if outcome.code == 0:
        assert (root / out).is_file() and outcome.crash is None
    else:
        assert problems(outcome) == [], (args, outcome)


RL_VALUES = {
    "prompts": st.integers(-1, 5000),
    "samples": st.integers(-1, 5000),
    "max_new_tokens": st.integers(-1, 10) | st.just(2**60),
    "temperature": st.floats(allow_nan=True) | st.integers(0, 3),
    "top_k": st.none() | st.integers(-1, 3),
    "steps": st.integers(-1, 9),
    "stop_at": st.none() | st.integers(-1, 9),
    "lr": st.floats(),
    "seed": st.integers(-1, 2**54),
    "eval_every": st.integers(-1, 5),
    "pass_k": st.integers(-1, 9),
    "sampler": st.none() | st.sampled_from(["exact", "plain", "", "x"]),
    "on_policy": st.booleans() | st.integers(0, 1),
    "log_to": st.none() | st.sampled_from(["tensorboard", "wandb,tensorboard", "nope", ","]),
}


@BOUNDED
@given(st.fixed_dictionaries({}, optional=RL_VALUES))
def test_rl_settings_print_and_read_back_or_are_refused(tmp_path_factory, values) -> None:
    assert set(RL_VALUES) <= set(KEY_ORDER)
    try:
        cfg = make_rl_config(source="ft", task="count", out="rl", **values)
    except OctlmError as exc:
        one_line(exc)
        return
    folder = tmp_path_factory.mktemp("rl_toml")
    printed = sectioned_toml(cfg)
    (folder / "rl.toml").write_text(printed, encoding="utf-8")
    again = make_rl_config(folder / "rl.toml")
    assert again == cfg and sectioned_toml(again) == printed


@pytest.mark.slow  # real commands, each a process
@pytest.mark.parametrize(
    "args",
    [
        ["rl-data", "--task", "addition:0", "--count", "2", "--out", "a.jsonl"],
        ["rl-data", "--task", "count", "--count", "2", "--out", "a.txt"],
        ["eval", "run", "--task-prompts", "3", "--tasks", "count"],
    ],
)
def test_a_few_fuzzed_inputs_through_the_real_command(args, tmp_path) -> None:
    from tests.e2e.helpers import octlm

    proc = octlm(*args, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("octlm: error: ") and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_eval_items_read_from_every_layout_are_scorable(tmp_path: Path) -> None:
    """Control for the task-file fuzz: each layout as written reads (the fuzz's base cases)."""
    for number, layout in enumerate(LAYOUTS):
        file = tmp_path / f"t{number}.jsonl"
        file.write_text(json.dumps(layout) + "\n", encoding="utf-8")
        assert read_tasks(str(file))[0].items
