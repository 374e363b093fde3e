"""Workers forked from a forkserver that has imported torch, instead of one fresh `python -u -m
octlm` per worker (OCTLM_WORKER_START=exec keeps the fresh ones).

A fresh worker spends about 2 s of CPU importing torch and torch._dynamo before its first step,
and an elastic restart pays it again for every worker. Here the launcher's agent starts its
workers with Python's forkserver (torch's callable entrypoint, `--start-method forkserver`):
one process, started from this launcher's environment, imports `PRELOAD` once and nothing
else (no thread, no OpenMP pool, no process group: the state a fresh worker reaches once its
imports are done), and each worker, each restart's too, is a fork of it. The child then
becomes the worker torchrun would have started (`worker`): its own session, `-u` streams,
`sys.argv` of `-m octlm`, the agent's per-worker variables, and it ends as octlm/__main__.py
ends a worker. What a process reads only while it imports (thread and BLAS settings, Python's
flags) is the forkserver's, that is the launcher's environment when its first group started:
so only a process's first launch forks, a later one (a second `main()` in one Python) starts
fresh workers.

Seen from outside, the workers are the forkserver's children (the launcher's grandchildren),
each leading its own session as torchrun's do, and `ps` shows the forkserver's command line.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import io
import logging
import multiprocessing
import multiprocessing.synchronize
import os
import signal
import sys
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from octlm.errors import OctlmError
from octlm.trainer.forkserver_here import fork_forkserver

START_ENV = "OCTLM_WORKER_START"
"""`forkserver` (the default: forked from this launcher where it can be, octlm/trainer/
forkserver_here.py), `fresh-forkserver` (always a fresh interpreter) or `exec` (a fresh
`python -u -m octlm` per worker)."""
START_METHODS = ("forkserver", "fresh-forkserver", "exec")
PRELOAD = ["octlm", "torch", "torch._dynamo", "octlm.cli.main", "octlm.trainer.loop"]
"""In this order: `octlm` pins the thread settings before torch loads (octlm/numerics.py), as
in a fresh worker; torch._dynamo is imported by the first optimizer a run builds."""
QUIET_LOGGERS = ("torch.multiprocessing.spawn",)
"""Its "Terminating process N via signal SIGTERM" repeats what the worker or launcher says in
one line, as the agent's own per-failure lines do (launch.py silences those)."""

_forked: list[bool] = []
"""Whether this process has started a forkserver (see the module's docstring)."""


def start_method() -> str:
    """How this launch starts its workers: `START_ENV`, `forkserver` unless a forkserver of an
    earlier launch in this process would hold that launch's import-time settings."""
    method = os.environ.get(START_ENV, "forkserver")
    if method not in START_METHODS:
        raise OctlmError(
            f"{START_ENV}={method!r} is not a way to start workers",
            f"use one of {', '.join(START_METHODS)} (or leave it unset: forkserver)",
        )
    return "exec" if _forked else method


def run_forked(
    torchrun_args: list[str], argv: list[str], entry: Callable[[], Any], here: bool = True
) -> None:
    """What `torch.distributed.run.run` does with `torchrun_args`, with the workers forked
    from the forkserver and running `worker(entry, *argv)`; raises as it does. `entry` is the
    CLI's `main`, handed down by the CLI (the trainer does not import the floor above it); it
    reaches the worker pickled by name. `here`: the forkserver is a fork of this process where
    that is what a fresh one would be (octlm/trainer/forkserver_here.py)."""
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # Set before the agent starts the forkserver (at its first group): it imports these then.
    multiprocessing.set_forkserver_preload(PRELOAD)
    _forked.append(True)
    args = parse_args([*torchrun_args, "--start-method=forkserver", "-m", "octlm", *argv])
    if args.standalone:  # as torch.distributed.run.run: a rendezvous of this node alone
        args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500
    config, _, _ = config_from_args(args)
    if here:
        # The agent sets this for its own signal handling before it starts any worker; a
        # fresh forkserver started then would carry it, so the fork made now carries it too.
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
        fork_forkserver(PRELOAD)  # where it cannot, the agent starts a fresh one
    elastic_launch(config=config, entrypoint=worker)(entry, *argv)


def worker(entry: Callable[[], Any], *argv: str) -> None:
    """A worker, in the forked child of the forkserver: `python -u -m octlm ARGV` as torchrun
    starts it, once the agent's wrapper has set this worker's variables (RANK, LOCAL_RANK,
    WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_RESTART_COUNT...) over the forkserver's environment,
    which is the launcher's. A failure exits with its code at once, as octlm/__main__.py
    does; success returns, for the agent's wrapper to hand the agent its return value."""
    from octlm.trainer.worker_exit import exit_without_finalising, run_exit_steps

    faulthandler.disable()  # the agent's wrapper turned it on; a `-m octlm` worker has it off
    # torchrun starts each worker in a session of its own: a terminal's Ctrl-C then reaches
    # the launcher only, which passes it on once (a second SIGINT means "exit now").
    os.setsid()
    unbuffered_streams()
    sys.argv = [main_path(), *argv]
    code = run_main(entry)
    if code != 0:
        exit_without_finalising(code)
    run_exit_steps()
    # The wrapper puts the return value into a pipe (a SimpleQueue: written before `put`
    # returns, so it outlives this process), then waits until the agent has read every
    # worker's. An agent that is stopping its workers on a signal reads none: the worker would
    # wait out the agent's 30 s and be killed. A `-m octlm` worker exits here; so does this.
    multiprocessing.synchronize.Event.wait = _no_wait  # type: ignore[method-assign]


def _no_wait(self: Any, timeout: float | None = None) -> bool:
    return True


def run_main(main: Callable[[], Any]) -> int:
    """octlm's CLI on `sys.argv`, ending as the interpreter ends `-m octlm`: its exit code, an
    uncaught exception's traceback."""
    try:
        code = main()
    except SystemExit as exc:  # sys.exit(...) inside: its code, or its message and 1
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the interpreter prints it and dies of SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    return code if isinstance(code, int) else 0


def unbuffered_streams() -> None:
    """sys.stdout and sys.stderr as `python -u` makes them (torchrun starts workers with -u):
    each write reaches the file at once, so a worker that ends with os._exit loses nothing and
    two workers' lines interleave as they are written."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        old.flush()
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(
            sys,
            name,
            io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, write_through=True),
        )


def main_path() -> str:
    """`sys.argv[0]` of `python -m octlm`: octlm/__main__.py's path (the run log records it)."""
    spec = importlib.util.find_spec("octlm.__main__")
    assert spec is not None and spec.origin is not None
    return spec.origin


def worker_pids(launcher: int) -> list[int]:
    """The worker processes the elastic agent in `launcher` (a pid) runs, read from Linux's
    /proc: its descendants that lead a session of their own. torchrun starts each worker in a
    new session as its child; forked workers are the children of the launcher's forkserver and
    start a session too (`worker`). For tools and tests that signal or kill one worker."""
    procs: dict[int, tuple[int, int]] = {}  # pid: (parent, session)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            procs[int(stat.parent.name)] = (int(fields[1]), int(fields[3]))
        except (OSError, ValueError, IndexError):
            continue

    def under_launcher(pid: int) -> bool:
        while pid in procs and pid != launcher:
            pid = procs[pid][0]
        return pid == launcher

    return sorted(
        pid
        for pid, (parent, session) in procs.items()
        if session == pid and pid != launcher and under_launcher(parent)
    )
