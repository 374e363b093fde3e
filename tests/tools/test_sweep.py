"""Sweep planning and summaries, the sweep file, and a killed sweep's re-run over logs a kill cut
short (runs launched by a stand-in for `subrun.train`); a real sweep runs in
tests/e2e/test_sweep.py."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from octlm.config.files import load_toml
from octlm.config.train import ConfigError, TrainConfig
from octlm.errors import OctlmError, QuotedError
from octlm.runlog.writer import RunLog
from octlm.tools import subrun
from octlm.tools.sweep import (
    Sweep,
    final_val_loss,
    finished,
    gpu_slots,
    mark_noise,
    planned,
    visible_gpus,
)
from octlm.tools.sweep_plan import base_from, parse_assignments, parse_set, plan
from tests.tools.helpers import CUT_LINE, GARBAGE_LINE, append_line, insert_line, write_log


def test_grid_values_take_the_field_types() -> None:
    assert parse_assignments("lr=3e-4,1.5e-3") == {"lr": [3e-4, 1.5e-3]}
    assert parse_assignments("warmup=0,20") == {"warmup": [0, 20]}
    assert parse_assignments("fused=true,false") == {"fused": [True, False]}
    assert parse_set("accum=8,steps=50") == {"accum": 8, "steps": 50}


@pytest.mark.parametrize("bad", ["lr", "lr=", "bogus=1", "warmup=1.5", "out=x", "seed=1,2"])
def test_bad_grids_are_errors(bad: str) -> None:
    with pytest.raises(OctlmError):
        parse_assignments(bad)


def test_plan_is_product_times_repeats_with_seeds() -> None:
    base = TrainConfig(model="tiny", context=32, steps=10, warmup=2, seed=100)
    specs = plan(base, {"lr": [1e-3, 2e-3], "warmup": [0, 2]}, [], repeats=3)
    assert len(specs) == 12
    assert {s.seed for s in specs} == {100, 101, 102}
    assert len({s.name for s in specs}) == 12
    assert specs[0].name == "lr=0.001,warmup=0-r0"
    with pytest.raises(OctlmError):  # each setting is validated before anything runs
        plan(base, {"warmup": [50]}, [], repeats=1)


def test_explicit_sets_change_keys_together() -> None:
    base = TrainConfig(model="tiny", context=32, steps=400, warmup=40)
    sets = [{"accum": 8, "steps": 50, "warmup": 5}, {"accum": 1, "steps": 400, "warmup": 40}]
    specs = plan(base, {}, sets, repeats=1)
    assert [dict(s.setting) for s in specs] == sets


def test_noise_marks() -> None:
    rows = [
        {"setting": "a", "repeats": 3, "mean": 5.00, "spread": 0.10},
        {"setting": "b", "repeats": 3, "mean": 5.08, "spread": 0.05},  # gap 0.08 < 0.10
        {"setting": "c", "repeats": 3, "mean": 5.30, "spread": 0.05},  # gap 0.30 > 0.10
        {"setting": "d", "repeats": 1, "mean": 5.20, "spread": 0.0},
        {"setting": "e", "repeats": 0, "mean": None, "spread": None},
    ]
    mark_noise(rows)
    marks = {r["setting"]: r["vs_best"] for r in rows}
    assert marks["a"] == "best"
    assert marks["b"] == "+0.080 within noise"
    assert marks["c"] == "+0.300 beyond noise"
    assert "noise unknown" in marks["d"] and marks["e"] == "failed"


def test_finished_and_the_final_loss_read_cut_and_garbled_logs(tmp_path: Path) -> None:
    done = write_log(tmp_path / "done")
    append_line(done, CUT_LINE, newline=False)
    garbled = write_log(tmp_path / "garbled")
    insert_line(garbled, 2, GARBAGE_LINE)
    killed = write_log(tmp_path / "killed", steps=4, end=False)
    append_line(killed, CUT_LINE, newline=False)
    assert finished(done) and finished(garbled)
    assert not finished(killed) and not finished(tmp_path / "never-started")
    assert final_val_loss(done) == final_val_loss(garbled) == 5.5 - 6 / 10
    assert final_val_loss(killed) == 5.5 - 4 / 10


def fake_trainer(calls: list, fail: str | None = None):
    """Stands in for `subrun.train`: records the launch, then resumes the run as the trainer
    would (drop the records the checkpoint at step 2 is past, a cut line with them)."""

    def train(config: Path, out: Path, *flags: str, env=None) -> str | None:
        calls.append((out.name, flags))
        if fail:
            return fail
        RunLog(out).truncate_after(2)
        write_log(out, first=3 if (out / "log.jsonl").exists() else 1)
        return None

    return train


def test_a_killed_sweep_rerun_skips_finished_runs_and_resumes_the_cut_one(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    base = TrainConfig(model="tiny", context=32, steps=6, warmup=2, data=str(tmp_path / "data"))
    specs = plan(base, {"lr": [1e-3, 3e-3]}, [], repeats=1)
    sweep = Sweep(tmp_path / "sw", base, specs, jobs=1)
    write_log(sweep.run_dir(specs[0]))  # finished before the kill
    killed = write_log(sweep.run_dir(specs[1]), steps=4, end=False)
    append_line(killed, CUT_LINE, newline=False)  # the kill cut its last line
    calls: list = []
    monkeypatch.setattr(subrun, "train", fake_trainer(calls))
    sweep.run()
    assert calls == [("lr=0.003-r0", ("--seed", "1337", "--resume", "--lr", "0.003"))]
    err = capsys.readouterr().err
    assert "1 of 2 runs already finished: skipped" in err and "[2/2] lr=0.003-r0" in err
    assert finished(killed) and final_val_loss(killed) == 5.5 - 6 / 10
    rows = sweep.summarise()
    assert [(r["setting"], r["repeats"], r["failed"]) for r in rows] == [
        ("lr=0.001", 1, 0),
        ("lr=0.003", 1, 0),
    ]
    written = load_toml(sweep.config_path)  # what every run reads: no per-launch key
    assert written["data"] == str((tmp_path / "data").resolve()) and written["lr"] == base.lr
    assert not set(written) & set(subrun.PER_LAUNCH_KEYS)


def test_a_failed_run_is_recorded_with_its_last_error_line(tmp_path: Path, monkeypatch) -> None:
    base = TrainConfig(model="tiny", context=32, steps=6, warmup=2, data=str(tmp_path / "data"))
    sweep = Sweep(tmp_path / "sw", base, plan(base, {}, [], repeats=1), jobs=1)
    monkeypatch.setattr(subrun, "train", fake_trainer([], fail="octlm: error: boom; fix it"))
    sweep.run()
    assert sweep.failures == {"base-r0": "octlm: error: boom; fix it"}
    assert sweep.summarise()[0]["failed"] == 1


def test_a_bad_sweep_file_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text('model = "tiny"\ncontext = 32\n[sweep]\ngrid = {lr = [1e-3]}\nrepeats = 2\n')
    base, table = base_from(str(path), {"steps": 30, "lr": None})
    assert (base.model, base.steps) == ("tiny", 30) and table["repeats"] == 2
    for text, expected in [
        ("model = \n", "is not valid TOML"),
        ("bogus = 1\n", "unknown key(s) bogus"),
        ("[sweep]\nrepeat = 2\n", "unknown [sweep] key(s)"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(expected)):
            base_from(str(path), {})


def test_each_parallel_job_gets_its_own_gpu(tmp_path: Path, monkeypatch) -> None:
    """With GPUs visible, --jobs N runs N at a time, each on a GPU no other running job has
    (CUDA_VISIBLE_DEVICES set to it); with more jobs than GPUs the sweep refuses in one line."""
    assert gpu_slots([], 4) == [] and gpu_slots(["0", "1"], 1) == []
    assert gpu_slots(["3", "5", "7"], 2) == ["3", "5"]
    with pytest.raises(OctlmError, match="--jobs 3 with 2 visible GPU"):
        gpu_slots(["0", "1"], 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert visible_gpus() == ["4", "6"]
    base = TrainConfig(model="tiny", context=32, steps=6, warmup=2, data=str(tmp_path / "data"))
    specs = plan(base, {"lr": [1e-3, 2e-3, 3e-3, 4e-3]}, [], repeats=1)
    sweep = Sweep(tmp_path / "sw", base, specs, jobs=2)
    lock, running, seen = threading.Lock(), set(), []

    def train(config: Path, out: Path, *flags: str, env=None) -> str | None:
        gpu = env["CUDA_VISIBLE_DEVICES"]
        with lock:
            assert gpu not in running  # no two running jobs share a GPU
            running.add(gpu)
            seen.append(gpu)
        time.sleep(0.05)
        write_log(out)
        with lock:
            running.discard(gpu)
        return None

    monkeypatch.setattr(subrun, "train", train)
    sweep.run()
    assert len(seen) == 4 and set(seen) <= {"4", "6"}


def test_a_sweep_whose_runs_failed_finishes_the_others_and_exits_non_zero(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """The failed run is reported in the summary and in one last error line; the runs after it
    still run; the command's status is 1, not 0."""
    from octlm.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subrun, "write_config", lambda cfg, path: path)  # no corpus to prepare
    failure = "octlm: error: the loss is not finite at step 1; lower --lr"

    def train(config: Path, out: Path, *flags: str, env=None) -> str | None:
        if "0.003" in flags:
            return failure
        write_log(out)
        return None

    monkeypatch.setattr(subrun, "train", train)
    tiny = ["--model", "tiny", "--context", "32", "--steps", "6", "--warmup", "2"]
    code = main(["sweep", *tiny, "--grid", "lr=1e-3,3e-3,5e-3", "--out", "sw"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "| lr=0.003 | 0 |" in out and f"- lr=0.003-r0: {failure}" in out
    assert err.splitlines()[-1] == (
        f"octlm: error: 1 of 3 runs failed: lr=0.003-r0; see their errors in "
        f"{Path('sw') / 'summary.md'}; run the same command again to retry them (finished runs "
        "are skipped)"
    )
    assert finished(tmp_path / "sw" / "runs" / "lr=0.005-r0")


def test_a_refused_grid_or_set_value_is_named_in_the_option_that_gave_it() -> None:
    """A value the sweep's runs would refuse is named as typed: `--grid lr=-1.0`, changed in
    --grid, not "in --config", though a settings file may set the same key (issue 62, kind 7)."""
    base = TrainConfig(lr=3e-3)
    for option, grids, sets in (("--grid", ["lr=-1,1e-3"], []), ("--set", [], ["lr=-1"])):
        with pytest.raises(QuotedError) as caught:
            planned(base, {}, grids, sets, None)
        assert caught.value.problem.startswith(f"{option} lr=-1.0 must be a finite number > 0")
        assert caught.value.fix == f"change lr in {option}"
    assert len(planned(base, {}, ["lr=1e-3,2e-3"], [], None)) == 2  # control: good values plan
