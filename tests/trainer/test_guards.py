"""The run folder's guards: a start refused before it wrote anything leaves an existing folder
as it found it (no `.lock` left behind) and removes a folder it made; a lock held by another
trainer refuses a second one in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.config.train import TrainConfig
from octlm.errors import OctlmError
from octlm.trainer.guards import RunLock
from octlm.trainer.loop import train


def config(data: Path, out: Path, tasks: Path) -> TrainConfig:
    sizes = {"context": 32, "micro_batch": 2, "accum": 1, "steps": 2, "warmup": 0}
    return TrainConfig(
        model="micro", data=str(data), out=str(out), eval_tasks=str(tasks), progress=False,
        **sizes,
    )  # fmt: skip


def files(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")
    }


def test_a_refused_start_leaves_an_existing_folder_as_it_was(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("the user's own file\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "a", "choices": "not a list", "answer": 0}\n')
    before = files(tmp_path)
    with pytest.raises(OctlmError):
        train(config(tiny_dataset, out, bad))
    assert files(tmp_path) == before  # no .lock, no log, nothing else


def test_a_refused_start_removes_the_folder_it_made(tiny_dataset, tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(OctlmError):
        train(config(tiny_dataset, tmp_path / "new", bad))
    assert not (tmp_path / "new").exists()


def test_a_held_lock_refuses_a_second_trainer_and_is_kept(tmp_path) -> None:
    (tmp_path / ".lock").write_text("")
    with RunLock(tmp_path) as held:
        assert not held.created
        with pytest.raises(OctlmError, match="is in use by another trainer"), RunLock(tmp_path):
            pass
        held.discard()  # not made by it: kept
    assert (tmp_path / ".lock").exists()
