"""Several "nodes" on this machine, and faults among them (gloo, CPU).

Two `octlm train --nnodes 2` launchers meeting at a c10d rendezvous on 127.0.0.1 stand in for
two machines; workers are killed (elastic restarts), signalled (pre-emption) and stopped
(hangs). Each run must end on the bits of the same run done straight on one node, or stop in
one line with its last checkpoint intact.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from octlm.trainer import checkpoint as ckpt
from octlm.trainer.forkstart import worker_pids
from tests import shim_server
from tests.e2e.helpers import DIST_FLAGS, dist_args, end_hash, steps_of, stop_a_worker_and_read
from tests.e2e.helpers import DIST_STEPS as STEPS

pytestmark = pytest.mark.slow

REQUEUE = 3
SLOW_SAVES = {"OCTLM_CHAOS_SAVE_PAUSE": "0.2"}
"""For the kill tests: each checkpoint write pauses 0.2 s twice (after the temporary file and after
the rename), so a step with its checkpoint takes at least 0.4 s. A kill that comes up to 0.35 s
after a step record then lands in the next step or its write (the interesting case), and the
resumed group has steps left for the second kill: with 6 unslowed tiny steps, a late first kill
once left the restarted group one step, and it had ended before the second kill (seen here)."""


def args(data: Path, out: Path, *extra: str) -> list[str]:
    return dist_args(data, out, "--accum", "1", *extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*argv: str, forked: bool = False, **env: str) -> subprocess.Popen:
    """`python -m octlm ARGV`; `forked`: started by tests/shim_server.py's client, forked from a
    server that has done the imports (for a launcher that is only waited for: a signal to the
    client, or a look for its children, would not reach the run)."""
    client = shim_server.client_path() if forked else None
    cmd = [client, *argv] if client else [sys.executable, "-m", "octlm", *argv]
    env = {**os.environ, "OCTLM_CACHE": "/nonexistent-octlm-cache", **env}
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def two_nodes(outs: tuple[Path, Path], data: Path, *extra: str) -> list[tuple[int, str]]:
    """Two launchers of one worker each, as two machines would start them."""
    node = ("--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}")
    procs = [
        start(*args(data, out, *node, "--node-rank", str(r), *extra), forked=True)
        for r, out in enumerate(outs)
    ]
    return [finish(p) for p in procs]


def wait_for_step(run: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the log holds a step record >= `step` (records are written after each step)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before the step came"
        log = run / "log.jsonl"
        if log.is_file() and any(f'"step": {s},' in log.read_text() for s in range(step, 99)):
            return
        time.sleep(0.05)
    raise AssertionError(f"no step {step} within {timeout} s")


def kill_twice(proc: subprocess.Popen, out: Path, rng: random.Random, octlm_launcher: bool) -> None:
    """SIGKILL a random worker of the group twice, each time somewhere in a step or a checkpoint
    write: after step 2 once a checkpoint is listed (else the restart starts fresh, which is
    not the case under test), then after the first step record the restarted group writes (the
    log is cut back on resume: an older record would not do). Start the run with SLOW_SAVES,
    so that steps are left for the second kill. `octlm_launcher`: `proc` is `octlm train
    --nproc`, whose workers are checked to come from a fork of it (octlm/trainer/
    forkserver_here.py: the suite's launchers are in the state it forks from)."""
    listed = out / "checkpoints" / "latest.json"
    for kills, step in enumerate((2, 1)):
        deadline = time.monotonic() + 120
        while not (_stepped_since_resume(out, step, kills) and listed.is_file()):
            assert proc.poll() is None, "the run ended before the step came"
            assert time.monotonic() < deadline, f"no step {step} after {kills} resume(s)"
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 0.3))
        workers = worker_pids(proc.pid)
        assert len(workers) == 2 and proc.poll() is None
        if octlm_launcher:  # forked from a forkserver that is itself a fork of the launcher
            assert {cmdline(parent_of(w)) for w in workers} == {cmdline(proc.pid)}
        os.kill(rng.choice(workers), signal.SIGKILL)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def survives_two_kills(
    proc: subprocess.Popen, out: Path, rng: random.Random, ref: Path, octlm_launcher: bool
) -> None:
    """`kill_twice`, then the run must finish, having resumed, on `ref`'s bits, every step once."""
    kill_twice(proc, out, rng, octlm_launcher)
    code, err = finish(proc)
    assert code == 0, err
    assert err.count("resumed from") >= 1
    assert end_hash(out) == end_hash(ref)
    assert [s for s, _, _ in steps_of(out)] == list(range(1, STEPS + 1))


def _stepped_since_resume(out: Path, step: int, resumes: int) -> bool:
    log = out / "log.jsonl"
    lines = log.read_text().splitlines() if log.is_file() else []
    resumed = [i for i, ln in enumerate(lines) if '"event": "resume"' in ln]
    if len(resumed) < resumes:
        return False
    since = lines[resumed[-1] + 1 :] if resumes else lines
    return any(
        f'"step": {s},' in ln and '"type": "step"' in ln for ln in since for s in range(step, 99)
    )


@pytest.fixture(scope="module")
def one_node(two_process_run) -> Path:
    """The reference: one launcher, two workers, straight through."""
    return two_process_run


def test_two_nodes_equal_one_node_and_resume_exactly(tiny_dataset, one_node, tmp_path) -> None:
    straight = tmp_path / "straight"
    for code, err in two_nodes((straight, straight), tiny_dataset):
        assert code == 0, err
    assert end_hash(straight) == end_hash(one_node)
    assert steps_of(straight) == steps_of(one_node)

    split = tmp_path / "split"
    for code, err in two_nodes((split, split), tiny_dataset, "--stop-at", "3"):
        assert code == 0, err
    for code, err in two_nodes((split, split), tiny_dataset, "--resume"):
        assert code == 0, err
    assert end_hash(split) == end_hash(one_node)


def test_a_rank_that_cannot_see_the_run_folder_stops_the_run(tiny_dataset, tmp_path) -> None:
    """Node 1 is given a folder of its own, as on a machine where --out is not shared."""
    results = two_nodes((tmp_path / "shared", tmp_path / "local"), tiny_dataset)
    assert all(code != 0 for code, _ in results)
    lines = [ln for _, err in results for ln in err.splitlines() if ln.startswith("octlm: error:")]
    assert len(lines) == 2, lines
    assert any("does not see the run folder" in ln and "rank " in ln for ln in lines)
    assert any("another rank does not see the run folder" in ln for ln in lines)
    assert not any("Traceback" in err for _, err in results)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_elastic_restarts_after_killed_workers_end_identical(
    tiny_dataset, one_node, straight_run, tmp_path, parallel
) -> None:
    """SIGKILL a random worker at a random moment, twice; torchrun's agent restarts the group,
    each restart resumes from the newest intact checkpoint, and the end is the straight run's
    (the same trajectory straight, checkpointed every 2 steps: intervals touch no bit)."""
    mode = ("--nproc", "2", "--parallel", parallel, "--ckpt-every", "1")
    if parallel == "ddp":
        reference = one_node
    else:
        reference = straight_run(*DIST_FLAGS, "--accum", "1", "--nproc", "2", "--parallel", "fsdp")
    out = tmp_path / "elastic"
    proc = start(*args(tiny_dataset, out, *mode, "--max-restarts", "3"), **SLOW_SAVES)
    survives_two_kills(proc, out, random.Random(18), reference, octlm_launcher=True)


def torchrun(*argv: str, share_store: bool, **extra: str) -> subprocess.Popen:
    """A plain `torchrun --standalone` of two workers, as a user would type it (no octlm
    launcher: nothing of octlm's is in the agent's environment)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    if not share_store:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env.update(OCTLM_CACHE="/nonexistent-octlm-cache", **extra)
    return subprocess.Popen([*cmd, *argv], stderr=subprocess.PIPE, text=True, env=env)


def test_plain_torchrun_restarts_on_the_shared_store_are_refused(tiny_dataset, tmp_path):
    """torchrun's agent shares its TCPStore with the workers unless told not to, and a restarted
    group can then hang in start-up (pytorch#135712): refused at start, in one line naming the
    fix, before the run folder exists."""
    out = tmp_path / "refused"
    proc = torchrun(
        "--max-restarts", "1", "-m", "octlm", *args(tiny_dataset, out), share_store=True
    )
    code, err = finish(proc)
    assert code != 0
    lines = [ln for ln in err.splitlines() if ln.startswith("octlm: error:")]
    assert lines and all(ln == lines[0] for ln in lines)  # each attempt's rank 0, the same line
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in lines[0] and "--max-restarts 1" in lines[0]
    assert not out.exists()


def test_plain_torchrun_restarts_after_killed_workers_end_identical(
    tiny_dataset, one_node, tmp_path
) -> None:
    """The same kills as above under a plain torchrun with the store not shared: each restarted
    group resumes (TORCHELASTIC_RESTART_COUNT > 0 turns --resume on) and ends on the bits."""
    out = tmp_path / "plain"
    argv = args(tiny_dataset, out, "--ckpt-every", "1")
    proc = torchrun("--max-restarts", "3", "-m", "octlm", *argv, share_store=False, **SLOW_SAVES)
    survives_two_kills(proc, out, random.Random(26), one_node, octlm_launcher=False)


def test_a_group_that_never_forms_ends_in_one_line_within_the_dist_timeout(tiny_dataset, tmp_path):
    """Rank 0 of two, started alone (its peer never comes): start-up is bounded by
    --dist-timeout too, and ends in one line without a traceback, leaving no folder behind."""
    out = tmp_path / "alone"
    world = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    t0 = time.monotonic()
    proc = start(
        *args(tiny_dataset, out, "--dist-timeout", "3"), **world, MASTER_PORT=str(free_port())
    )
    code, err = finish(proc, timeout=60)
    assert code == 1 and time.monotonic() - t0 < 30
    lines = [ln for ln in err.splitlines() if ln.startswith("octlm: error:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert "rank 0: the 2 processes did not meet at 127.0.0.1:" in lines[0]
    assert "--dist-timeout 3 s" in lines[0]
    assert not out.exists()


def test_preemption_of_one_worker_checkpoints_and_asks_for_requeue(
    tiny_dataset, one_node, tmp_path
) -> None:
    """SIGUSR1 (Slurm's --signal) to one worker only: every rank finishes the step, a checkpoint
    is written, the launcher exits the requeue code, and the requeued command ends exactly where
    the straight run does. (The signal to the launchers, which pass it on: test_slurm.py.)"""
    out = tmp_path / "run"
    requeue = ("--requeue-exit-code", str(REQUEUE))
    proc = start(*args(tiny_dataset, out, "--nproc", "2", "--resume", *requeue))
    wait_for_step(out, 2, proc)
    os.kill(worker_pids(proc.pid)[-1], signal.SIGUSR1)
    code, err = finish(proc)
    assert code == REQUEUE, err
    assert "SIGUSR1: finishing this step, then checkpointing" in err
    stop = [r for r in (out / "log.jsonl").read_text().splitlines() if '"event": "stop"' in r]
    assert stop and '"reason": "SIGUSR1"' in stop[-1]
    step = int(stop[-1].split('"step": ')[1].split(",")[0])
    assert step < STEPS and ckpt.read_latest(out)[-1]["step"] == step
    code, err = finish(
        start(*args(tiny_dataset, out, "--nproc", "2", "--resume", *requeue), forked=True)
    )
    assert code == 0, err
    assert end_hash(out) == end_hash(one_node)


def test_a_stopped_peer_ends_the_run_in_one_line_and_the_checkpoint_survives(
    tiny_dataset, one_node, tmp_path
) -> None:
    """SIGSTOP one worker: the others' next collective waits --dist-timeout seconds, then the
    run ends with one line naming the rank and step; the checkpoints are intact and resume."""
    out = tmp_path / "run"
    proc = start(*args(tiny_dataset, out, "--nproc", "2", "--dist-timeout", "4"))
    wait_for_step(out, 3, proc)
    code, err = stop_a_worker_and_read(proc, worker_pids(proc.pid)[-1])
    assert code != 0
    lines = [ln for ln in err.splitlines() if ln.startswith("octlm: error:")]
    # Rank 0 timed out; the woken rank may then say, in its own line, that its peer is gone.
    assert lines and "no answer from another process in 4 s" in lines[0]
    assert all(ln.startswith("octlm: error: rank ") for ln in lines)
    assert lines[0].startswith("octlm: error: rank 0, after step ") and "Traceback" not in err
    entry = ckpt.read_latest(out)[-1]
    ckpt.load_checkpoint(out / ckpt.CKPT_DIR / entry["file"], entry["checksum"])  # intact
    code, err = finish(start(*args(tiny_dataset, out, "--nproc", "2", "--resume"), forked=True))
    assert code == 0, err
    assert end_hash(out) == end_hash(one_node)
