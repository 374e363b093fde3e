"""`octlm rl` end to end: a chat fine-tune on a task's generated conversations, then RL runs in
new processes, stopped and resumed, on 2 processes and 1, compared bit for bit with the
straight run (weights, optimizer tensors, every step's rewards and rollout hash, every
held-out score), each with a control that must differ; the replies equal the uncached model's;
bad settings are one line each and leave the folder as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from octlm.generation.sampling import generate
from octlm.generation.trained import load_model, run_tokenizer
from octlm.rl.rollout import prompt_ids, reply_seed, sample_group
from octlm.rl.tasks import get_task
from octlm.runlog.reader import read_log
from octlm.tools.verify import rl_numbers
from tests.e2e.helpers import end_hash, octlm, optimizer_tensors
from tests.rl.helpers import RL, chat_source
from tests.shared import shared

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(tiny_tokenizer, tmp_path_factory) -> Path:
    return chat_source(tiny_tokenizer, tmp_path_factory)


def rl(source: Path, out: Path, *extra: str, check: bool = True):
    return octlm("rl", str(source), *RL, "--out", str(out), *extra, check=check)


@pytest.fixture(scope="module")
def straight(source, tmp_path_factory) -> Path:
    return shared(tmp_path_factory, "rl-straight", lambda root: rl(source, root / "run")) / "run"


def assert_same_rl_run(run: Path, ref: Path) -> None:
    assert end_hash(run) == end_hash(ref)
    assert rl_numbers(read_log(run)) == rl_numbers(read_log(ref))
    a, b = optimizer_tensors(run), optimizer_tensors(ref)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_the_log_shows_rewards_cut_replies_lengths_and_the_rollout_hash(straight) -> None:
    records = read_log(straight)
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert 0 <= r["reward"] <= 1 and 0 <= r["cut"] <= 1 and 0 <= r["correct"] <= 1
        assert 1 <= r["reply_len"] <= 6 and len(r["rollout_sha256"]) == 64
    assert len({r["rollout_sha256"] for r in steps}) == 4  # each step samples its own
    vals = [r for r in records if r["type"] == "val"]
    assert [r["step"] for r in vals] == [2, 4]
    assert all(0 <= r["pass@1"] <= r["pass@2"] <= 1 for r in vals)
    assert records[0]["kind"] == "rl"


def test_stopped_and_resumed_equals_straight_and_another_seed_differs(
    source, straight, tmp_path
) -> None:
    out = tmp_path / "split"
    stop = rl(source, out, "--stop-at", "1")
    assert "stopped at step 1" in stop.stderr
    assert "resumed from" in rl(source, out, "--resume").stderr
    assert_same_rl_run(out, straight)
    control = tmp_path / "control"
    rl(source, control, "--seed", "1")
    assert end_hash(control) != end_hash(straight)
    ref_steps = [r for r in read_log(straight) if r["type"] == "step"]
    got = [r for r in read_log(control) if r["type"] == "step"]
    pairs = zip(ref_steps, got, strict=True)
    assert all(a["rollout_sha256"] != b["rollout_sha256"] for a, b in pairs)


def test_on_policy_logs_a_zero_logprob_diff_and_resumes_exactly(source, straight, tmp_path):
    """--on-policy: the update's log-prob of every sampled token is the sampler's, bit for bit
    (logprob_diff 0.0 each step), and a stopped and resumed run equals the straight one. The
    control: the plain update (the default) logs a difference above 0."""
    out = tmp_path / "on"
    rl(source, out, "--on-policy")
    on = [r["logprob_diff"] for r in read_log(out) if r["type"] == "step"]
    assert len(on) == 4 and any(d is not None for d in on)
    assert all(d == 0.0 for d in on if d is not None)
    off = [r["logprob_diff"] for r in read_log(straight) if r["type"] == "step"]
    assert any(d is not None and d > 0 for d in off)
    split = tmp_path / "split"
    rl(source, split, "--on-policy", "--stop-at", "2")
    rl(source, split, "--on-policy", "--resume")
    assert_same_rl_run(split, out)


def test_two_processes_resumed_on_one_equal_the_straight_run(source, straight, tmp_path) -> None:
    out = tmp_path / "two"
    rl(source, out, "--nproc", "2", "--stop-at", "2")
    rl(source, out, "--resume")
    assert_same_rl_run(out, straight)


def test_verify_split_reports_identical(source, tmp_path) -> None:
    proc = octlm("rl", str(source), *RL, "--verify-split", "2", "--workdir", str(tmp_path))
    assert proc.stdout.strip().endswith("bit for bit")
    assert "split@2" in proc.stdout and "identical" in proc.stdout


def test_a_steps_replies_equal_the_uncached_models(source) -> None:
    model, info = load_model(source)
    tokenizer, task = run_tokenizer(info), get_task("addition:1")
    problem = task.problem(0, 3, 1)
    seeds = [reply_seed(0, 3, 1, j) for j in range(4)]
    group = sample_group(model, tokenizer, task, problem, index=1, seeds=seeds,
                         max_new_tokens=6, temperature=1.0, top_k=None)  # fmt: skip
    ids = prompt_ids(tokenizer, problem)
    alone = [
        generate(model, ids, 6, temperature=1.0, seed=s, stop_id=tokenizer.eos_id, cache=False)
        for s in seeds
    ]
    assert group.replies == alone
    assert len({tuple(r) for r in alone}) > 1  # control: the seeds sample different replies


def folder_digest(folder: Path) -> dict[str, str]:
    """Every file's digest but the lock's (which holds the pid of whoever opened the run)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--task", "nope"), "unknown task"),
        (("--samples", "0"), "--samples 0 must be an integer from 1"),
        (("--prompts", "0"), "--prompts 0 must be an integer from 1"),
        (("--max-new-tokens", "500"), "runs past the model's context of 64"),
        (("--nproc", "3"), "3 processes cannot share 4 prompts"),
        (("--temperature", "nan"), "--temperature nan must be a number in (0, 100]"),
    ],
)
def test_bad_settings_are_one_line_and_write_nothing(source, tmp_path, extra, message) -> None:
    out = tmp_path / "bad"
    proc = octlm("rl", str(source), *RL, "--out", str(out), *extra, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_a_run_without_the_chat_format_is_refused(tiny_dataset, tmp_path) -> None:
    base = tmp_path / "base"
    octlm("train", "--model", "micro", "--data", str(tiny_dataset), "--out", str(base),
          "--steps", "1", "--warmup", "0", "--context", "32", "--micro-batch", "2",
          "--val-every", "0", "--no-progress")  # fmt: skip
    proc = octlm("rl", str(base), *RL, "--out", str(tmp_path / "rl"), check=False)
    assert proc.returncode == 1 and "was not trained on a chat dataset" in proc.stderr
    assert not (tmp_path / "rl").exists()


def test_a_resume_with_other_settings_is_refused_and_changes_nothing(
    source, straight, tmp_path
) -> None:
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(straight, out)
    before = folder_digest(out)
    proc = rl(source, out, "--resume", "--lr", "1e-3", check=False)
    assert proc.returncode == 1 and "--lr 0.0003 -> 0.001" in proc.stderr  # named as typed
    assert folder_digest(out) == before
    train = octlm(
        "train", "--resume", "--out", str(out), "--model", "micro", "--context", "64", check=False
    )
    assert train.returncode == 1 and "RL run" in train.stderr
    assert folder_digest(out) == before
