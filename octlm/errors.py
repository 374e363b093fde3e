"""The one error type the CLI catches: a problem and its fix, printed as one line.

Library code raises `OctlmError` (or a subclass) for anything a user can cause; `cli.main()`
prints `octlm: error: <problem>; <fix>` and exits non-zero without a traceback.
"""

from __future__ import annotations

import re

LONGEST_WORD = 160
"""Characters of one unbroken run (a path, a value, a key) an error line shows before `...`."""


def one_line(text: str) -> str:
    """`text` as one short printable line: newlines and other control characters escaped, each
    unbroken run of more than LONGEST_WORD characters cut to its start. The backstop under every
    message: whatever a raise site quotes of a user's input, the line stays a line."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    cut = LONGEST_WORD - 3
    return re.sub(rf"\S{{{LONGEST_WORD + 1},}}", lambda m: m.group(0)[:cut] + "...", text)


class OctlmError(Exception):
    """A user-facing failure: `problem` says what is wrong, `fix` what to do about it."""

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return f"{self.problem}; {self.fix}" if self.fix else self.problem


class DataError(OctlmError):
    """Bad corpus, shard or manifest."""


class TokenizerError(OctlmError):
    """Bad tokenizer file or settings."""


class ResumeError(OctlmError):
    """A checkpoint that does not belong to this run, or that this run cannot continue."""


class RankError(OctlmError):
    """What one rank of a multi-process run alone hit (a file it cannot read): that rank prints
    it. An error every rank raises alike is printed by rank 0 only, not once per process."""


class QuotedError(OctlmError):
    """A refusal that quotes what is not a setting the user gave: another process's error line,
    or run names made of settings (`lr=0.001-r0`). The command line shows it as written, not
    with its settings renamed as the user typed them (`octlm.cli.flags.named_as_typed`)."""
