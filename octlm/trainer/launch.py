"""`octlm train --nproc N [--nnodes M --node-rank R --rdzv-endpoint HOST:PORT] [--max-restarts K]`:
the same command again as N worker processes per node under torch's elastic agent (what
`torchrun` runs), in this process, so that its outcome is one line and an exit code.

- One node: `torchrun --standalone`. Several: one launcher per node, all naming the same
  `--rdzv-endpoint` (c10d rendezvous, hosted by node 0's launcher, so HOST is node 0), so any
  node may come up first and a restarted group meets again; global ranks are handed out by
  the rendezvous. A run's bits do not depend on which node gets which rank (each rank's data and
  generators follow its rank number), so two launchers of one process each end exactly where
  one launcher of two processes does (tests/e2e/test_multinode.py).
- `--max-restarts K`: the agent restarts the whole group when a worker dies; each restart
  resumes from the newest intact checkpoint (`restart_resumes`), so a killed run still ends on
  the straight run's bits.
- Signals: SIGINT, SIGTERM and SIGUSR1 (Slurm's `--signal`) reach the agent and are passed on
  to every worker, which finish the step, agree, checkpoint and exit (octlm/trainer/guards.py).
  With `--requeue-exit-code C`, a run stopped that way by SIGTERM or SIGUSR1 exits C, for a
  scheduler to requeue it (scripts/slurm/train.sbatch). Workers under this launcher exit 0
  when stopped (`LAUNCHED_ENV`): a non-zero worker would make the agent restart the group.
- Workers are forked from a forkserver that has imported torch and octlm once
  (octlm/trainer/forkstart.py), itself a fork of this launcher where that is what a fresh one
  would be (octlm/trainer/forkserver_here.py); OCTLM_WORKER_START=exec starts each as a fresh
  `python -u -m octlm`, as torchrun does. Same bits either way (tests/e2e/test_distributed.py).
- A worker's own error is its one line; a worker killed by a signal, or a failed rendezvous,
  gets one line here. Never the agent's traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octlm.config import checks
from octlm.errors import OctlmError

LAUNCHED_ENV = "OCTLM_LAUNCHER"
"""Set for workers started here: a signal stop exits 0 and this launcher picks the code."""
NOTES_ENV = "OCTLM_LAUNCH_NOTES"
"""A folder of this launcher's where a worker leaves a note before it prints its error line."""
REQUEUE_SIGNALS = ("SIGTERM", "SIGUSR1")
"""Stops a scheduler sends before it takes the nodes away; SIGINT is a person's, not requeued."""
STOP_RECORD_WAIT_S = 60.0
"""How long a signalled launcher waits for the log's stop record. Rank 0 writes it after its
checkpoint, so a launcher on another node can see its own workers end first: without the wait
it read the log too early and exited 128 + signal instead of the requeue code (seen once in
the Slurm test), and the job failed instead of requeueing."""
# The agent stops its workers on these and passes the signal on; torch's default list lacks
# SIGUSR1, whose default action would kill the agent and orphan its workers.
AGENT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# Flags this launcher consumes; the workers get the rest of the command line.
LAUNCH_FLAGS = ("--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id")
LAUNCH_FLAGS += ("--max-restarts",)


@dataclass(frozen=True)
class Launch:
    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    max_restarts: int = 0
    requeue_exit_code: int | None = None
    """Checked here only: the code `launch` (or a single process) exits with."""

    def __post_init__(self) -> None:
        for name in ("nproc", "nnodes"):
            if getattr(self, name) < 1:
                flag, value = "--" + name, getattr(self, name)
                raise OctlmError(f"{flag} {value} starts nothing", f"use {flag} 1 or more")
        checks.check_processes("--nproc", self.nproc)  # each its own process on this node
        if self.requeue_exit_code is not None:
            fix = "use a code from 1 to 255: an exit status is one byte, and 0 reads as success"
            checks.check("--requeue-exit-code", self.requeue_exit_code, checks.Int(1, 255), fix)
        if self.max_restarts < 0:
            raise OctlmError(f"--max-restarts {self.max_restarts} is negative", "use 0 or more")
        if not 0 <= self.node_rank < self.nnodes:
            raise OctlmError(
                f"--node-rank {self.node_rank} is not one of the {self.nnodes} nodes",
                f"use 0 to {self.nnodes - 1}",
            )
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise OctlmError(
                f"--nnodes {self.nnodes} needs a meeting point",
                "pass --rdzv-endpoint HOST:PORT (the same on every node, HOST node 0's address)",
            )
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit():
                raise OctlmError(
                    f"--rdzv-endpoint {self.rdzv_endpoint!r} is not HOST:PORT",
                    "name a host every node can reach and a free port, e.g. node01:29500",
                )

    @property
    def needed(self) -> bool:
        """Whether workers must be started: more than one process, or an elastic run."""
        return self.nproc * self.nnodes > 1 or self.max_restarts > 0

    def torchrun_args(self) -> list[str]:
        """torchrun's own flags for this launch."""
        args = [f"--nproc-per-node={self.nproc}", f"--max-restarts={self.max_restarts}"]
        args.append(f"--signals-to-handle={AGENT_SIGNALS}")
        if self.nnodes == 1 and self.rdzv_endpoint is None:
            return ["--standalone", *args]
        # c10d hands out the ranks itself; the node rank says which launcher hosts the meeting
        # point (node 0, whose address the endpoint names), instead of every launcher on that
        # host racing to open the port.
        return [
            f"--nnodes={self.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.rdzv_endpoint}",
            f"--rdzv-id={self.rdzv_id or 'octlm'}",
            f"--rdzv-conf=is_host={int(self.node_rank == 0)}",
            *args,
        ]


def worker_argv(argv: list[str]) -> list[str]:
    """`argv` without this launcher's flags (`--flag V` and `--flag=V` forms)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in LAUNCH_FLAGS:
            skip = True
            continue
        if arg.split("=", 1)[0] in LAUNCH_FLAGS and "=" in arg:
            continue
        out.append(arg)
    return out


def leave_note() -> None:
    """Tell this worker's launcher, if any, that it printed its own error line (so that the
    launcher adds none). Written before the line is printed: the agent may stop the worker the
    moment another node's launcher ends."""
    notes = os.environ.get(NOTES_ENV)
    if notes and os.path.isdir(notes):
        with contextlib.suppress(OSError):  # a note is a courtesy: the line is what matters
            Path(notes, f"error-{os.environ.get('RANK', '0')}").touch()


def restart_resumes() -> bool:
    """Whether this worker is a restart by the elastic agent: it must resume, whatever the
    first attempt's flags said (the killed attempt may have written checkpoints)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0


def launch(
    spec: Launch,
    argv: list[str],
    out: Path,
    requeue_exit_code: int | None,
    entry: Callable[[], Any],
) -> int:
    """Run `octlm ARGV` as the workers of `spec` and wait; the exit code for the command.
    `entry`: the CLI's `main`, which a forked worker runs on ARGV."""
    from octlm.trainer.forkstart import start_method

    method = start_method()  # a bad OCTLM_WORKER_START: its one line, before anything is set
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does, without its banner
    # The agent's shared TCPStore keeps a failed group's keys: a restarted worker can read its
    # dead peer's address and hang or fail connecting (pytorch/pytorch#135712, measured here
    # by bench/elastic_chaos.py). A fresh store per group, on rank 0, avoids it.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ[LAUNCHED_ENV] = "1"
    with tempfile.TemporaryDirectory(prefix="octlm-launch-") as notes:
        os.environ[NOTES_ENV] = notes
        return _run_agent(spec, argv, out, requeue_exit_code, Path(notes), (method, entry))


def _run_agent(
    spec: Launch,
    argv: list[str],
    out: Path,
    requeue_exit_code: int | None,
    notes: Path,
    start: tuple[str, Callable[[], Any]],
) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from octlm.trainer.forkstart import run_forked

    # The agent's per-failure log lines and "closing signal" notes repeat what the workers or
    # this launcher say in one line; its restart notices (another logger) stay.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    try:
        if start[0] != "exec":
            here = start[0] == "forkserver"
            run_forked(spec.torchrun_args(), worker_argv(argv), start[1], here)
        else:
            run(parse_args([*spec.torchrun_args(), "-m", "octlm", *worker_argv(argv)]))
    except ChildFailedError as exc:
        return failure_exit_code(exc, spec)
    except SignalException as exc:  # the workers were passed the signal and have stopped
        code = stopped_code(out, requeue_exit_code, wait_s=STOP_RECORD_WAIT_S)
        return code if code is not None else 128 + int(exc.sigval)
    except Exception as exc:  # the rendezvous: a wrong endpoint, a peer that never came
        if any(notes.iterdir()):
            # A worker here already said why in its line; the agent then lost the meeting
            # point because another node's launcher ended on the same error (it hosts it).
            return 1
        raise OctlmError(
            f"the launch of {spec.nnodes} node(s) failed ({type(exc).__name__}: {exc})",
            "check --rdzv-endpoint (reachable from every node, the port free) and that every "
            "node was started",
        ) from None
    code = stopped_code(out, requeue_exit_code)
    return code if code is not None else 0


def failure_exit_code(exc, spec: Launch) -> int:
    """The exit code of a failed group; one line when no worker said why (killed). The first
    failure is the cause: the agent then stops the other workers with SIGTERM."""
    # Earliest first. Timestamps are whole seconds: on a tie, an exit over a kill, and a kill by
    # anything else over the SIGTERM the agent sends the rest once one worker has failed.
    rank, failure = min(
        exc.failures.items(),
        key=lambda kv: (
            kv[1].timestamp,
            kv[1].exitcode < 0,
            kv[1].exitcode == -signal.SIGTERM,
            kv[0],
        ),
    )
    code = failure.exitcode
    if code < 0:  # killed by a signal: it could not say anything itself
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else -code
        tried = f" after {spec.max_restarts} restart(s)" if spec.max_restarts else ""
        print(
            f"octlm: error: rank {rank} (pid {failure.pid}) was killed by {name}{tried}; "
            "continue with the same command plus --resume",
            file=sys.stderr,
        )
        return 128 - code
    return code  # the worker printed its own error (a one-line octlm error or a traceback)


def stopped_code(out: Path, requeue_exit_code: int | None, wait_s: float = 0.0) -> int | None:
    """`requeue_exit_code` when the run in `out` last stopped on a scheduler's signal, waiting
    up to `wait_s` for the log's last record to be a stop or an end (whatever its reason)."""
    if requeue_exit_code is None:
        return None
    deadline = time.monotonic() + wait_s
    last = _last_record(out)
    while last.get("event") != "stop" and last.get("type") != "end":
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
        last = _last_record(out)
    return requeue_exit_code if _scheduler_stop(last) else None


def stopped_by_scheduler(out: Path) -> bool:
    """Whether the run's log ends with a stop on SIGTERM or SIGUSR1."""
    return _scheduler_stop(_last_record(out))


def _scheduler_stop(record: dict) -> bool:
    return record.get("event") == "stop" and record.get("reason") in REQUEUE_SIGNALS


def _last_record(out: Path) -> dict:
    from octlm.runlog.reader import LOG_NAME, read_log

    records = read_log(out) if (out / LOG_NAME).is_file() else []
    return records[-1] if records else {}
