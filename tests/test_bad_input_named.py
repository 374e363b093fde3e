"""Messages that can be followed (issue 62, kind 7): a refusal names a setting as the user typed
it on that command (`--stop-at 9`, not the settings' `stop_at=9`; a `--config` file's key as
the file spells it), on every command that takes settings (`train`, `sweep`, `verify-resume`,
`rl`, `eval`); a prompt that alone fills the context is named as such, with the context, not
answered with `--max-new-tokens` advice. In process (`octlm.cli.main.main`), one real process."""

from __future__ import annotations

import pytest

from octlm.cli.flags import as_typed
from octlm.cli.main import main
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
    """From a `--config` file the key is the file's; a flag given beside it is the flag."""
    (workdir / "rl.toml").write_text('task = "count"\nout = "r"\nsteps = 4\nstop_at = 9\n')
    assert main(["rl", "run", "--config", "rl.toml"]) == 1
    assert "stop_at=9 must be between 1 and steps=4" in capsys.readouterr().err
    assert main(["rl", "run", "--config", "rl.toml", "--stop-at", "8"]) == 1
    assert "--stop-at 8 must be between 1 and steps=4" in capsys.readouterr().err


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
    assert list(cwd.iterdir()) == []
