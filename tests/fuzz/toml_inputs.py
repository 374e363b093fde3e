"""Malformed variants of each shipped config (octlm/configs/**/*.toml), each read by
`octlm train --config FILE --print-config` in this process: the config must be printed, or
refused in one line (tests/fuzz/harness.py's `problems`), never a traceback.

Beside the harness's byte and number mutations, TOML-aware ones: a value of the wrong type, a
table (or an array of tables) where a value belongs, a duplicate key, invalid UTF-8 inside a
string, huge and tiny numbers, a key nobody knows. `run(seed, n, root)` returns the failures;
tests/fuzz/test_toml_fuzz.py runs a few hundred, bench/fuzz_inputs.py thousands.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.fuzz.harness import problems, run_cli, variants

CONFIGS = Path(__file__).resolve().parents[2] / "octlm" / "configs"
ASSIGNMENT = re.compile(r"^(\s*)([A-Za-z_][\w-]*)(\s*=\s*)(.+?)\s*$")
WRONG_VALUES = (
    '"text"', '""', '" "', "true", "false", "[1, 2]", "[]", "{ a = 1 }", "{}", "1979-05-27",
    "07:32:00", "1.5", "-1", "0", '"' + "x" * 5000 + '"', "'''multi\nline'''", '"\\u202e"',
    "[[1], [2]]", '["a", 1]',
)  # fmt: skip
"""Values of another type or an odd shape, put where any key's value was."""
NUMBERS = (
    "1e309", "-1e309", "1e-320", "-0.0", "nan", "-nan", "inf", "+inf", "1e308", "4.9e-324",
    "1" + "0" * 40, "-" + "9" * 30, "0x7fffffffffffffff", "0o777", "0b1", "1_000", "2**53",
)  # fmt: skip
"""Numbers TOML reads (and some it does not): past float, denormal, non-finite, huge ints."""


def shipped_configs() -> list[Path]:
    return sorted(CONFIGS.rglob("*.toml"))


def _lines(text: str) -> list[str]:
    return text.splitlines()


def _assignments(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if ASSIGNMENT.match(line)]


def _set_value(lines: list[str], i: int, value: str) -> list[str]:
    m = ASSIGNMENT.match(lines[i])
    assert m is not None
    return [*lines[:i], f"{m[1]}{m[2]}{m[3]}{value}", *lines[i + 1 :]]


def wrong_type(lines: list[str], rng: random.Random) -> list[str]:
    i = rng.choice(_assignments(lines))
    return _set_value(lines, i, rng.choice(WRONG_VALUES))


def odd_number(lines: list[str], rng: random.Random) -> list[str]:
    i = rng.choice(_assignments(lines))
    return _set_value(lines, i, rng.choice(NUMBERS))


def table_for_value(lines: list[str], rng: random.Random) -> list[str]:
    """A key's value moved into a table of that name (at the end, where a table may start), or
    an inline table, or an array of tables."""
    i = rng.choice(_assignments(lines))
    m = ASSIGNMENT.match(lines[i])
    assert m is not None
    rest = [*lines[:i], *lines[i + 1 :]]
    kind = rng.randrange(3)
    if kind == 0:
        return [*rest, f"[{m[2]}]", f"value = {m[4]}"]
    if kind == 1:
        return [*rest, f"[[{m[2]}]]", "x = 1"]
    return _set_value(lines, i, f"{{ value = {m[4]} }}")


def duplicate_key(lines: list[str], rng: random.Random) -> list[str]:
    i = rng.choice(_assignments(lines))
    at = rng.randrange(len(lines) + 1)
    return [*lines[:at], lines[i], *lines[at:]]


def unknown_key(lines: list[str], rng: random.Random) -> list[str]:
    name = rng.choice(["learning_rate", "stepz", "x" * 3000, "sweep.grid", "'quoted key'"])
    return [f"{name} = {rng.choice(WRONG_VALUES + NUMBERS)}", *lines]


TEXT_MUTATIONS: tuple[Callable[[list[str], random.Random], list[str]], ...] = (
    wrong_type,
    odd_number,
    table_for_value,
    duplicate_key,
    unknown_key,
)


def invalid_utf8_in_a_string(text: str, rng: random.Random) -> bytes:
    """Bytes no UTF-8 decoder takes, inside a quoted value (or at the end of the file)."""
    data = text.encode("utf-8")
    quotes = [m.start() + 1 for m in re.finditer(rb'"', data)]
    at = rng.choice(quotes) if quotes else len(data)
    bad = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00"])
    return data[:at] + bad + data[at:]


def toml_variants(valid: str, seed: int, n: int) -> Iterator[bytes]:
    """`n` malformed variants of the TOML text `valid`, the same ones for the same seed: half
    the harness's, half TOML-aware (one or two mutations of the lines)."""
    rng = random.Random(seed)
    generic = variants(valid.encode("utf-8"), seed, n)
    for _ in range(n):
        kind = rng.randrange(4)
        if kind == 0:
            yield next(generic)
        elif kind == 1:
            yield invalid_utf8_in_a_string(valid, rng)
        else:
            lines = _lines(valid)
            for _ in range(rng.choice((1, 1, 2))):
                lines = rng.choice(TEXT_MUTATIONS)(lines, rng)
            yield ("\n".join(lines) + "\n").encode("utf-8")


def run(seed: int, n: int, root: Path) -> list[str]:
    """`n` variants, spread over the shipped configs, each through `octlm train --config FILE
    --print-config` in `root`; a line per variant that broke a property of a refusal."""
    configs = shipped_configs()
    failures: list[str] = []
    for k, config in enumerate(configs):
        count = n // len(configs) + (k < n % len(configs))
        text = config.read_text(encoding="utf-8")
        for j, data in enumerate(toml_variants(text, seed * 1000 + k, count)):
            (root / "fuzz.toml").write_bytes(data)
            outcome = run_cli(["train", "--config", "fuzz.toml", "--print-config"], root)
            for found in problems(outcome):
                failures.append(f"{config.name} seed {seed} case {j}: {found} ({data[:200]!r})")
    return failures


FORMATS: dict[str, Callable[[int, int, Path], list[str]]] = {"configs": run}
"""The formats bench/fuzz_inputs.py runs by name."""
