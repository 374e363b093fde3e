"""Messages that can be followed (issue 62, kind 7): a refusal names a setting as the user typed
it on that command (`--stop-at 9`, not the settings' `stop_at=9`; a `--config` file's key as
the file spells it), on every command that takes settings (`train`, `sweep`, `verify-resume`,
`rl`, `eval`); a prompt that alone fills the context is named as such, with the context, not
answered with `--max-new-tokens` advice. In process (`octlm.cli.main.main`), one real process."""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.cli.flags import as_in_file, as_typed
from tests.cli_in_process import main
from tests.test_bad_input import tree

TINY = ["--model", "tiny", "--context", "32", "--warmup", "1"]
# (arguments; what the error line says; the internal spelling it must not hold)
NAMED = {
    "train": (
        ["train", *TINY, "--steps", "4", "--stop-at", "9"],
        "--stop-at 9 must be between 1 and --steps 4",
        "stop_at",
    ),
    "train_multiple": (
        ["train", *TINY, "--val-every", "2", "--eval-tasks-every", "3"],
        "--eval-tasks-every 3 is not a multiple of --val-every 2",
        "val_every",
    ),
    "train_muon_key": (
        ["train", *TINY, "--muon-ns-steps", "3"],
        "--muon-ns-steps is for --optimizer muon",
        "muon_ns_steps",
    ),
    "train_unknown_model": (
        ["train", "--model", "tiny", "--packing", "x"],
        "--packing 'x' is unknown",
        "error: packing",
    ),
    "sweep": (
        ["sweep", *TINY, "--steps", "4", "--stop-at", "9", "--grid", "lr=1e-3,2e-3", "--out", "sw"],
        "--stop-at 9 must be between 1 and --steps 4",
        "stop_at",
    ),
    "verify_resume": (
        ["verify-resume", *TINY, "--micro-batch", "0", "--split", "2"],
        "--micro-batch 0 must be an integer",
        "micro_batch",
    ),
    "rl": (
        ["rl", "run", "--task", "count", "--out", "r", "--steps", "4", "--stop-at", "9"],
        "--stop-at 9 must be between 1 and --steps 4",
        "stop_at",
    ),
    "rl_bool": (
        ["rl", "run", "--task", "count", "--out", "r", "--on-policy", "--sampler", "plain"],
        "--on-policy reads the exact path's log-probs; --sampler plain",
        "on_policy",
    ),
    "rl_tracker": (
        ["rl", "run", "--task", "count", "--out", "r", "--log-to", "nope"],
        "--log-to names an unknown tracker",
        "log_to",
    ),
    "eval": (
        ["eval", "run", "--tasks", "count", "--pass-k", "0"],
        "--pass-k 0 must be an integer from 1 to 4096; change it on the command line",
        "pass_k",
    ),
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("case", NAMED, ids=NAMED)
def test_a_setting_is_named_as_typed(case, workdir, capsys) -> None:
    args, says, internal = NAMED[case]
    before = tree(workdir)
    assert main(args) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and says in lines[0] and internal not in lines[0], lines
    assert tree(workdir) == before


def test_a_config_files_key_keeps_the_files_spelling(workdir, capsys) -> None:
    """From a `--config` file the key is the file's, and the file is named; a flag given beside
    it is the flag."""
    (workdir / "rl.toml").write_text('task = "count"\nout = "r"\nsteps = 4\nstop_at = 9\n')
    assert main(["rl", "run", "--config", "rl.toml"]) == 1
    err = capsys.readouterr().err
    assert "stop_at=9 must be between 1 and steps=4 (stop_at, steps set in rl.toml)" in err
    assert main(["rl", "run", "--config", "rl.toml", "--stop-at", "8"]) == 1
    err = capsys.readouterr().err
    assert "--stop-at 8 must be between 1 and steps=4 (steps set in rl.toml)" in err


TRAIN_FILE = 'model = "tiny"\ncontext = 32\n'
# Checks that run once the settings are built, on each command that takes --config: (the
# command, the settings as flags (the same as the file's keys in the other run); what the line
# says from the flags; what it says from the file).
NOWHERE = (
    ["--init-from", "nowhere"],
    "--init-from nowhere does not exist;",
    "init_from=nowhere does not exist (init_from set in s.toml);",
)
AFTER_BUILD = {
    "train": (["train", "--out", "r"], *NOWHERE),
    "train_fix": (
        ["train", "--out", "r"],
        ["--warmup", "9", "--steps", "4"],
        "--warmup 9 is longer than --steps 4; use --warmup at most --steps",
        "warmup=9 is longer than steps=4 (warmup, steps set in s.toml); use warmup at most steps",
    ),
    "sweep": (["sweep", "--grid", "lr=1e-3,2e-3", "--out", "sw"], *NOWHERE),
    "verify_resume": (
        ["verify-resume", "--split", "5"],
        ["--steps", "4", "--warmup", "1"],
        "0 and --steps 4; pass --split K with 0 < K < --steps",
        "0 and steps=4 (steps set in s.toml); pass --split K with 0 < K < steps",
    ),
    "rl": (
        ["rl", "run", "--task", "count", "--nproc", "2", "--out", "r"],
        ["--prompts", "3"],
        "use 1, 3 process(es) for --prompts 3, or another --prompts",
        "(prompts set in s.toml); use 1, 3 process(es) for prompts=3, or another prompts",
    ),
}


@pytest.mark.parametrize("case", AFTER_BUILD, ids=AFTER_BUILD)
def test_a_check_after_the_settings_names_the_setting_where_it_was_given(
    case, workdir, capsys, request
) -> None:
    """The value from a flag: the flag; the same value from the `--config` file: the file's key
    and the file (control: one and the same check, nothing written either way)."""
    command, flags, from_flags, from_file = AFTER_BUILD[case]
    pairs = zip(flags[::2], flags[1::2], strict=True)
    keys = "".join(
        f"{f[2:].replace('-', '_')} = {v if v.isdigit() else repr(v)}\n" for f, v in pairs
    )
    base = "" if command[0] == "rl" else TRAIN_FILE
    if command[0] == "train":  # a run reads its data first: a prepared one, not the embedded
        base += f"data = {str(request.getfixturevalue('tiny_dataset'))!r}\n"
    (workdir / "s.toml").write_text(base + keys)
    (workdir / "b.toml").write_text(base)
    before = tree(workdir)
    said = []
    for args in ([*command, "--config", "b.toml", *flags], [*command, "--config", "s.toml"]):
        assert main(args) == 1
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1, lines
        said.append(lines[0])
    assert from_flags in said[0] and "s.toml" not in said[0], said
    assert from_file in said[1] and "--" not in said[1].split(";")[0], said
    assert tree(workdir) == before


def test_as_in_file_names_the_files_keys_and_leaves_the_sentence() -> None:
    values = {"warmup": 9, "steps": 4, "optimizer": "adamw", "on_policy": True, "fused": False}
    assert as_in_file("use --warmup at most --steps", values) == "use warmup at most steps"
    assert as_in_file("--muon-ns-steps is for --optimizer muon, not adamw", values) == (
        "--muon-ns-steps is for optimizer=muon, not adamw"
    )
    assert as_in_file("drop --sampler plain (or --on-policy), --no-fused", values) == (
        "drop --sampler plain (or on_policy=true), fused=false"
    )
    assert as_in_file("--steps-x and --warmup-steps stay", values) == (
        "--steps-x and --warmup-steps stay"
    )


def test_as_typed_leaves_paths_quotes_and_words_alone() -> None:
    text = "steps 3 after warmup in 'runs/eval_tasks/x' and /a/stop_at=1"
    assert as_typed(text, ["steps", "eval_tasks", "stop_at"]) == text  # not at the start
    assert as_typed("steps=3 and eval_tasks", ["steps", "eval_tasks"]) == (
        "--steps 3 and --eval-tasks"
    )
    assert as_typed("on_policy=true, fused=False", ["on_policy", "fused"]) == (
        "--on-policy, --no-fused"
    )


@pytest.mark.slow
def test_a_prompt_that_alone_fills_the_context_is_named_so(tiny_tokenizer, tmp_path_factory):
    """`octlm rl` and `octlm eval --tasks` (real processes): the prompt's length and the
    context, not `--max-new-tokens` advice; control: a reply too long for the room a short
    prompt leaves gets the `--max-new-tokens` advice."""
    from tests.e2e.helpers import octlm
    from tests.rl.helpers import CONTEXT, chat_source

    source = str(chat_source(tiny_tokenizer, tmp_path_factory))
    cwd = tmp_path_factory.mktemp("fills")
    says = f"which alone fills the model's context of {CONTEXT}; use a task of shorter prompts"
    for args in (["rl", source, "--task", "sorting:16", "--out", "r"],
                 ["eval", source, "--tasks", "sorting:16", "--eval-prompts", "2"]):  # fmt: skip
        proc = octlm(*args, cwd=cwd, check=False)
        assert proc.returncode == 1 and says in proc.stderr, proc.stderr
        assert "--max-new-tokens" not in proc.stderr
    control = ["rl", source, "--task", "addition:1", "--out", "r", "--max-new-tokens", "60"]
    proc = octlm(*control, cwd=cwd, check=False)
    assert (
        proc.returncode == 1 and "or less" in proc.stderr and "use --max-new-tokens" in proc.stderr
    )
    # The same value from a --config file: the file's key and the file, in problem and advice.
    settings = tmp_path_factory.mktemp("settings") / "rl.toml"
    settings.write_text("max_new_tokens = 60\n")
    control[-2:] = ["--config", str(settings)]
    proc = octlm(*control, cwd=cwd, check=False)
    assert proc.returncode == 1 and "max_new_tokens=60 after a prompt of" in proc.stderr
    assert f"(max_new_tokens set in {settings}); use max_new_tokens=" in proc.stderr
    assert "--max-new-tokens" not in proc.stderr
    assert list(cwd.iterdir()) == []


def _refused_resumes(run: list[str], given: list[str], settings: Path, cwd: Path) -> list[str]:
    """The error lines of a resume of `run` (in `cwd`, its folder `r`) changed by the flags
    `given`, then by the `settings` file; the folder as it was after each."""
    from tests.e2e.helpers import octlm

    before, said = tree(cwd / "r"), []
    for changed in (given, ["--config", str(settings)]):
        proc = octlm(*run, "--resume", *changed, cwd=cwd, check=False)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        said.append(proc.stderr.strip().splitlines()[-1])
        assert tree(cwd / "r") == before
    return said


@pytest.mark.slow
def test_a_refused_training_resume_names_the_changed_settings_as_given(tiny_dataset, tmp_path):
    """`octlm train --resume` with other settings (real processes): each changed setting as it
    was given, both sides in full: `--seed 5 -> 6` from flags, the file's `seed: 5 -> 7` and the
    file from a --config file."""
    from tests.e2e.helpers import octlm

    run = ["train", "--model", "tiny", "--data", str(tiny_dataset), "--context", "32"]
    # A step of 2 sequences, not the default 16 x 32 (78 s for its one step on an AVX2 EPYC
    # under the suite): only the refusals' lines are checked.
    run += ["--micro-batch", "2", "--accum", "1"]
    run += ["--steps", "2", "--warmup", "1", "--out", "r", "--no-progress"]
    octlm(*run, "--seed", "5", "--lr", "3e-3", "--stop-at", "1", cwd=tmp_path)
    (tmp_path / "c.toml").write_text("seed = 7\nlr = 0.001\n")
    flags, file = _refused_resumes(
        run, ["--seed", "6", "--lr", "1e-3"], tmp_path / "c.toml", tmp_path
    )
    assert "config fingerprint: --lr 0.003 -> 0.001; --seed 5 -> 6; resume with" in flags
    assert "seed:" not in flags and "c.toml" not in flags
    said = "config fingerprint: lr: 0.003 -> 0.001; seed: 5 -> 7 (lr, seed set in "
    assert said in file and "--seed" not in file and "--lr" not in file


@pytest.mark.slow
def test_a_refused_rl_resume_names_the_changed_settings_as_given(tiny_tokenizer, tmp_path_factory):
    """`octlm rl --resume` with other settings (real processes), as `octlm train`'s: a text
    value's both sides in full (`--task 'addition:1' -> 'addition:2'`)."""
    from tests.e2e.helpers import octlm
    from tests.rl.helpers import RL, chat_source

    cwd = tmp_path_factory.mktemp("rl-resume")
    at = RL.index("--task")  # the task as each resume gives it: a flag, or the file's key
    run = ["rl", str(chat_source(tiny_tokenizer, tmp_path_factory)), *RL[:at], *RL[at + 2 :]]
    run += ["--out", "r"]
    octlm(*run, *RL[at : at + 2], "--stop-at", "1", cwd=cwd)
    (cwd / "c.toml").write_text('seed = 2\ntask = "addition:2"\n')
    given = ["--seed", "1", "--task", "addition:2"]
    flags, file = _refused_resumes(run, given, cwd / "c.toml", cwd)
    assert "(--task 'addition:1' -> 'addition:2'; --seed 0 -> 1)" in flags, flags
    assert "c.toml" not in flags
    said = "(task: 'addition:1' -> 'addition:2'; seed: 0 -> 2) (task, seed set in "
    assert said in file and "--" not in file.split(";")[0], file
