"""How a worker process ends: as a normal exit would, bar the interpreter's finalisation
(octlm/__main__.py for `-m octlm` workers, octlm/trainer/forkstart.py for forked ones)."""

from __future__ import annotations

import os
import sys


def exit_without_finalising(code: int) -> None:
    """End this process as a normal exit would, minus the interpreter's finalisation: the other
    Python threads are joined, the exit handlers run, the streams are flushed.

    A torchrun worker ends this way (octlm/__main__.py). Its process group is already destroyed
    and its files written, but gloo's C++ threads can still hold objects that the finalisation
    then frees: once on the CI machine a 2-process FSDP run aborted there ("terminate called
    without an active exception") after printing "done", and the agent reported the run as
    killed (44 reruns here did not; pytorch/pytorch#179291 describes the same crash)."""
    run_exit_steps()
    os._exit(code)


def run_exit_steps() -> None:
    """What a normal exit does before the interpreter's finalisation: join the other Python
    threads (not daemons), run the exit handlers, flush the standard streams."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
