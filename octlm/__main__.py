"""`python -m octlm` (and `torchrun -m octlm`) run the CLI."""

import atexit
import os
import sys
import threading

from octlm.cli import main

code = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    # A torchrun worker ends without tearing the interpreter down. Its process group is already
    # destroyed and its files written, but gloo's C++ threads can still hold objects that the
    # interpreter's finalisation then frees: once on the CI machine a 2-process FSDP run
    # aborted there ("terminate called without an active exception") after printing "done",
    # and the agent reported the run as killed (44 reruns here did not; pytorch/pytorch#179291
    # describes the same crash). What a normal exit does first still happens: other Python
    # threads are joined and the exit handlers run; only the finalisation is skipped.
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 0)
sys.exit(code)
