"""`python -m octlm` (and `torchrun -m octlm`) run the CLI."""

import os
import sys

from octlm.cli.main import main
from octlm.trainer.worker_exit import exit_without_finalising

code = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a torchrun worker: see the function
    exit_without_finalising(code if isinstance(code, int) else 0)
sys.exit(code)
