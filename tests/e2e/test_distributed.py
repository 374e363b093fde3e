"""Multi-process training with real torchrun on this CPU (gloo, 2 processes).

DDP and FSDP2 runs split and resumed must equal their straight runs bit for bit, and so must
runs that change the process count (2 ranks x accumulation 1 against 1 process x accumulation
2, and resumes across world sizes): the tree reduction, the default, sums in one order on any
layout (tests/e2e/test_world_invariant.py has 4 processes, dropout, Muon and the controls).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from octlm.trainer import checkpoint as ckpt
from tests.e2e.helpers import DIST_FLAGS, end_hash, octlm, steps_of
from tests.e2e.helpers import DIST_STEPS as STEPS
from tests.e2e.helpers import dist_args as args
from tests.shared import shared

pytestmark = pytest.mark.slow


def weights(run: Path) -> dict[str, torch.Tensor]:
    path, sha = ckpt.find_checkpoint(run)
    return ckpt.split_tensors(ckpt.load_checkpoint(path, sha)[1], "model.")


def max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


@pytest.fixture(scope="module")
def single(straight_run) -> Path:
    """One process, accumulation 2: the same global batch as 2 ranks x accumulation 1."""
    return straight_run(*DIST_FLAGS, "--accum", "2")


@pytest.fixture(scope="module")
def ddp(two_process_run) -> Path:
    header = (two_process_run / "log.jsonl").read_text().splitlines()[0]
    assert '"world": 2' in header
    return two_process_run


@pytest.fixture(scope="module")
def ddp_stopped(tiny_dataset, tmp_path_factory) -> Path:
    """The 2-process DDP run (accumulation 1) stopped at step 3, trained once per session for
    the tests that resume it. Read-only: resume a copy (`copy_of`)."""

    def build(folder: Path) -> None:
        octlm(*args(tiny_dataset, folder / "run", "--accum", "1", "--nproc", "2", "--stop-at", "3"))

    return shared(tmp_path_factory, "ddp_stopped_3", build) / "run"


def copy_of(run: Path, out: Path) -> Path:
    shutil.copytree(run, out)
    return out


def test_ddp_split_equals_straight(tiny_dataset, ddp, ddp_stopped, tmp_path) -> None:
    out = copy_of(ddp_stopped, tmp_path / "split")
    octlm(*args(tiny_dataset, out, "--accum", "1", "--nproc", "2", "--resume"))
    assert end_hash(out) == end_hash(ddp)
    assert steps_of(out) == steps_of(ddp)


@pytest.mark.parametrize("start", ["exec", "fresh-forkserver"])
def test_forked_workers_end_on_the_bits_of_fresh_ones(
    tiny_dataset, ddp, tmp_path, monkeypatch, start
) -> None:
    """`ddp`'s workers were forked from the launcher's forkserver, itself a fork of the
    launcher (octlm/trainer/forkstart.py, forkserver_here.py); the same command with
    OCTLM_WORKER_START=exec starts each as a fresh `python -u -m octlm`, and with
    `fresh-forkserver` forks them from a forkserver that is a fresh interpreter: the same
    weights, step records and log header (its time aside), the same last line."""
    out = tmp_path / start
    monkeypatch.setenv("OCTLM_WORKER_START", start)
    proc = octlm(*args(tiny_dataset, out, "--accum", "1", "--nproc", "2"))
    assert end_hash(out) == end_hash(ddp)
    assert steps_of(out) == steps_of(ddp)
    headers = [json.loads((run / "log.jsonl").read_text().splitlines()[0]) for run in (out, ddp)]
    for header, run in zip(headers, (out, ddp), strict=True):
        del header["time"]
        assert header["argv"][0].endswith("octlm/__main__.py")
        assert json.dumps(header).count(str(run)) == 2  # --out in argv and in the config
    assert json.dumps(headers[0]).replace(str(out), str(ddp)) == json.dumps(headers[1])
    assert f"\ndone: {STEPS} steps, weights_sha256 {end_hash(ddp)}\n" in proc.stderr


def test_ddp_two_ranks_match_one_process_with_accumulation(single, ddp) -> None:
    assert max_weight_diff(single, ddp) == 0.0
    assert end_hash(single) == end_hash(ddp)
    assert steps_of(single) == steps_of(ddp)


@pytest.mark.parametrize("direction", ["2to1", "1to2"])
def test_resume_across_world_sizes(tiny_dataset, single, ddp_stopped, tmp_path, direction):
    out = tmp_path / direction
    first, second = (("--nproc", "2"), ()) if direction == "2to1" else ((), ("--nproc", "2"))
    if first:  # 2 processes, accumulation 1, stopped at step 3: the session's `ddp_stopped`
        copy_of(ddp_stopped, out)
    else:
        octlm(*args(tiny_dataset, out, "--accum", "2", "--stop-at", "3"))
    # The same command with the other process count; --accum is adjusted from the checkpoint.
    proc = octlm(*args(tiny_dataset, out, "--accum", "1" if first else "2", *second, "--resume"))
    assert "to keep the global batch" in proc.stderr
    assert "bitwise" in proc.stderr
    assert steps_of(out) == steps_of(single)
    assert end_hash(out) == end_hash(single)


def test_a_damaged_newest_checkpoint_of_another_world_resumes_with_the_older_ones_settings(
    tiny_dataset, single, tmp_path
) -> None:
    """The checkpoint a resume reads decides its settings too. Step 2 is written by 1 process
    (accumulation 2), step 4 by 2 after an elastic resume. With step 4's tensors damaged (its
    header intact), a resume on 2 processes must fall back to step 2 and take step 2's world
    (accumulation 2 over 2 ranks: 1 each), ending where the same resume from step 2 ends: on
    `single`'s bits, as any resume across world sizes does (test_resume_across_world_sizes;
    that resume, once run here as the reference, is the straight run it equals)."""
    out = tmp_path / "run"
    octlm(*args(tiny_dataset, out, "--accum", "2", "--stop-at", "2"))
    two = ("--accum", "2", "--nproc", "2", "--resume")
    octlm(*args(tiny_dataset, out, *two, "--stop-at", "4"))
    newest = ckpt.read_latest(out)[-1]
    written = ckpt.load_checkpoint(out / ckpt.CKPT_DIR / newest["file"], newest["checksum"])[0]
    assert newest["step"] == 4 and "world" in written.as_written()
    path = out / ckpt.CKPT_DIR / newest["file"]
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # the last tensor's bytes: the header still reads
    path.write_bytes(bytes(data))
    proc = octlm(*args(tiny_dataset, out, *two))
    assert "falling back" in proc.stderr and "resumed from" in proc.stderr
    assert "step_000002" in proc.stderr and "written by 1 process(es), resumed by 2" in proc.stderr
    assert [s for s, _, _ in steps_of(out)] == list(range(1, STEPS + 1))
    assert steps_of(out) == steps_of(single)
    assert end_hash(out) == end_hash(single)


FSDP = ("--accum", "1", "--nproc", "2", "--parallel", "fsdp")


@pytest.fixture(scope="module")
def fsdp_straight(straight_run) -> Path:
    return straight_run(*DIST_FLAGS, *FSDP)


@pytest.fixture(scope="module")
def fsdp_stopped(tiny_dataset, tmp_path_factory) -> Path:
    """The FSDP run stopped at step 3 (checkpoints at steps 2 and 3), trained once per session
    for the tests that resume it. Read-only: resume a copy (`copy_of`)."""

    def build(folder: Path) -> None:
        octlm(*args(tiny_dataset, folder / "run", *FSDP, "--stop-at", "3"))

    return shared(tmp_path_factory, "fsdp_stopped_3", build) / "run"


def test_fsdp2_split_equals_straight_and_reshards(
    tiny_dataset, single, fsdp_straight, fsdp_stopped, tmp_path
) -> None:
    split = copy_of(fsdp_stopped, tmp_path / "fsdp-split")
    octlm(*args(tiny_dataset, split, *FSDP, "--resume"))
    assert end_hash(split) == end_hash(fsdp_straight)
    assert steps_of(split) == steps_of(fsdp_straight)
    # Sharded on 2 ranks, checkpointed whole, resumed (resharded) by one process.
    one = copy_of(fsdp_stopped, tmp_path / "fsdp-to-1")
    octlm(*args(tiny_dataset, one, "--accum", "1", "--parallel", "fsdp", "--resume"))
    assert end_hash(one) == end_hash(fsdp_straight)
    assert steps_of(one) == steps_of(fsdp_straight)
    assert end_hash(single) == end_hash(fsdp_straight)


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(data)


def test_fsdp_ranks_fall_back_together_and_fail_in_one_line(
    tiny_dataset, fsdp_straight, fsdp_stopped, tmp_path
) -> None:
    """Rank 0 alone reads the file and picks the checkpoint; a damaged newest one is skipped by
    every rank at once (the run still ends on the straight run's bits), and a folder with none
    intact ends every rank with one line, printed once."""
    out = copy_of(fsdp_stopped, tmp_path / "run")  # checkpoints at steps 2 and 3
    flip_a_byte(out / ckpt.CKPT_DIR / "step_000003.safetensors")
    proc = octlm(*args(tiny_dataset, out, *FSDP, "--resume"))
    assert "falling back to the previous checkpoint" in proc.stderr
    assert "resumed from" in proc.stderr and "step_000002" in proc.stderr
    assert end_hash(out) == end_hash(fsdp_straight)

    for entry in ckpt.read_latest(out):  # both kept checkpoints (steps 4 and 6) damaged
        flip_a_byte(out / ckpt.CKPT_DIR / entry["file"])
    proc = octlm(*args(tiny_dataset, out, *FSDP, "--resume"), check=False, timeout=120)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("octlm: error:")]
    assert errors == [
        f"octlm: error: none of the 2 checkpoints in {out / ckpt.CKPT_DIR} is intact; "
        "start a new run in another --out (or delete that folder)"
    ]


LOADER = r"""
import json, sys
from pathlib import Path
import torch
import torch.distributed as dist
from octlm.trainer import checkpoint as ckpt
from octlm.trainer.distributed import DistInfo
from octlm.trainer.resume import find_agreed

run, out = Path(sys.argv[1]), Path(sys.argv[2])
dist.init_process_group("gloo")
info = DistInfo(dist.get_rank(), dist.get_world_size(), dist.get_rank())
found = find_agreed(run, info, torch.device("cpu"), fsdp=True)
path, checksum = ckpt.find_checkpoint(run)
_, on_disk = ckpt.load_checkpoint(path, checksum)
(out / f"rank{info.rank}.json").write_text(json.dumps({
    "file": found.path.name,
    "meta_equal": found.info.as_written() == ckpt.load_checkpoint(path, None)[0].as_written(),
    "names_equal": sorted(found.tensors) == sorted(on_disk),
    "placeholders": sorted(k for k, v in found.tensors.items() if v.is_meta),
    "equal": sorted(k for k, v in found.tensors.items() if not v.is_meta
                    and v.dtype == on_disk[k].dtype and torch.equal(v, on_disk[k])),
}))
dist.destroy_process_group()
"""


def test_fsdp_other_ranks_get_placeholders_not_the_file(fsdp_straight, tmp_path) -> None:
    """Under FSDP rank 1 holds no weight or moment of the file, only shape-only placeholders
    (filled shard by shard from rank 0 by `load_full_state`), and exact copies of the rest."""
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    subprocess.run([*cmd, str(script), str(fsdp_straight), str(tmp_path)], check=True, timeout=120)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    path, _ = ckpt.find_checkpoint(fsdp_straight)
    _, on_disk = ckpt.load_checkpoint(path, None)
    sharded = sorted(
        k for k, v in on_disk.items() if k.startswith(("model.", "optim.")) and v.dim()
    )
    assert rank0["file"] == rank1["file"] == path.name
    assert rank0["meta_equal"] and rank1["meta_equal"]
    assert rank0["names_equal"] and rank1["names_equal"]
    assert rank0["placeholders"] == [] and rank0["equal"] == sorted(on_disk)
    assert rank1["placeholders"] == sharded and "model.tok_embeddings.weight" in sharded
    assert rank1["equal"] == sorted(set(on_disk) - set(sharded))
    assert any(k.startswith("rng1.") for k in rank1["equal"])  # every rank's generators
