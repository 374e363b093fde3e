"""Run folders users already have keep resuming exactly.

The v1 run folder is what octlm wrote at commit V1 (checkpoint format v1, log schema 1,
unfused AdamW): `tests/golden/make_golden.py` of that commit writes a micro run stopped at step
6 and, in `expected.json`, the log records and weights hash of the same run done straight.

Bits are the CPU's (PyTorch promises them per platform), so the exactness test runs V1's own
code here, on this machine, and today's code must resume V1's stopped run onto V1's straight
run. The committed folder `tests/golden/v1-micro` holds what does not depend on the machine:
the dataset's bytes, the checkpoint's layout and metadata keys, its checksum, the log's shape;
the first test checks V1's code still writes that, so the committed copy stays a true sample.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from octlm.hashing import file_checksum
from octlm.trainer.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from octlm.trainer.stwriter import write_safetensors
from tests import octlm_process
from tests.old_code import extract, run_old
from tests.shared import shared

GOLDEN = Path(__file__).parent / "golden" / "v1-micro"
V1 = "3f9a314a0ab118935827bc88913a6433ee271a0e"
"""The commit that wrote tests/golden/v1-micro (the code before the redesign)."""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def v1_here(tmp_path_factory) -> Path:
    """A v1 golden folder written on this machine by V1's code (read-only: copy it)."""

    def build(root: Path) -> None:
        tree = extract(V1, root / "code")
        run_old(tree, "tests/golden/make_golden.py", str(root / "golden"))

    return shared(tmp_path_factory, "v1-golden", build) / "golden"


def _train(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    """Today's `python -m octlm train` on the folder (forked as the suite's commands are,
    tests/octlm_process.py)."""
    args = ["train", "--config", str(folder / "config.toml"), "--data", str(folder / "data"),
            "--out", str(folder / "run"), *extra]  # fmt: skip
    return octlm_process.run(args, {**os.environ, "OMP_NUM_THREADS": "1"})


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + size])


def _shape(records: list[dict]) -> list[tuple]:
    """What of a log does not depend on the CPU: record types, steps, keys, token counts."""
    return [(r["type"], r.get("step"), sorted(r), r.get("tokens")) for r in records]


def _log(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "run" / "log.jsonl").read_text().splitlines()]


def test_v1_code_still_writes_what_the_committed_folder_holds(v1_here) -> None:
    """Machine-independent parts only: a recorded float or hash would be another CPU's."""
    for name in sorted(p.name for p in (GOLDEN / "data").iterdir()):
        if name == "manifest.json":  # names the temporary source file: compare the rest
            old, new = (json.loads((d / "data" / name).read_text()) for d in (GOLDEN, v1_here))
            old.pop("source"), new.pop("source")
            assert old == new
        else:
            assert (GOLDEN / "data" / name).read_bytes() == (v1_here / "data" / name).read_bytes()
    assert (GOLDEN / "config.toml").read_text() == (v1_here / "config.toml").read_text()
    ckpt = Path("run/checkpoints/step_000006.safetensors")
    committed, fresh = _header(GOLDEN / ckpt), _header(v1_here / ckpt)
    old_meta, new_meta = (json.loads(h.pop("__metadata__")["octlm"]) for h in (committed, fresh))
    assert {k: (v["dtype"], v["shape"]) for k, v in committed.items()} == {
        k: (v["dtype"], v["shape"]) for k, v in fresh.items()
    }
    assert sorted(old_meta) == sorted(new_meta)
    assert old_meta["format_version"] == new_meta["format_version"] == 1
    assert _shape(_log(GOLDEN)[1:]) == _shape(_log(v1_here)[1:])
    expected = [json.loads((d / "expected.json").read_text()) for d in (GOLDEN, v1_here)]
    assert [_shape(e["records"]) for e in expected][0] == _shape(expected[1]["records"])


def test_committed_checkpoint_checksum_and_bytes_are_reproduced_by_todays_writer(tmp_path):
    """The committed v1 checkpoint verifies against latest.json, and today's writer, given its
    tensors and metadata, writes it again byte for byte (the format did not drift)."""
    path, checksum = find_checkpoint(GOLDEN / "run")
    assert file_checksum(path) == checksum
    read, tensors = load_checkpoint(path, checksum)
    meta = read.as_written()
    again = tmp_path / path.name
    assert write_safetensors(again, tensors, _header(path)["__metadata__"]) == checksum
    assert again.read_bytes() == path.read_bytes()
    assert meta["train_state"]["step"] == 6


def test_v1_run_folder_resumes_to_the_v1_straight_runs_bits(v1_here, tmp_path) -> None:
    """V1's stopped run, resumed by today's code, ends on V1's straight run (both computed on
    this machine): every loss and grad norm before and after the stop, and the weights."""
    folder = tmp_path / "golden"
    shutil.copytree(v1_here, folder)
    expected = json.loads((folder / "expected.json").read_text())
    proc = _train(folder, "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"resumed from {folder / 'run'}" in proc.stderr
    records = _log(folder)
    keep = set().union(*(r.keys() for r in expected["records"]))
    got = [{k: v for k, v in r.items() if k in keep} for r in records[1:] if r["type"] != "event"]
    assert got == expected["records"]
    assert records[-1]["type"] == "end"
    assert records[-1]["weights_sha256"] == expected["weights_sha256"]


def test_control_v1_run_resumed_with_wiped_moments_ends_elsewhere(v1_here, tmp_path) -> None:
    """The check above can fail: the same resume from V1's checkpoint with AdamW's moments
    zeroed matches V1's straight run up to the first step after the stop (its loss is computed
    before the update that reads the moments) and differs at every step after that."""
    folder = tmp_path / "golden"
    shutil.copytree(v1_here, folder)
    expected = json.loads((folder / "expected.json").read_text())
    path, checksum = find_checkpoint(folder / "run")
    read, tensors = load_checkpoint(path, checksum)
    meta = read.as_written()
    wiped = {k: (torch.zeros_like(v) if k.startswith("optim.") else v) for k, v in tensors.items()}
    header = {k: v for k, v in meta.items() if k not in ("format", "format_version")}
    save_checkpoint(folder / "run", 6, header, wiped)
    proc = _train(folder, "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _log(folder)[-1]["weights_sha256"] != expected["weights_sha256"]
    losses = [r["loss"] for r in _log(folder) if r["type"] == "step"]
    ref = [r["loss"] for r in expected["records"] if r["type"] == "step"]
    assert losses[:7] == ref[:7] and all(a != b for a, b in zip(losses[7:], ref[7:], strict=True))


def test_control_golden_folder_with_another_lr_is_refused(tmp_path) -> None:
    """A changed setting is refused in one line and the folder is left as it was."""
    folder = tmp_path / "golden"
    shutil.copytree(GOLDEN, folder)
    before = (folder / "run" / "log.jsonl").read_bytes()
    proc = _train(folder, "--resume", "--lr", "1e-3")
    assert proc.returncode == 1
    assert proc.stderr.startswith("octlm: error: ") and "Traceback" not in proc.stderr
    assert "lr" in proc.stderr
    assert (folder / "run" / "log.jsonl").read_bytes() == before


def test_golden_folder_keeps_the_unfused_adamw_it_started_with(tmp_path) -> None:
    """Fused AdamW became the default after this folder was written: left unset, the resume
    takes the checkpoint's `fused = false` (the exact resume above); asking for the fused
    kernel is a trajectory change, refused in one line."""
    folder = tmp_path / "golden"
    shutil.copytree(GOLDEN, folder)
    before = (folder / "run" / "log.jsonl").read_bytes()
    proc = _train(folder, "--resume", "--fused")
    assert proc.returncode == 1
    assert proc.stderr.startswith("octlm: error: ") and "Traceback" not in proc.stderr
    assert "fused" in proc.stderr and proc.stderr.count("\n") == 1
    assert (folder / "run" / "log.jsonl").read_bytes() == before
