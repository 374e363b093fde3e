"""The launcher's pure parts (octlm/trainer/launch.py) and the stop signals' handling
(guards.StopFlag)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from octlm.errors import OctlmError
from octlm.trainer.distributed import DistInfo, peer_failure
from octlm.trainer.forkstart import PRELOAD, START_ENV, start_method
from octlm.trainer.guards import REPEAT_WINDOW, StopFlag
from octlm.trainer.launch import (
    AGENT_SIGNALS,
    NOTES_ENV,
    Launch,
    failure_exit_code,
    stopped_by_scheduler,
    stopped_code,
    worker_argv,
)
from tests.cli_in_process import main


def test_worker_argv_drops_the_launch_flags_in_both_forms() -> None:
    argv = ["train", "--nproc", "2", "--nnodes=2", "--node-rank", "1", "--steps", "3"]
    argv += ["--rdzv-endpoint", "h:1", "--rdzv-id=j", "--max-restarts", "4", "--requeue-exit-code"]
    argv += ["3"]
    assert worker_argv(argv) == ["train", "--steps", "3", "--requeue-exit-code", "3"]


def test_one_node_is_standalone_and_several_meet_at_the_endpoint() -> None:
    alone = Launch(nproc=2).torchrun_args()
    assert alone[0] == "--standalone" and "--nproc-per-node=2" in alone
    assert f"--signals-to-handle={AGENT_SIGNALS}" in alone and "SIGUSR1" in AGENT_SIGNALS
    node0 = Launch(nproc=1, nnodes=2, rdzv_endpoint="n01:29500", max_restarts=3).torchrun_args()
    node1 = Launch(nproc=1, nnodes=2, node_rank=1, rdzv_endpoint="n01:29500").torchrun_args()
    assert "--rdzv-endpoint=n01:29500" in node0 and "--rdzv-backend=c10d" in node0
    assert "--rdzv-conf=is_host=1" in node0 and "--rdzv-conf=is_host=0" in node1
    assert "--max-restarts=3" in node0 and "--nnodes=2" in node1
    assert not Launch().needed and Launch(max_restarts=1).needed and Launch(nproc=2).needed


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"nproc": 0}, "--nproc 0 starts nothing"),
        ({"nnodes": 0}, "--nnodes 0 starts nothing"),
        ({"nnodes": 2}, "needs a meeting point"),
        ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "is not one of the 2 nodes"),
        ({"nnodes": 2, "rdzv_endpoint": "h"}, "is not HOST:PORT"),
        ({"max_restarts": -1}, "is negative"),
    ],
)
def test_bad_launches_are_one_line_errors(kw, words) -> None:
    with pytest.raises(OctlmError, match=words):
        Launch(**kw)


def test_the_cli_refuses_a_bad_launch_in_one_line(tmp_path, capsys) -> None:
    """The CLI's own entry in this process (refused before any launch; `python -m octlm` itself
    is run by the slow tests)."""
    assert main(["train", "--out", str(tmp_path / "r"), "--nnodes", "2"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "octlm: error: --nnodes 2 needs a meeting point; pass --rdzv-endpoint HOST:PORT (the "
        "same on every node, HOST node 0's address)"
    ]
    assert not (tmp_path / "r").exists()


def test_the_first_failure_named_is_not_the_agents_own_sigterm(tmp_path, capsys) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    # Within one second, rank 1 aborted and the agent then stopped rank 0 with SIGTERM.
    missing = str(tmp_path / "no-error-file")
    term = ProcessFailure(local_rank=0, pid=10, exitcode=-signal.SIGTERM, error_file=missing)
    abort = ProcessFailure(local_rank=1, pid=11, exitcode=-signal.SIGABRT, error_file=missing)
    term.timestamp = abort.timestamp = 1_000
    exc = ChildFailedError("octlm", {0: term, 1: abort})
    assert failure_exit_code(exc, Launch(nproc=2)) == 128 + signal.SIGABRT
    assert "rank 1 (pid 11) was killed by SIGABRT" in capsys.readouterr().err
    term.timestamp = 999  # a SIGTERM that came first is the cause (a scheduler's, say)
    assert failure_exit_code(exc, Launch(nproc=2)) == 128 + signal.SIGTERM


@pytest.mark.slow
@pytest.mark.parametrize("command, code", [("playground", 0), ("hash", 1)])
def test_a_torchrun_worker_exits_with_the_commands_code(tmp_path, command, code) -> None:
    # A worker skips the interpreter's finalisation (octlm/__main__.py): its code, its output
    # and its files are those of a normal exit.
    args = ["-o", str(tmp_path / "p.html")] if command == "playground" else [str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "octlm", command, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "WORLD_SIZE": "2"},
    )
    assert proc.returncode == code, proc.stderr
    if code:
        assert proc.stderr.startswith("octlm: error:") and proc.stderr.count("\n") == 1
    else:
        assert (tmp_path / "p.html").stat().st_size > 0


def test_a_scheduler_stop_is_read_from_the_log(tmp_path) -> None:
    def log(*records: dict) -> None:
        (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    assert not stopped_by_scheduler(tmp_path)  # no log yet
    head = {"type": "header", "log_schema": 2}
    for reason, requeue in [("SIGUSR1", True), ("SIGTERM", True), ("SIGINT", False)]:
        log(head, {"type": "event", "event": "stop", "step": 4, "reason": reason})
        assert stopped_by_scheduler(tmp_path) is requeue
    log(head, {"type": "event", "event": "stop", "step": 4, "reason": "stop_at 4"})
    assert not stopped_by_scheduler(tmp_path)
    log(head, {"type": "end", "step": 6, "weights_sha256": "x"})
    assert not stopped_by_scheduler(tmp_path)


def test_a_signal_delivered_twice_at_once_is_one_request() -> None:
    """A scheduler signals every process and the elastic agent passes its own copy on: the
    second copy must not turn a clean stop into an exit without a checkpoint."""
    with StopFlag(hard_exit=False) as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested == "SIGUSR1" and stop.signum == signal.SIGUSR1
        time.sleep(REPEAT_WINDOW + 0.1)
        with pytest.raises(KeyboardInterrupt):  # a later one means: stop now
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_a_worker_leaves_a_note_before_its_error_line(tmp_path, monkeypatch, capsys) -> None:
    """The launcher adds no line of its own once a worker has said why (its agent may then lose
    the meeting point, when another node's launcher ends on the same error)."""
    monkeypatch.setenv(NOTES_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    (tmp_path / "run").mkdir()
    assert main(["hash", str(tmp_path / "run")]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("octlm: error: ")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("error-")] == ["error-1"]


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 4000ms",
            "no answer from another process in 4 s",
        ),
        (
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Application timeout caused pair "
            "closure)",
            "no answer from another process in 4 s",
        ),  # a rank woken after its deadline
        (
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer",
            "another process is gone",
        ),
    ],
)
def test_gloo_failures_caused_by_a_peer_are_one_line(text, words) -> None:
    lost = peer_failure(RuntimeError(text), DistInfo(rank=1, world=2), 3, 4.0)
    assert lost is not None and lost.message.startswith("rank 1, after step 3: " + words)
    assert peer_failure(RuntimeError("shape mismatch"), DistInfo(rank=1, world=2), 3, 4.0) is None


def test_a_signalled_launcher_waits_for_the_stop_record_another_node_writes(tmp_path) -> None:
    """Rank 0, on another node, writes the stop record after its checkpoint: a launcher whose
    own worker ended first must still exit with the requeue code, not 128 + signal."""
    head = {"type": "header", "log_schema": 2}
    stop = {"type": "event", "event": "stop", "step": 3, "reason": "SIGUSR1"}
    (tmp_path / "log.jsonl").write_text(json.dumps(head) + "\n")

    def rank0_writes_later() -> None:
        time.sleep(0.5)
        with open(tmp_path / "log.jsonl", "a") as f:
            f.write(json.dumps(stop) + "\n")

    writer = threading.Thread(target=rank0_writes_later)
    writer.start()
    assert stopped_code(tmp_path, 3) is None  # without the wait: too early
    assert stopped_code(tmp_path, 3, wait_s=30.0) == 3
    writer.join()
    assert stopped_code(tmp_path, None, wait_s=30.0) is None  # no requeue code asked for
    (tmp_path / "log.jsonl").write_text(json.dumps(head) + "\n")
    t0 = time.monotonic()
    assert stopped_code(tmp_path, 3, wait_s=0.3) is None  # no stop: gives up at the bound
    person = {**stop, "reason": "SIGINT"}  # a person's stop is there at once: no waiting
    (tmp_path / "log.jsonl").write_text(json.dumps(head) + "\n" + json.dumps(person) + "\n")
    assert stopped_code(tmp_path, 3, wait_s=30.0) is None
    assert time.monotonic() - t0 < 5


def test_a_bad_worker_start_is_one_line(monkeypatch) -> None:
    monkeypatch.setenv(START_ENV, "spawn")
    with pytest.raises(OctlmError, match="OCTLM_WORKER_START='spawn' is not a way"):
        start_method()
    for method in ("exec", "fresh-forkserver"):
        monkeypatch.setenv(START_ENV, method)
        assert start_method() == method


@pytest.mark.slow
def test_the_forkserver_preload_starts_no_thread_and_no_device() -> None:
    # Forking copies one thread: the forkserver's imports (in the launcher's environment, where
    # `launch` set OMP_NUM_THREADS=1) must leave it the only one, and CUDA uninitialised.
    code = "import os, sys\nfor m in sys.argv[1:]: __import__(m)\nimport torch\n"
    code += "print(len(os.listdir('/proc/self/task')), torch.cuda.is_initialized())"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, *PRELOAD], env=env, capture_output=True, text=True
    )
    assert proc.stdout.split() == ["1", "False"], proc.stderr
