"""The launcher's forkserver as a fork of the launcher, where the launcher is in the state a
fresh forkserver would reach.

multiprocessing starts its forkserver as a fresh interpreter, which imports torch and octlm
(forkstart.PRELOAD) before it forks the first worker: about 2 s of CPU, 3.5 s of wall time on
a busy 2-core machine, before every launch's first step. A launcher that runs `octlm train
--nproc N` has made those imports already and, up to its launch, runs no thread, no OpenMP
pool and no process group: forked there, it is the forkserver the fresh interpreter would have
become. So, where it can tell that this holds, the launcher makes the imports it lacks (the
forkserver would make them anyway) and starts multiprocessing's own
forkserver (the code multiprocessing would run in the fresh interpreter, so each Python's own
protocol) in a fork of itself instead (measured by bench/worker_start.py).

It holds when all of these do; otherwise the forkserver starts fresh, as before:
- Linux, and a torch built without CUDA or ROCm: a process that has touched a GPU driver
  cannot hand it to a fork, and a launcher of a GPU run may have (device detection).
- One thread in the process (C and C++ threads counted): a fork copies only the caller's.
- The variables read while a process starts or imports torch (octlm/numerics.py
  READ_AT_START) are what they were when octlm was imported, torch after it: otherwise the
  libraries were set up for another environment than a fresh forkserver would read (the
  launcher's own `OMP_NUM_THREADS=1` default, set after its imports, is one such change).

The child keeps what the fresh interpreter would be given: the standard streams and the
descriptors multiprocessing passes; it closes every other one, puts Python-level signal
handlers back to the interpreter's defaults, and ends with os._exit, never running the
launcher's exit handlers. Same bits either way (tests/e2e/test_distributed.py).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from octlm.numerics import changed_since_start, record

AGENT_ONLY = frozenset({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE"})
"""Variables `launch` sets after the imports that only the agent reads, in this process."""
FORKSERVER_CODE = "multiprocessing.forkserver"
"""What the command line multiprocessing gives its forkserver's interpreter imports."""


def why_not_here() -> str | None:
    """Why a fork of this process, its imports made, would not be the forkserver a fresh
    interpreter becomes after making them; None when it would."""
    import torch

    if not sys.platform.startswith("linux"):
        return f"forking is Linux-only here ({sys.platform})"
    if torch.version.cuda or torch.version.hip:
        return "a CUDA or ROCm build of torch"
    if record()["torch_loaded_first"]:
        return "torch was imported before octlm"
    threads = running_threads()
    if threads != 1:
        return f"{threads} threads run in this process"
    changed = [k for k in changed_since_start() if k not in AGENT_ONLY]
    if changed:
        return f"{', '.join(changed)} changed since the imports"
    return None


def running_threads(settle_s: float = 0.05) -> int:
    """The threads of this process, read from Linux's /proc; a thread that has just ended (its
    join returned) can stay listed for a moment, so a count above 1 is read again for up to
    `settle_s` seconds."""
    deadline = time.monotonic() + settle_s
    while True:
        threads = len(os.listdir("/proc/self/task"))
        if threads == 1 or time.monotonic() >= deadline:
            return threads
        time.sleep(0.002)


def fork_forkserver(preload: Sequence[str]) -> str | None:
    """Start multiprocessing's forkserver (with `preload`, set already) as a fork of this
    process; None when it was, else why not (the agent then starts a fresh one)."""
    why = why_not_here()
    if why is None:
        for name in preload:  # as the fresh forkserver would (a launcher has most already)
            importlib.import_module(name)
        why = why_not_here()  # again: an import could have started a thread
    if why is not None:
        return why
    gc.collect()  # nothing unreachable left for the child to finalise later
    multiprocessing.resource_tracker.ensure_running()  # its own fresh helper, as before
    spawn = multiprocessing.util.spawnv_passfds
    multiprocessing.util.spawnv_passfds = _forking(spawn)  # type: ignore[assignment]
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        multiprocessing.util.spawnv_passfds = spawn  # type: ignore[assignment]
    return None


def _forking(spawn: Callable[..., int]) -> Callable[..., int]:
    """`spawnv_passfds` that forks this process for the forkserver's command line and runs its
    code there; any other command line goes to `spawn`."""

    def spawn_or_fork(path: str, args: Sequence[str], passfds: Sequence[int]) -> int:
        if len(args) < 2 or args[-2] != "-c" or FORKSERVER_CODE not in args[-1]:
            return spawn(path, args, passfds)
        for stream in (sys.stdout, sys.stderr):  # or the child's exit would write them again
            with contextlib.suppress(Exception):
                stream.flush()
        try:
            pid = os.fork()
        except OSError:  # no memory or process left for a fork: the fresh interpreter, then
            return spawn(path, args, passfds)
        if pid == 0:
            _become(args[-1], passfds)
        return pid

    return spawn_or_fork


def _become(code: str, passfds: Sequence[int]) -> NoReturn:
    """In the fork: what the fresh interpreter is given, then its code; never returns."""
    status = 1
    try:
        _close_all_but((0, 1, 2, *passfds))
        _default_signals()
        exec(compile(code, "<forkserver>", "exec"), {"__name__": "__forkserver__"})
        status = 0
    except SystemExit as exc:  # how the forkserver ends when its launcher has gone
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(status)


def _close_all_but(keep: Sequence[int]) -> None:
    """Close every descriptor not in `keep`, as a spawn with close_fds does."""
    low = 0
    for fd in sorted(set(keep)):
        if low < fd:  # os.closerange(0, 0) closes every descriptor (its end -1 is unsigned)
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _default_signals() -> None:
    """Python-level handlers back to what a fresh interpreter has (ignored signals stay
    ignored, as across exec)."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError, TypeError):
            if callable(signal.getsignal(sig)):
                fresh = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
                signal.signal(sig, fresh)
