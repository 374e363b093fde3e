"""`octlm train --order epoch` resumes exactly: stopped inside an epoch, stopped right before a
step that straddles an epoch boundary, and stopped on 2 DDP processes and resumed on 1, each
run ends on the straight run's weights bit for bit. Controls: the random order ends elsewhere,
and a resume that changes the order is refused in one line with the folder untouched.

Real `python -m octlm train` subprocesses (torchrun with gloo for DDP) on the golden run's small
prepared dataset: the micro model, context 64 (275 blocks), 64 blocks per step (32 x accum 2),
so step 4 (samples 256..319) straddles the end of epoch 0.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from octlm.data.order import Sampler
from octlm.data.shards import ShardDataset
from octlm.data.windows import StreamWindows
from octlm.generation.trained import load_model
from octlm.runlog.reader import read_log
from octlm.tools.analyze import underflow_for_run, underflow_report
from tests.e2e.helpers import end_hash, octlm, steps_of
from tests.shared import shared

pytestmark = pytest.mark.slow

DATA = Path(__file__).parents[1] / "golden" / "v1-micro" / "data"  # read, never written
STEPS, CONTEXT, GLOBAL_BATCH = 8, 64, 64
STRADDLING = 4  # the step whose samples run from epoch 0 into epoch 1


def args(out: Path, *extra: str, accum: int = 2) -> list[str]:
    return [
        "train", "--model", "micro", "--data", str(DATA), "--out", str(out),
        "--steps", str(STEPS), "--warmup", "2", "--lr", "3e-3", "--context", str(CONTEXT),
        "--micro-batch", str(GLOBAL_BATCH // 2), "--accum", str(accum), "--val-every", "4",
        "--val-batches", "1", "--ckpt-every", "3", "--dtype", "fp32", "--no-progress",
        "--order", "epoch", *extra,
    ]  # fmt: skip


def folder_digest(out: Path) -> str:
    """Every file's name and bytes but the lock's (each trainer writes its pid there)."""
    h = hashlib.sha256()
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name != ".lock"):
        h.update(str(path.relative_to(out)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    def build(root: Path) -> None:
        octlm(*args(root / "straight"))

    return shared(tmp_path_factory, "epoch-straight", build) / "straight"


def test_the_straight_run_logs_its_epochs_and_straddles_one(straight) -> None:
    n_blocks = len(ShardDataset.open(DATA).train) // (CONTEXT + 1)
    epochs = [r["epoch"] for r in read_log(straight) if r["type"] == "step"]
    assert epochs == [s * GLOBAL_BATCH // n_blocks for s in range(STEPS)]
    first, last = STRADDLING * GLOBAL_BATCH, (STRADDLING + 1) * GLOBAL_BATCH - 1
    assert first // n_blocks == 0 and last // n_blocks == 1  # the chosen step does straddle


@pytest.mark.parametrize("k", [2, STRADDLING])  # inside epoch 0; right before the straddling step
def test_split_equals_straight(straight, tmp_path, k) -> None:
    out = tmp_path / "split"
    assert f"stopped at step {k}" in octlm(*args(out, "--stop-at", str(k))).stderr
    assert "resumed from" in octlm(*args(out, "--resume")).stderr
    assert end_hash(out) == end_hash(straight)
    assert steps_of(out) == steps_of(straight)  # every loss and grad norm, bit for bit


def test_control_the_random_order_ends_elsewhere(straight, tmp_path) -> None:
    out = tmp_path / "random"
    octlm(*[a if a != "epoch" else "random" for a in args(out)])
    assert end_hash(out) != end_hash(straight)
    assert all("epoch" not in r for r in read_log(out) if r["type"] == "step")


def test_ddp_two_processes_stopped_then_one_process_resumed(straight, tmp_path) -> None:
    """2 ranks x accum 1, stopped after the straddling step, resumed by 1 process (accum 2
    from the checkpoint): the same blocks per step, and the same bits, since each rank's one
    micro-batch gradient is summed as the single process sums its two (a + b either way)."""
    out = tmp_path / "ddp"
    octlm(*args(out, "--nproc", "2", "--stop-at", str(STRADDLING + 1), accum=1))
    proc = octlm(*args(out, "--resume", accum=1))
    assert "to keep the global batch" in proc.stderr
    assert end_hash(out) == end_hash(straight)
    assert steps_of(out) == steps_of(straight)


def test_a_resume_that_changes_the_order_is_refused_in_one_line(straight, tmp_path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(straight, out)
    before = folder_digest(out)
    random = [a if a != "epoch" else "random" for a in args(out, "--resume")]
    for extra, says in [
        ((), "--order 'epoch' -> 'random'"),  # named as typed
        (("--allow-config-change",), "data order is epoch, this run's random"),
    ]:
        proc = octlm(*random, *extra, check=False)
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert proc.stderr.startswith("octlm: error: ") and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert says in proc.stderr
        assert folder_digest(out) == before


def test_analyze_draws_the_micro_batch_of_the_runs_own_order(straight) -> None:
    report = underflow_for_run(straight, step=STRADDLING)
    model, _ = load_model(straight)
    train = ShardDataset.open(DATA).train
    losses = {}
    for order in ("epoch", "random"):
        stride = CONTEXT + 1 if order == "epoch" else 1  # aligned blocks, or every offset
        sampler = Sampler(
            StreamWindows(train, CONTEXT, stride, ""),
            seed=1337,
            context=CONTEXT,
            micro_batch=32,
            accum=2,
            order=order,
        )  # the run's (default) seed
        x, y = sampler.batch(STRADDLING, 0)
        losses[order] = underflow_report(model, x, y, accum=2, dtype="fp32", device="cpu").loss
    assert report.loss == losses["epoch"] != losses["random"]
