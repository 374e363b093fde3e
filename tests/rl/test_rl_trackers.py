"""`octlm rl --log-to tensorboard,wandb` (W&B offline: no key, no network) on a real run,
stopped and resumed: the trackers get the RL records as they get training's, read back with
their own readers. TensorBoard holds exactly the log's numbers (every step's reward, share
cut, reply length; every held-out pass@1 and pass@k), W&B each session's and the RL settings
as its config, and `octlm log export` of the run writes the same scalars again."""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.runlog.reader import read_log
from tests.e2e.helpers import octlm
from tests.rl.helpers import chat_source
from tests.trackers_read import (
    as_float32,
    expected_scalars,
    log_numbers,
    tb_scalars,
    tb_texts,
    wandb_config,
    wandb_history,
    wandb_numbers,
    wandb_run_ids,
)

pytestmark = pytest.mark.slow
pytest.importorskip("tensorboard")
pytest.importorskip("wandb")

STOP = 2
RL = ("--task", "addition:1", "--steps", "4", "--prompts", "2", "--samples", "3")
RL += ("--max-new-tokens", "6", "--eval-every", "2", "--eval-prompts", "4", "--pass-k", "2")
RL += ("--ckpt-every", "2", "--no-progress", "--log-to", "tensorboard,wandb")


@pytest.fixture(scope="module")
def source(tiny_tokenizer, tmp_path_factory) -> Path:
    return chat_source(tiny_tokenizer, tmp_path_factory)


def test_rl_records_reach_the_trackers_and_log_export(source, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "wandb").mkdir()
    run = tmp_path / "rl"
    first = octlm("rl", str(source), *RL, "--out", str(run), "--stop-at", str(STOP))
    first_log = read_log(run)
    second = octlm("rl", str(source), *RL, "--out", str(run), "--resume")
    assert "warning" not in first.stderr + second.stderr  # no tracker switched itself off

    log = read_log(run)
    steps = [r for r in log if r["type"] == "step"]
    vals = [r for r in log if r["type"] == "val"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and [v["step"] for v in vals] == [2, 4]
    shown = tb_scalars(run / "tensorboard")
    assert shown == expected_scalars(log)  # every number of the log, once, at its step
    for key in ("reward", "cut", "reply_len"):
        assert shown[f"train/{key}"] == [(r["step"], as_float32(r[key])) for r in steps]
    for key in ("pass@1", "pass@2"):
        assert shown[f"val/{key}"] == [(v["step"], as_float32(v[key])) for v in vals]
    assert '"task": "addition:1"' in tb_texts(run / "tensorboard", "header")[0][1]

    # One folder per session, named to the second: two short sessions may share a second, so
    # the sessions are told apart by the steps they sent.
    folders = list((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    run_id = (run / "wandb_id").read_text().strip()
    assert len(folders) == 2 and all(wandb_run_ids(f) == {run_id} for f in folders)
    folders.sort(key=lambda f: wandb_numbers(wandb_history(f))[0][0])
    first_rows, second_rows = (wandb_numbers(wandb_history(f)) for f in folders)
    assert first_rows == log_numbers(first_log)
    # The resume sends the kept records of its step again (RunLog.truncate_after), then the new.
    assert second_rows == log_numbers([r for r in log if r.get("step", -1) >= STOP])
    assert {"val/pass@1", "val/pass@2", "train/reward"} <= {k for _, r in second_rows for k in r}
    config = wandb_config(folders[0])
    assert (config["task"], config["samples"], config["prompts"]) == ("addition:1", 3, 2)

    export = tmp_path / "export"
    assert "wrote" in octlm("log", "export", str(run), "--tensorboard", str(export)).stdout
    assert tb_scalars(export) == shown
