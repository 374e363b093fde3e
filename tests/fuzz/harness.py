"""The fuzz pass's two halves, shared by every format's generator (tests/fuzz/*_inputs.py) and
by bench/fuzz_inputs.py, which runs many thousands of the cases the fast lane runs hundreds of.

Malformed variants of a valid input (`mutations`: cut short, a wrong type in a JSON field,
invalid UTF-8, a lone surrogate, huge, tiny and non-finite numbers), each handed to the real
command in this process (`run_cli`: `octlm.cli.main.main`); `problems` names what broke of the
four properties every refusal keeps: a non-zero exit, exactly one stderr line
`octlm: error: PROBLEM; FIX` of bounded length, no traceback, and the tree as it was.
An input the command accepts is fine: a mutation may well be valid.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cli_in_process import main

MAX_LINE_CHARS = 600
"""An error line quotes at most a short prefix of a user's value: a line longer than this
quoted one whole (a 16,000-character line was seen)."""
ODD_VALUES: tuple[Any, ...] = (
    None, True, 0, -1, 1e308, -1e308, 1e-320, float("nan"), float("inf"), 10**30, "",
    " ", "x" * 5000, "\u202e\u200b", [], [1, 2], {}, {"a": 1}, "\ud800",
)  # fmt: skip
"""Values of the wrong type or an absurd size, swapped into a JSON field."""
NUMBER_SWAPS = ("nan", "inf", "-inf", "-0", "0", "1e309", "1e-320", "-1", "1" + "0" * 40)


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str
    crash: str | None
    """The traceback of an exception that escaped `main`, if one did."""
    changed: list[str]
    """Paths under the root that were added, removed or rewritten."""


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")
    }


def run_cli(args: list[str], root: Path, stdin: str | None = None) -> Outcome:
    """`octlm ARGS` in this process (its parser built once: tests/cli_in_process.py), in `root`,
    stdin replaced by `stdin` when given."""
    before, cwd = snapshot(root), Path.cwd()
    out, err, crash, code = io.StringIO(), io.StringIO(), None, 0
    saved_stdin = sys.stdin
    os.chdir(root)
    try:
        if stdin is not None:
            sys.stdin = io.StringIO(stdin)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exc:  # argparse: a usage line, then its error line
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 (whatever escapes is the finding)
                crash = traceback.format_exc()
                code = 1
    finally:
        sys.stdin = saved_stdin
        os.chdir(cwd)
    after = snapshot(root)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return Outcome(code, out.getvalue(), err.getvalue(), crash, changed)


def problems(
    outcome: Outcome, allowed_changes: Callable[[str], bool] = lambda _: False
) -> list[str]:
    """What of the four properties `outcome` broke; [] when it holds them (or succeeded)."""
    if outcome.crash is not None:
        return [f"traceback: {outcome.crash.strip().splitlines()[-1]}"]
    if outcome.code == 0:
        return []
    found = []
    lines = [line for line in outcome.err.splitlines() if not line.startswith("usage:")]
    if len(lines) != 1 or "Traceback" in outcome.err:
        found.append(f"{len(lines)} stderr lines: {outcome.err[:300]!r}")
    elif not lines[0].startswith("octlm") or ": error: " not in lines[0]:
        found.append(f"not an error line: {lines[0][:200]!r}")
    elif len(lines[0]) > MAX_LINE_CHARS:
        found.append(f"an error line of {len(lines[0])} characters")
    changed = [p for p in outcome.changed if not allowed_changes(p)]
    if changed:
        found.append(f"refused, yet changed {changed[:5]}")
    return found


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One byte-level mutation: cut short, invalid UTF-8, a lone surrogate, a NUL, doubled."""
    at = rng.randrange(len(data) + 1)
    kind = rng.randrange(5)
    if kind == 0:
        return data[:at]
    if kind == 1:
        return (
            data[:at] + rng.choice([b"\xff", b"\xc3", b"\x80\x80", b"\xf4\x90\x80\x80"]) + data[at:]
        )
    if kind == 2:
        return data[:at] + b"\xed\xa0\x80" + data[at:]  # a UTF-8-encoded lone surrogate
    if kind == 3:
        return data[:at] + b"\x00" + data[at:]
    return data + data[:at]


def swap_numbers(text: str, rng: random.Random) -> str:
    """Every number-looking token may become nan, inf, -0, 1e309, a 41-digit integer..."""
    return re.sub(
        r"(?<![\w.])-?\d+(\.\d+)?(e-?\d+)?(?![\w.])",
        lambda m: rng.choice(NUMBER_SWAPS) if rng.random() < 0.5 else m.group(0),
        text,
    )


def mutate_json(value: Any, rng: random.Random) -> Any:
    """`value` (parsed JSON) with one field, at any depth, replaced by an odd value, or removed."""
    if isinstance(value, dict) and value:
        key = rng.choice(sorted(value))
        copy = dict(value)
        if rng.random() < 0.2:
            del copy[key]
        elif rng.random() < 0.5:
            copy[key] = mutate_json(copy[key], rng)
        else:
            copy[key] = rng.choice(ODD_VALUES)
        return copy
    if isinstance(value, list) and value:
        copy = list(value)
        i = rng.randrange(len(copy))
        copy[i] = mutate_json(copy[i], rng) if rng.random() < 0.5 else rng.choice(ODD_VALUES)
        return copy
    return rng.choice(ODD_VALUES)


def json_line(value: Any) -> bytes:
    """`value` as one JSON line; a lone surrogate written as its escape (JSON allows it)."""
    return (json.dumps(value, allow_nan=True) + "\n").encode("utf-8")


def variants(valid: bytes, seed: int, n: int, json_lines: bool = False) -> Iterator[bytes]:
    """`n` malformed variants of `valid`, the same ones for the same seed."""
    rng = random.Random(seed)
    lines = valid.decode("utf-8").splitlines()
    for _ in range(n):
        kind = rng.randrange(3)
        if kind == 0 and json_lines and lines:
            i = rng.randrange(len(lines))
            changed = list(lines)
            bad = json_line(mutate_json(json.loads(lines[i]), rng)).decode().rstrip("\n")
            changed[i] = bad
            yield ("\n".join(changed) + "\n").encode("utf-8")
        elif kind == 1:
            yield swap_numbers(valid.decode("utf-8"), rng).encode("utf-8")
        else:
            yield mutate_bytes(valid, rng)


def fuzz_count(default: int) -> int:
    """Cases per format: `default` in the suite, `OCTLM_FUZZ_CASES` when the bench sets it."""
    return int(os.environ.get("OCTLM_FUZZ_CASES", default))
