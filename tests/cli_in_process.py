"""`octlm ARGS` in the test's process with octlm's parser built once per process.

Building the parser (every command's flags and their help, ~10 ms) was most of an in-process
refusal's time, and the bad-input tables and the fuzz run it hundreds of times. The parser is
the one `octlm.cli.main.build_parser` builds, and argparse keeps no state between parses; only
a default read from the environment when it is built (`octlm serve --api-key`) would be the
first call's, and no caller of this module sets one.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence


@functools.cache
def built_parser() -> argparse.ArgumentParser:
    from octlm.cli.main import build_parser

    return build_parser()


def main(args: Sequence[str] | None = None) -> int:
    """`octlm.cli.main.main(args)`, parsing with `built_parser()`."""
    from octlm.cli import main as cli

    parser, built = built_parser(), cli.build_parser
    cli.build_parser = lambda: parser  # type: ignore[assignment]
    try:
        return cli.main(args)
    finally:
        cli.build_parser = built
