"""`python -m octlm` (and `torchrun -m octlm`) run the CLI."""

import sys

from octlm.cli import main

sys.exit(main())
