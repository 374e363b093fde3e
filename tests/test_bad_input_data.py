"""Bad input on the data surface, in the style of tests/test_bad_input.py: `--data` mixtures
(the flag and the TOML [data] table), task files (`octlm eval RUN --tasks`, read before any
model is loaded, so most cases need no trained run) and their specs (`--tasks`,
`--eval-tasks`). Each is one stderr line `octlm: error: PROBLEM; FIX` naming the value (a task
file's error: the file, the line and the field), a non-zero exit, no traceback, and the tree as
it was. The slow cases train: a bad task file refused before the first step, and `octlm eval`
on a real run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli_in_process import main
from tests.fuzz.harness import problems, run_cli

TINY = ("--model", "tiny", "--context", "32", "--steps", "4", "--warmup", "1")
RANGE = "is not a positive number from 1e-9 to 1e15"
COUNT = "must be an integer from 1 to 2**53 - 1"
OK = {"context": "A cat", "choices": [" sat", " flew"], "gold": 0}
HELLA = {"ctx": "He opens", "endings": ["the door", "a sky"], "label": "1"}
ARC = {"question": "2+2?", "choices": {"text": ["3", "4"], "label": ["A", "B"]}, "answerKey": "B"}

# (the --data spec; what the error line must say)
MIXTURE_FLAGS = {
    "sum_overflows": ("a:1e308,b:1e308", f"the weight of 'a:1e308' {RANGE}"),
    "weight_vanishes": ("a:1e-320,b:1", f"the weight of 'a:1e-320' {RANGE}"),
    "weight_below_range": ("a:1e-10,b:1e-10", f"the weight of 'a:1e-10' {RANGE}"),
    "weight_above_range": ("a:1e16,b:1e16", f"the weight of 'a:1e16' {RANGE}"),
    "weight_past_float": ("a:1,b:1e400", f"the weight of 'b:1e400' {RANGE}"),
    "share_never_read": ("a:0.0001,b:1", "'a' is 0.0001 of the whole, less than one sample"),
    "share_of_counts": ("a:1,b:2000", "'a' is 0.0005 of the whole"),
    "weight_zero": ("a:0,b:1", f"the weight of 'a:0' {RANGE}"),
    "weight_negative_zero": ("a:-0,b:1", f"the weight of 'a:-0' {RANGE}"),
    "weight_negative": ("a:-1,b:1", f"the weight of 'a:-1' {RANGE}"),
    "weight_nan": ("a:nan,b:1", f"the weight of 'a:nan' {RANGE}"),
    "weight_inf": ("a:inf,b:1", f"the weight of 'a:inf' {RANGE}"),
    "weight_hex": ("a:0x1,b:1", "the weight of 'a:0x1' is not a number"),
    "weight_word": ("a:1,b:lots", "the weight of 'b:lots' is not a number"),
    "part_without_weight": ("a:0.7,b", "'b' is not PATH:WEIGHT"),
    "trailing_comma": ("a:1,b:1,", "'' is not PATH:WEIGHT"),
    "no_path": (":1,b:1", "':1' is not PATH:WEIGHT"),
    "same_path": ("a:1,a:2", "the dataset 'a' is named twice"),
    "trailing_slash": ("a:1,a/:1", "the dataset 'a' is named twice (as 'a/')"),
    "dot_slash": ("a:1,./a:1", "the dataset 'a' is named twice (as './a')"),
    "through_a_link": ("a:1,link:1", "the dataset 'a' is named twice (as 'link')"),
    "parent_and_back": ("a:1,b/../a:1", "the dataset 'a' is named twice (as 'b/../a')"),
    "long_spec": ("a:1," + "b" * 5000 + ":x", "is not a number"),
    "long_path_twice": ("b" * 300 + ":1," + "b" * 300 + ":1", "is named twice"),
}

# (the [data] table's lines; what the error line must say)
MIXTURE_TOML = {
    "bool_weight": ('"a" = true\n"b" = 1', "the weight of 'a' in [data] is not a number (True)"),
    "string_weight": ('"a" = "0.5"\n"b" = 1', "the weight of 'a' in [data] is not a number"),
    "nan_weight": ('"a" = nan\n"b" = 1', f"the weight of 'a' in [data] {RANGE} (nan)"),
    "inf_weight": ('"a" = inf\n"b" = 1', f"the weight of 'a' in [data] {RANGE} (inf)"),
    "huge_weight": ('"a" = 1e308\n"b" = 1e308', f"the weight of 'a' in [data] {RANGE}"),
    "huge_int_weight": (f'"a" = {10**400}\n"b" = 1', f"the weight of 'a' in [data] {RANGE}"),
    "tiny_weight": ('"a" = 1e-320\n"b" = 1', f"the weight of 'a' in [data] {RANGE}"),
    "zero_weight": ('"a" = 0\n"b" = 1', f"the weight of 'a' in [data] {RANGE} (0)"),
    "list_weight": ('"a" = [1]\n"b" = 1', "the weight of 'a' in [data] is not a number ([1])"),
    "table_weight": ('"a" = { x = 1 }\n"b" = 1', "the weight of 'a' in [data] is not a number"),
    "date_weight": ('"a" = 1979-05-27\n"b" = 1', "the weight of 'a' in [data] is not a number"),
    "empty_table": ("", "[data] names no dataset"),
    "comma_in_name": ('"a,b" = 1\n"b" = 1', "[data] names a dataset 'a,b'"),
    "blank_name": ('"" = 1\n"b" = 1', "[data] names a dataset ''"),
    "respelt_name": ('"a" = 1\n"a/" = 1', "the dataset 'a' is named twice (as 'a/')"),
    "small_share": ('"a" = 1\n"b" = 5000', "'a' is 0.0002 of the whole"),
}


def line(record: object) -> str:
    return json.dumps(record) + "\n"


# (the task file's text, or bytes; what the error line must say)
TASK_FILES = {
    "context_number": (line({**OK, "context": 5}), "t.jsonl:1: field 'context': must be a string"),
    "context_null": (line({**OK, "context": None}), "t.jsonl:1: field 'context': must be a str"),
    "context_missing": (line({"choices": ["a"], "gold": 0}), "t.jsonl:1: field 'context': is "),
    "choices_string": (line({**OK, "choices": "ab"}), "field 'choices': must be a non-empty list"),
    "choices_empty": (line({**OK, "choices": []}), "field 'choices': must be a non-empty list"),
    "choices_null": (line({**OK, "choices": None}), "field 'choices': must be a non-empty list"),
    "choices_number_item": (line({**OK, "choices": ["a", 3]}), "field 'choices[1]': must be a st"),
    "gold_out_of_range": (line({**OK, "gold": 2}), "field 'gold': gold 2 is not one of the choi"),
    "gold_negative": (line({**OK, "gold": -1}), "field 'gold': gold -1 is not one of the choic"),
    "gold_bool": (line({**OK, "gold": True}), "field 'gold': must be an integer from 0 to 1, no"),
    "gold_float": (line({**OK, "gold": 0.0}), "field 'gold': must be an integer from 0 to 1"),
    "gold_null": (line({**OK, "gold": None}), "field 'gold': must be an integer from 0 to 1"),
    "gold_huge": (line({**OK, "gold": 10**30}), "field 'gold': gold 10000000000000000000000000"),
    "gold_missing": (line({"context": "a", "choices": ["b"]}), "t.jsonl:1: field 'gold': is mi"),
    "delimiter_number": (line({**OK, "delimiter": 1}), "field 'delimiter': must be a string"),
    "context_lone_surrogate": (
        line({**OK, "context": "\ud800"}),
        "field 'context': holds a lone surrogate",
    ),
    "choice_lone_surrogate": (
        line({**OK, "choices": ["a", "\udc80"]}),
        "field 'choices[1]': holds a lone surrogate",
    ),
    "hellaswag_label_word": (line({**HELLA, "label": "one"}), "field 'label': must be an integer"),
    "hellaswag_label_range": (line({**HELLA, "label": "7"}), "field 'label': label '7' is not"),
    "hellaswag_endings_string": (line({**HELLA, "endings": "a"}), "field 'endings': must be a n"),
    "hellaswag_ctx_missing": (line({"endings": ["a"], "label": 0}), "field 'ctx': is missing"),
    "arc_choices_list": (line({**ARC, "choices": ["3", "4"]}), "field 'choices': must be {\"t"),
    "arc_answer_unknown": (line({**ARC, "answerKey": "C"}), "field 'answerKey': 'C' is not one"),
    "arc_answer_number": (line({**ARC, "answerKey": 1}), "field 'answerKey': must be a string"),
    "arc_labels_short": (
        line({**ARC, "choices": {"text": ["3", "4"], "label": ["A"]}}),
        "field 'choices.label': must be 2 distinct labels",
    ),
    "not_an_object": (line(OK) + line([1, 2]), "t.jsonl:2: is not a JSON object but [1, 2]"),
    "no_layout": (line({"text": "x"}), "t.jsonl:1: has none of the task layouts"),
    "truncated_last_line": (line(OK) + line(OK)[:12], "t.jsonl:2 is not a task question"),
    "invalid_utf8": (line(OK).encode() + b"\n\n\xff\xfe\n", "t.jsonl:4 is not UTF-8 (byte 0xff)"),
    "encoded_surrogate": (line(OK).encode() + b'"\xed\xa0\x80"\n', "t.jsonl:2 is not UTF-8"),
    "blank_lines_only": ("\n  \n\n", "task file t.jsonl holds no question"),
    "empty_file": ("", "task file t.jsonl holds no question"),
    "nan_literal": ('{"context": NaN, "choices": ["a"], "gold": 0}\n', "field 'context': must"),
    "deep_nesting": ("[" * 100_000 + "]" * 100_000 + "\n", "t.jsonl:1 is not a task question"),
}

# (the --tasks value, files written beside it; what the error line must say)
TASK_SPECS = {
    "empty": ("", "--tasks '' names no task file"),
    "only_commas": (",", "--tasks ',' names no task file"),
    "blank": ("  , ", "names no task file"),
    "count_zero": ("ok.jsonl:0", f"--tasks: N=0 in 'ok.jsonl:0' {COUNT}"),
    "count_negative": ("ok.jsonl:-2", f"--tasks: N=-2 in 'ok.jsonl:-2' {COUNT}"),
    "count_huge": (f"ok.jsonl:{10**30}", f"N={10**30} in"),
    "count_float": ("ok.jsonl:1.5", f"N='1.5' in 'ok.jsonl:1.5' {COUNT}"),
    "count_word": ("ok.jsonl:abc", f"task file ok.jsonl: N='abc' {COUNT}"),
    "count_empty": ("ok.jsonl:", f"N='' {COUNT}"),
    "missing_file": ("nope.jsonl", "task file nope.jsonl does not exist"),
    "name_too_long": ("ok.jsonl:" + "x" * 5000, "task file ok.jsonl: N='xxxxx"),
    "a_folder": ("trained", "task file trained is not a file"),
    "same_name_twice": ("ok.jsonl,sub/ok.jsonl", "two task files share the name 'ok'"),
    "rtl_override_name": ("\u202eevil.jsonl", "its name '\\u202eevil' holds a control or invis"),
    "zero_width_name": ("zw\u200b.jsonl", "its name 'zw\\u200b' holds a control or invisible"),
    "control_char_name": ("bell\x07.jsonl", "its name 'bell\\x07' holds a control or invisible"),
}

# (the --eval-tasks value of `octlm train`; what the error line must say)
TRAIN_EVAL_TASKS = {
    "empty": ("", "--eval-tasks '' must be a non-empty string"),
    "only_comma": (",", "--eval-tasks ',' names no task file"),
    "count_zero": ("next_line:0", f"--eval-tasks: N=0 in 'next_line:0' {COUNT}"),
    "count_negative": ("next_line:-1", f"--eval-tasks: N=-1 in 'next_line:-1' {COUNT}"),
}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    """The current folder: an existing run folder, two dataset names (and a link to one), a
    stand-in `trained` folder (task files are read before a model is loaded) and task files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.jsonl").write_text('{"type": "header"}\n')
    for name in ("a", "b", "trained", "sub"):
        (tmp_path / name).mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    for name in (
        "ok.jsonl",
        "sub/ok.jsonl",
        "\u202eevil.jsonl",
        "zw\u200b.jsonl",
        "bell\x07.jsonl",
    ):
        (tmp_path / name).write_text(line(OK), encoding="utf-8")
    return tmp_path


def assert_refused(args: list[str], expected: str, root: Path) -> None:
    """`octlm ARGS` refused in one line holding `expected`, the tree unchanged (the fuzz's
    four properties, tests/fuzz/harness.py)."""
    outcome = run_cli(args, root)
    assert outcome.code != 0 and not problems(outcome), (problems(outcome), outcome.err)
    assert expected in outcome.err and "; " in outcome.err, outcome.err


@pytest.mark.parametrize("case", MIXTURE_FLAGS, ids=MIXTURE_FLAGS)
def test_a_bad_mixture_is_one_line(case, workdir) -> None:
    spec, expected = MIXTURE_FLAGS[case]
    assert_refused(["train", *TINY, "--out", "run", "--data", spec], expected, workdir)


@pytest.mark.parametrize("case", MIXTURE_TOML, ids=MIXTURE_TOML)
def test_a_bad_data_table_is_one_line(case, workdir) -> None:
    table, expected = MIXTURE_TOML[case]
    (workdir / "mix.toml").write_text('model = "tiny"\ncontext = 32\n[data]\n' + table + "\n")
    for command in (["train", "--out", "run"], ["train", "--print-config"]):
        assert_refused([*command, "--config", "mix.toml"], expected, workdir)


@pytest.mark.parametrize("case", TASK_FILES, ids=TASK_FILES)
def test_a_bad_task_file_is_one_line(case, workdir) -> None:
    content, expected = TASK_FILES[case]
    data = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
    (workdir / "t.jsonl").write_bytes(data)
    assert_refused(["eval", "trained", "--tasks", "t.jsonl"], expected, workdir)


@pytest.mark.parametrize("case", TASK_SPECS, ids=TASK_SPECS)
def test_a_bad_task_spec_is_one_line(case, workdir) -> None:
    spec, expected = TASK_SPECS[case]
    assert_refused(["eval", "trained", "--tasks", spec], expected, workdir)


@pytest.mark.parametrize("case", TRAIN_EVAL_TASKS, ids=TRAIN_EVAL_TASKS)
def test_a_bad_eval_tasks_setting_is_one_line(case, workdir) -> None:
    spec, expected = TRAIN_EVAL_TASKS[case]
    for command in (["train", *TINY, "--out", "run"], ["train", "--print-config"]):
        assert_refused([*command, "--eval-tasks", spec], expected, workdir)


def test_a_good_mixture_and_task_spec_still_pass(workdir, capsys) -> None:
    for spec in ("a:0.7,b:0.3", "a:7,b:3", "a:1,b:999", "a:1e-9,b:1e-9", "a:1e15,b:1e15"):
        assert main(["train", "--print-config", "--data", spec]) == 0
    assert main(["train", "--print-config", "--eval-tasks", "ok.jsonl:3,next_line:30,"]) == 0
    capsys.readouterr()


@pytest.mark.slow
def test_a_bad_task_file_is_refused_before_the_first_step(workdir, tiny_dataset) -> None:
    (workdir / "t.jsonl").write_text(line(OK) + line({**OK, "gold": 5}), encoding="utf-8")
    args = ["train", *TINY, "--data", str(tiny_dataset), "--micro-batch", "2", "--accum", "1"]
    args += ["--no-progress", "--eval-tasks", "t.jsonl"]
    assert_refused([*args, "--out", "new"], "t.jsonl:2: field 'gold'", workdir)
    assert not (workdir / "new").exists()
    # An existing folder: as it was (no log, no checkpoint, no lock file left behind).
    (workdir / "old").mkdir()
    (workdir / "old" / "note.txt").write_text("mine\n")
    outcome = run_cli([*args, "--out", "old"], workdir)
    assert outcome.code != 0 and "t.jsonl:2: field 'gold'" in outcome.err
    assert outcome.changed == []


@pytest.mark.slow
@pytest.mark.parametrize("case", ["gold_out_of_range", "invalid_utf8", "arc_answer_unknown"])
def test_a_bad_task_file_is_one_line_for_a_trained_run(case, workdir, straight_run) -> None:
    shutil.rmtree(workdir / "trained")
    shutil.copytree(straight_run(), workdir / "trained")
    content, expected = TASK_FILES[case]
    data = content if isinstance(content, bytes) else content.encode("utf-8")
    (workdir / "t.jsonl").write_bytes(data)
    assert_refused(["eval", "trained", "--tasks", "t.jsonl"], expected, workdir)
