"""`octlm eval RUN --tasks NAME` with a verifiable task of `octlm rl` (the task protocol's
generative kind): the held-out pass@1 and pass@k the held-out scorer gives with the same
settings, `--top-k` reaching the sampler, a spec mixing kinds, the old `--task` answered with
one line, and the sampling defaults `octlm rl`'s own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octlm.cli.main import build_parser
from octlm.cli.model import rl_default
from octlm.config.rl import FIELDS
from octlm.generation.trained import load_model, run_tokenizer
from octlm.rl.heldout import score_heldout
from octlm.rl.tasks import get_task
from tests.e2e.helpers import octlm
from tests.rl.helpers import chat_source

pytestmark = pytest.mark.slow

SAMPLING = {"prompts": 6, "k": 2, "seed": 3, "max_new_tokens": 6, "temperature": 1.0}
FLAGS = ("--eval-prompts", "6", "--pass-k", "2", "--seed", "3", "--max-new-tokens", "6")


@pytest.fixture(scope="module")
def source(tiny_tokenizer, tmp_path_factory) -> Path:
    return chat_source(tiny_tokenizer, tmp_path_factory)


def scored(source: Path, *extra: str) -> dict:
    out = octlm("eval", str(source), *FLAGS, *extra, "--json").stdout
    return json.loads(out)["scores"]


def reference(source: Path, top_k: int | None) -> dict:
    """The old `--task` path's numbers: the held-out scorer called directly."""
    model, info = load_model(source)
    task = get_task("addition:1")
    score = score_heldout(model, run_tokenizer(info), task, **SAMPLING, top_k=top_k)
    return {f"{key}/addition:1": value for key, value in score.fields().items()}


def test_a_generative_task_scores_as_the_heldout_scorer(source) -> None:
    plain = scored(source, "--tasks", "addition:1")
    assert plain == reference(source, None)
    assert 0 <= plain["pass@1/addition:1"] <= plain["pass@2/addition:1"] <= 1
    line = octlm("eval", str(source), *FLAGS, "--tasks", "addition:1").stdout
    assert f"task addition:1: pass@1 {plain['pass@1/addition:1']:.4f}  pass@2 " in line
    assert "(6 held-out prompts, 2 replies each)" in line


def test_top_k_reaches_the_sampler(source) -> None:
    greedy = scored(source, "--tasks", "addition:1", "--top-k", "1")
    assert greedy == reference(source, 1)
    assert greedy != reference(source, None)  # the control: another draw, other numbers


def test_a_spec_mixing_kinds_scores_each_as_alone(source) -> None:
    both = scored(source, "--tasks", "next_line:4,addition:1")
    alone = scored(source, "--tasks", "next_line:4")
    assert both == alone | reference(source, None)
    assert {"acc/next_line", "acc_norm/next_line"} <= set(both)


@pytest.mark.parametrize(
    "flags, line",
    [
        (("--task", "addition:1"), "--task was replaced by --tasks: octlm eval RUN --tasks "
         "addition:1"),
        (("--task-prompts", "8"), "--task-prompts was replaced by --eval-prompts: octlm eval RUN "
         "--eval-prompts 8"),
        (("--tasks", "addition:1", "--pass-k", "0"), "--pass-k 0 must be"),
        (("--tasks", "addition:1", "--top-k", "0"), "--top-k 0 must be"),
        (("--tasks", "addition:40"), "from 1 to 15"),
    ],
)  # fmt: skip
def test_old_spellings_and_bad_settings_are_one_line(source, flags, line) -> None:
    proc = octlm("eval", str(source), *flags, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and line in proc.stderr


def test_the_sampling_defaults_are_octlm_rls() -> None:
    """`octlm eval`'s flags default to the RL settings' field defaults, read by name."""
    args = build_parser().parse_args(["eval", "RUN", "--tasks", "count"])
    defaults = {name: f.default for name, f in FIELDS.items()}
    names = ("eval_prompts", "pass_k", "max_new_tokens", "temperature", "top_k", "seed")
    assert {n: getattr(args, n) for n in names} == {n: defaults[n] for n in names}
    assert all(rl_default(n) == defaults[n] for n in names)
