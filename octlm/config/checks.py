"""The ranges a value must be in where it enters octlm: a config field, a data command's flag, an
argument of the Python API. Each rule says in words what it accepts, so every refusal reads
`NAME=VALUE must be <rule>` whichever door the value came in by.

Torch-free (the data commands import it). The bounds:
- integers up to `MAX_INT` = 2**53 - 1: logs, manifests and checkpoint metadata are JSON, whose
  readers (the report's JavaScript among them) hold no larger integer exactly; and a seed below
  it keeps `seed * 1000 + rank + step` (the re-seed of a resume under another process count)
  inside torch's 64-bit seed;
- real numbers must be finite (TOML has `nan` and `inf`; Python's `float()` reads both);
- processes (`--workers`, `--jobs`, `--nproc`) at most `PROCESSES_PER_CORE` per core: more only
  adds processes that wait for a core, each with its own memory.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octlm.errors import OctlmError

MAX_INT = 2**53 - 1
PROCESSES_PER_CORE = 4
_SHOWN_CHARS = 60
_PATH_CHARS = 160


def is_int(value: Any) -> bool:
    """An int that is not a bool (True is an int to Python, not to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _bound(value: float) -> str:
    return (
        "2**53 - 1"
        if value == MAX_INT
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


@dataclass(frozen=True)
class Int:
    """An integer in [lo, hi]."""

    lo: int
    hi: int = MAX_INT

    def ok(self, value: Any) -> bool:
        return is_int(value) and self.lo <= value <= self.hi

    def __str__(self) -> str:
        return f"an integer from {self.lo} to {_bound(self.hi)}"


@dataclass(frozen=True)
class Number:
    """A finite real number between lo and hi, each end open or closed (hi may be inf: none)."""

    lo: float
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False

    def ok(self, value: Any) -> bool:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        try:
            x = float(value)  # an int past float's range does not fit either
        except OverflowError:
            return False
        if not math.isfinite(x):
            return False
        above = x > self.lo if self.lo_open else x >= self.lo
        below = x < self.hi if self.hi_open else x <= self.hi
        return above and below

    def __str__(self) -> str:
        if self.hi == math.inf:
            return f"a finite number {'>' if self.lo_open else '>='} {_bound(self.lo)}"
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f"a number in {left}{_bound(self.lo)}, {_bound(self.hi)}{right}"


@dataclass(frozen=True)
class Bool:
    def ok(self, value: Any) -> bool:
        return isinstance(value, bool)

    def __str__(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Text:
    """A non-empty string without NUL (a path, a name, a field)."""

    what: str = "a non-empty string"

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and value.strip() != "" and "\0" not in value

    def __str__(self) -> str:
        return self.what


PATH = Text("a non-empty path")


@dataclass(frozen=True)
class Separator(Text):
    """A non-empty string without NUL where whitespace counts: a blank line ("\n\n") is a
    separator as much as '<|endoftext|>' is."""

    what: str = "a non-empty string"

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and value != "" and "\0" not in value


def shown(value: Any) -> str:
    """`repr(value)`, cut to one short line."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def shown_path(path: Any) -> str:
    """A path as it reads, when short and printable; else `shown` (quoted, escaped, cut): an
    error line quotes at most a short prefix of what a user typed, never a newline of it."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    return text if len(text) <= _PATH_CHARS and text.isprintable() else shown(text)


def problem(label: str, value: Any, rule: Int | Number | Bool | Text) -> str | None:
    """`label=VALUE must be <rule>` (`--flag VALUE ...` for a flag) when `value` breaks `rule`,
    else None."""
    if rule.ok(value):
        return None
    given = f"{label} {shown(value)}" if label.startswith("--") else f"{label}={shown(value)}"
    return f"{given} must be {rule}"


def check(
    label: str,
    value: Any,
    rule: Int | Number | Bool | Text,
    fix: str,
    error: type[OctlmError] = OctlmError,
) -> None:
    found = problem(label, value, rule)
    if found is not None:
        raise error(found, fix)


def check_path(label: str, value: Any, error: type[OctlmError] = OctlmError) -> None:
    """A path argument: a non-empty str or os.PathLike (an empty string would name the current
    folder, where nobody meant to read or write)."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    check(label, text, PATH, f"name a file or folder as {label}", error)


def max_processes() -> int:
    return PROCESSES_PER_CORE * (os.cpu_count() or 1)


def check_processes(flag: str, value: Any, error: type[OctlmError] = OctlmError) -> None:
    """A number of processes to start: at least 1, at most `PROCESSES_PER_CORE` per core."""
    most = max_processes()
    if not Int(1, most).ok(value):
        raise error(
            f"{flag} {shown(value)} must be an integer from 1 to {most} "
            f"({PROCESSES_PER_CORE} per core on this machine's {os.cpu_count() or 1})",
            f"pass {flag} between 1 and {most}",
        )


@functools.lru_cache(maxsize=1)
def machine_memory() -> int | None:
    """Bytes of memory this process may use: the physical memory, or a smaller cgroup limit
    (a container's); None where neither can be read."""
    found = []
    with contextlib.suppress(ValueError, OSError, AttributeError):  # not every OS has them
        found.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            found.append(int(text))
    return min(found) if found else None
