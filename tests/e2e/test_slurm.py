"""scripts/slurm/train.sbatch, run by bash on this machine as Slurm would run it on two nodes.

Slurm itself is not here, so `srun` and `scontrol` are stand-ins (tests/e2e/fake_slurm/): srun
starts the script's command once per "node" with SLURM_NODEID set, scontrol names every node
127.0.0.1 and records requeues. Everything else is real: the script's rendezvous logic, two
octlm launchers meeting at node 0, their workers, and the requeue on a pre-emption signal.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import dist_args, end_hash

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm" / "train.sbatch"
FAKE = Path(__file__).resolve().parent / "fake_slurm"


def train_flags(data: Path, out: Path) -> list[str]:
    return dist_args(data, out, "--accum", "1")[1:]  # the script adds `train`


def slurm_env(tmp: Path) -> dict[str, str]:
    wrapper = tmp / "octlm"  # the OCTLM the script runs: this interpreter's octlm
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m octlm "$@"\n')
    wrapper.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {
        **os.environ,
        "PATH": f"{FAKE}{os.pathsep}{os.environ['PATH']}",
        "OCTLM": str(wrapper),
        "OCTLM_CACHE": "/nonexistent-octlm-cache",
        "NPROC": "1",
        "MASTER_PORT": str(port),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node[01-02]",
        "SLURM_NNODES": "2",
        "FAKE_SLURM_DIR": str(tmp),
    }


def sbatch(tmp: Path, data: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(SCRIPT), *train_flags(data, out)],
        env=slurm_env(tmp),
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def reference(two_process_run) -> str:
    """The same global batch on one node: two workers under one launcher."""
    return end_hash(two_process_run)


def test_the_script_runs_two_nodes_and_requeues_on_the_signal(
    tiny_dataset, reference, tmp_path
) -> None:
    out = tmp_path / "run"
    job = sbatch(tmp_path, tiny_dataset, out)
    deadline = time.monotonic() + 120
    while '"step": 2,' not in _log(out):
        assert job.poll() is None and time.monotonic() < deadline, "no step 2"
        time.sleep(0.05)
    # Slurm's --signal=USR1@120 signals the tasks of the job step: the two launchers.
    for pid in (tmp_path / "tasks").read_text().split():
        os.kill(int(pid), signal.SIGUSR1)
    _, err = job.communicate(timeout=180)
    assert job.returncode == 0, err
    assert "requeueing job 4242" in err
    assert (tmp_path / "requeued").read_text() == "requeue 4242\n"
    assert '"reason": "SIGUSR1"' in _log(out).splitlines()[-1]

    # The requeued job: the same script and arguments, resuming to the one-node run's bits.
    again = sbatch(tmp_path, tiny_dataset, out)
    _, err = again.communicate(timeout=180)
    assert again.returncode == 0, err
    assert "resumed from" in err
    assert end_hash(out) == reference
    assert (tmp_path / "requeued").read_text() == "requeue 4242\n"  # not requeued again


def _log(out: Path) -> str:
    path = out / "log.jsonl"
    return path.read_text() if path.is_file() else ""
