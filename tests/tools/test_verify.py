"""`octlm verify-resume` in-process: its runs are launched through a stand-in for `subrun.train`
that writes logs and checkpoints, so the verdicts, the cleanup, damaged logs (read as far as they
are readable) and failed runs (one error line) are checked without starting a process. The real
command runs in tests/e2e/test_resume.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.config.train import TrainConfig
from octlm.errors import OctlmError
from octlm.runlog.reader import read_log
from octlm.runlog.writer import RunLog
from octlm.tools import subrun
from octlm.tools.verify import format_result, verify_resume, with_digests
from octlm.trainer.checkpoint import read_latest
from octlm.trainer.init_from import FIX_SOURCE
from tests.cli_in_process import main
from tests.tools.helpers import (
    CUT_LINE,
    GARBAGE_LINE,
    append_line,
    insert_line,
    write_checkpoint,
    write_log,
)

STEPS = 6


def fake_trainer(
    *,
    losses: dict[int, float] | None = None,
    moment: float = 1.0,
    damage: bool = False,
    finish: bool = True,
    fail: str | None = None,
):
    """Stands in for `subrun.train`: a straight run, a run stopped at K (its checkpoint at K)
    and its resume, which may log other `losses`, end with another AdamW `moment`, be `damage`d
    (a garbled line mid-log, a cut last line) or not `finish`."""

    def train(config: Path, out: Path, *flags: str, env=None) -> str | None:
        assert config.is_file() and "--resume" not in config.read_text()
        if fail:
            return fail
        if "--stop-at" in flags:
            k = int(flags[flags.index("--stop-at") + 1])
            write_log(out, steps=k, end=False)
            write_checkpoint(out, k)
            append_line(out, CUT_LINE, newline=False)  # as if killed while writing a record
            return None
        if "--resume" in flags:
            k = read_latest(out)[-1]["step"]
            RunLog(out).truncate_after(k)
            write_log(out, STEPS, first=k + 1, losses=losses, end=finish)
            write_checkpoint(out, STEPS, moment)
            if damage:
                insert_line(out, 2, GARBAGE_LINE)
                append_line(out, CUT_LINE, newline=False)
            return None
        write_log(out, STEPS)
        write_checkpoint(out, STEPS)
        return None

    return train


@pytest.fixture
def cfg(tmp_path: Path) -> TrainConfig:
    data = str(tmp_path / "data")
    return TrainConfig(model="micro", context=32, steps=STEPS, warmup=2, data=data)


def verify(cfg: TrainConfig, workdir: Path, monkeypatch, **fake) -> tuple[list, Path | None]:
    workdir.mkdir(exist_ok=True)
    monkeypatch.setattr(subrun, "train", fake_trainer(**fake))
    return verify_resume(cfg, [2, 4], workdir=workdir, echo=lambda _: None)


@pytest.mark.parametrize("damage", [False, True], ids=["intact", "damaged-logs"])
def test_runs_that_match_are_identical_and_cleaned_up(cfg, tmp_path, monkeypatch, damage) -> None:
    summaries, kept = verify(cfg, tmp_path / "work", monkeypatch, damage=damage)
    assert kept is None and list((tmp_path / "work").iterdir()) == []
    assert [(s.name, s.identical, s.verdict) for s in summaries] == [
        ("straight", True, "reference"),
        ("split@2", True, "identical"),
        ("split@4", True, "identical"),
    ]
    assert [s.steps_after_split for s in summaries] == [0, 4, 2]
    lines = format_result(summaries, kept)
    assert lines[-1] == "identical: every resumed run matches the straight run bit for bit"


def test_a_resumed_run_that_parts_says_where(cfg, tmp_path, monkeypatch) -> None:
    summaries, _ = verify(cfg, tmp_path / "work", monkeypatch, losses={5: 1.0})
    verdicts = [s.verdict for s in summaries[1:]]
    assert verdicts == [f"differs from step 5 (largest |loss diff| {4.5 - 1.0:.3e})"] * 2
    assert format_result(summaries, None)[-1] == "NOT identical: see the table"


def test_an_optimizer_state_that_differs_is_caught(cfg, tmp_path, monkeypatch) -> None:
    summaries, kept = verify(cfg, tmp_path / "work", monkeypatch, moment=2.0)
    assert summaries[1].verdict == "differs: final weights or optimizer state"
    assert not summaries[1].identical and kept is None


def test_kept_runs_are_named(cfg, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(subrun, "train", fake_trainer())
    summaries, kept = verify_resume(cfg, [3], keep=True, workdir=tmp_path, echo=lambda _: None)
    assert {p.name for p in kept.iterdir()} == {"config.toml", "straight", "split-3"}
    assert f"runs kept in {kept}" in format_result(summaries, kept)


@pytest.mark.parametrize(
    "fake, expected",
    [
        ({"finish": False}, "run split-2 did not finish; see its log.jsonl (use --keep)"),
        (
            {"fail": "octlm: error: boom; fix it"},
            "training run straight failed: octlm: error: boom; fix it; fix the settings and rerun",
        ),
    ],
    ids=["unfinished", "failed"],
)
def test_a_run_that_fails_or_stops_early_is_one_error(
    cfg, tmp_path, monkeypatch, fake, expected
) -> None:
    with pytest.raises(OctlmError) as info:
        verify(cfg, tmp_path / "work", monkeypatch, **fake)
    assert info.value.message == expected
    assert list((tmp_path / "work").iterdir()) == []  # nothing left behind


@pytest.mark.parametrize("splits", [[0], [STEPS], []])
def test_splits_outside_the_run_are_refused(cfg, splits) -> None:
    with pytest.raises(OctlmError, match="strictly between 0 and steps=6"):
        verify_resume(cfg, splits)


def test_the_cli_refuses_resume_and_stop_at_in_one_line(capsys) -> None:
    assert main(["verify-resume", "--split", "2", "--stop-at", "3"]) == 1
    assert capsys.readouterr().err == (
        "octlm: error: verify-resume chooses its own stops and resumes; "
        "drop --resume and --stop-at; use --split K\n"
    )


def test_a_model_flag_is_checked_against_the_init_from_source_before_any_run(
    tmp_path, capsys
) -> None:
    """Its runs read the preset from their config file, where it yields to the source: a
    `--model` flag is checked here, once (tests/e2e/test_init_from.py runs a real fine-tune)."""
    missing = tmp_path / "no-source"
    argv = ["verify-resume", "--split", "2", "--init-from", str(missing), "--context", "64"]
    argv += ["--model", "tiny"]
    assert main([*argv, "--workdir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == f"octlm: error: --init-from {missing} does not exist; {FIX_SOURCE}\n"
    assert list(tmp_path.iterdir()) == []  # no run was started


def test_a_split_that_parts_names_the_step_and_tensor(cfg, tmp_path, monkeypatch) -> None:
    """With per-tensor digests (on by default), the verdict names the first differing gradient
    and says whether the loss matched, as `octlm diff` does."""
    fake = fake_trainer()

    def train(config: Path, out: Path, *flags: str, env=None) -> str | None:
        done = read_latest(out)[-1]["step"] if "--resume" in flags else 0
        fake(config, out, *flags, env=env)
        log = RunLog(out)
        log.open()
        steps = [r["step"] for r in read_log(out) if r["type"] == "step" and r["step"] > done]
        for n in steps:
            grads = {"w1": "1" * 16, "w2": "2" * 16}
            if "--resume" in flags and n == 5:
                grads["w1"] = "f" * 16  # the resumed runs' step 5 computed another gradient
            log.tensor_digests(n, {"w1": "3" * 16, "w2": "4" * 16}, grads)
        log.close()
        return None

    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.setattr(subrun, "train", train)
    run_cfg = with_digests(cfg, tensors_given=False, every_given=False)
    assert (run_cfg.hash_tensors, run_cfg.hash_every) == (True, 1)
    summaries, _ = verify_resume(run_cfg, [2, 4], workdir=workdir, echo=lambda _: None)
    want = "differs: step 5: w1's gradient differs first; the loss matched"
    assert [s.verdict for s in summaries[1:]] == [want, want]
    # Set by the user (on or off, and an own interval): left as given.
    off = cfg.replace(hash_every=3)
    assert with_digests(off, tensors_given=True, every_given=True) == off
    assert with_digests(off, tensors_given=False, every_given=True).hash_every == 3
