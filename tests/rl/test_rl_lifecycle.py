"""One run lifecycle (octlm/trainer/lifecycle.py) for both kinds of run: the folders each refuses,
in the same words, leaving them as they were; and what training's lifecycle had that RL's lacked,
now RL's too: the one line naming a failed peer, with the checkpoint intact."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from octlm.trainer import checkpoint as ckpt
from octlm.trainer.forkstart import worker_pids
from octlm.trainer.lifecycle import RL, TRAINING, refuse_folder
from tests.cli_in_process import main as cli_main
from tests.e2e.helpers import octlm, stop_a_worker_and_read
from tests.rl.helpers import RL as RL_FLAGS
from tests.rl.helpers import chat_source

TRAIN = ("--model", "micro", "--context", "32", "--steps", "2", "--warmup", "0", "--no-progress")


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def folders(root: Path, dataset: Path) -> dict[str, tuple[Path, str]]:
    """Each kind of folder no run may write into, and the words that refuse it."""
    merged = root / "merged"
    merged.mkdir()
    (merged / ckpt.MERGE_RECORD).write_text("{}\n")
    exported = root / "exported"
    exported.mkdir()
    (exported / "config.json").write_text("{}\n")
    a_file = root / "a_file"
    a_file.write_text("x")
    return {
        "merge": (merged, "holds merged weights (octlm merge)"),
        "export": (exported, "holds an exported model (octlm export)"),
        "dataset": (dataset, "holds a prepared dataset (octlm prepare)"),
        "file": (a_file, "is a file"),
    }


@pytest.mark.parametrize("kind", ["merge", "export", "dataset", "file"])
def test_both_kinds_refuse_another_commands_output_in_the_same_words(
    kind, tiny_dataset, tmp_path, capsys
) -> None:
    # A copy: a refused trainer holds its lock file in the folder for a moment, which the
    # tests that copy the shared dataset would otherwise meet.
    dataset = tmp_path / "dataset"
    shutil.copytree(tiny_dataset, dataset)
    out, words = folders(tmp_path, dataset)[kind]
    before = digest(out) if out.is_dir() else out.read_bytes()
    for command in (
        ("train", *TRAIN, "--data", str(dataset), "--out", str(out)),
        ("rl", "no-source", "--task", "count", "--out", str(out)),
    ):
        code = cli_main(list(command))  # in this process: the refusal comes before any work
        err = capsys.readouterr().err
        assert code == 1 and words in err and len(err.strip().splitlines()) == 1, err
        assert (digest(out) if out.is_dir() else out.read_bytes()) == before


def test_refuse_folder_lets_each_kind_into_its_own_folder_only(tmp_path) -> None:
    """Control: a new folder, and each kind's own (with --resume), pass."""
    refuse_folder(tmp_path / "new", TRAINING, resume=False)
    rl_run = tmp_path / "rl"
    rl_run.mkdir()
    (rl_run / ckpt.RL_RECORD).write_text('{"kind": "rl"}\n')
    (rl_run / "log.jsonl").write_text("")
    refuse_folder(rl_run, RL, resume=True)
    with pytest.raises(Exception, match="holds an RL run \\(octlm rl\\), not a run"):
        refuse_folder(rl_run, TRAINING, resume=True)
    with pytest.raises(Exception, match="already holds an RL run"):
        refuse_folder(rl_run, RL, resume=False)
    train_run = tmp_path / "train"
    train_run.mkdir()
    (train_run / "log.jsonl").write_text("")
    refuse_folder(train_run, TRAINING, resume=True)
    with pytest.raises(Exception, match="holds a run \\(octlm train\\), not an RL run"):
        refuse_folder(train_run, RL, resume=True)


@pytest.fixture(scope="module")
def source(tiny_tokenizer, tmp_path_factory) -> Path:
    return chat_source(tiny_tokenizer, tmp_path_factory)


def wait_for_step(run: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before the step came"
        log = run / "log.jsonl"
        if log.is_file() and f'"type": "step", "step": {step},' in log.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"no step {step} within {timeout} s")


@pytest.mark.slow
def test_a_stopped_rl_peer_ends_the_run_in_one_line_and_the_checkpoint_survives(
    source, tmp_path
) -> None:
    """SIGSTOP one of 2 RL workers after step 3: the other's next gather waits --dist-timeout
    seconds, then the run ends with training's one line naming the rank and step."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "octlm", "rl", str(source), *RL_FLAGS, "--out", str(out)]
    argv += ["--steps", "200", "--nproc", "2", "--dist-timeout", "4"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    wait_for_step(out, 3, proc)  # step 2's checkpoint is written before step 3 begins
    code, err = stop_a_worker_and_read(proc, worker_pids(proc.pid)[-1])
    assert code != 0
    lines = [ln for ln in err.splitlines() if ln.startswith("octlm: error:")]
    assert lines and "no answer from another process in 4 s" in lines[0], err[-2000:]
    assert lines[0].startswith("octlm: error: rank 0, after step ") and "Traceback" not in err
    entry = ckpt.read_latest(out)[-1]
    ckpt.load_checkpoint(out / ckpt.CKPT_DIR / entry["file"], entry["checksum"])  # intact


BAD_STEP = 3


def poison(monkeypatch) -> None:
    """Make RL step BAD_STEP's gradient norm NaN on every machine: the real rollouts, forward and
    backward run, then the clip reports NaN (a high lr would diverge at a step that depends on
    the CPU's rounding). Keyed by the step, so a resumed process poisons the same one."""
    from octlm.rl import loop

    real = loop.policy_update

    def poisoned(model, optimizer, reducer, groups, **kw):
        if kw["step"] + 1 == BAD_STEP:
            clip = reducer.clip
            reducer.clip = lambda limit: (clip(limit), float("nan"))[1]
            try:
                return real(model, optimizer, reducer, groups, **kw)
            finally:
                reducer.clip = clip
        return real(model, optimizer, reducer, groups, **kw)

    monkeypatch.setattr(loop, "policy_update", poisoned)


@pytest.fixture
def settings(source, tmp_path) -> Path:
    toml = tmp_path / "rl.toml"
    toml.write_text(octlm("rl", str(source), *RL_FLAGS, "--print-config").stdout)
    return toml


@pytest.mark.slow
def test_skip_nonfinite_skips_the_poisoned_rl_step_and_resumes_exactly(
    settings, tmp_path, monkeypatch
) -> None:
    import octlm as api
    from octlm.errors import OctlmError
    from octlm.runlog.reader import read_log
    from tests.e2e.helpers import end_hash

    poison(monkeypatch)
    with pytest.raises(OctlmError, match=f"non-finite loss or gradient norm at step {BAD_STEP} "):
        api.train_rl(settings, out=str(tmp_path / "stops"))
    assert ckpt.read_latest(tmp_path / "stops")[-1]["step"] == 2  # the last good one
    straight = api.train_rl(settings, out=str(tmp_path / "skip"), skip_nonfinite=True)
    records = read_log(tmp_path / "skip")
    skipped = [(r["step"], r["skipped_steps"]) for r in records if r.get("skipped")]
    assert skipped == [(BAD_STEP, 1)] and records[-1]["type"] == "end"
    split = tmp_path / "split"
    api.train_rl(settings, out=str(split), skip_nonfinite=True, stop_at=BAD_STEP)
    resumed = api.train_rl(settings, out=str(split), skip_nonfinite=True, resume=True)
    assert resumed.weights_sha256 == straight.weights_sha256 == end_hash(split)
    assert [r["skipped_steps"] for r in read_log(split) if r.get("skipped")] == [1]


@pytest.mark.slow
def test_rl_logs_weights_hashes_and_profiles_its_window(settings, tmp_path) -> None:
    import octlm as api
    from octlm.hashing import weights_sha256
    from octlm.runlog.reader import read_log

    out = tmp_path / "watched"
    api.train_rl(settings, out=str(out), hash_every=1, profile_steps="2:3", ckpt_every=1,
                 keep_last=10)  # fmt: skip
    hashes = {r["step"]: r["weights_sha256"] for r in read_log(out) if r["type"] == "hash"}
    assert sorted(hashes) == [1, 2, 3]  # the last step's is the end record's
    for entry in ckpt.read_latest(out):
        if entry["step"] in hashes:
            _, tensors = ckpt.load_checkpoint(
                out / ckpt.CKPT_DIR / entry["file"], entry["checksum"]
            )
            assert weights_sha256(ckpt.model_weights(tensors)) == hashes[entry["step"]]
    assert (out / "profile" / "trace.json").is_file()
    # Control: by default, a hash at each held-out score (every 2 steps), no profile.
    plain = tmp_path / "plain"
    api.train_rl(settings, out=str(plain))
    assert [r["step"] for r in read_log(plain) if r["type"] == "hash"] == [2]
    assert not (plain / "profile").exists()
