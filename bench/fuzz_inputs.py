"""The fuzz pass at scale: many thousands of malformed variants of the formats octlm reads from
users (task files, `--data` mixtures, prompts, chat input and message lists, TOML configs),
each through the real command in this process, each accepted or refused in one line with
nothing on disk changed: the same cases the suite runs a few hundred of (tests/fuzz/).

    .venv/bin/python -m bench.fuzz_inputs [--cases 5000] [--seeds 1 2 3] [--formats NAME ...]

Prints, per format and seed, the cases run, the failures and the seconds taken, then the first
failures in full; exit 1 when any case failed. A format is a `FORMATS` entry of a
`tests/fuzz/*_inputs.py` module: `run(seed, n, root) -> failures`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

FUZZ = Path(__file__).resolve().parents[1] / "tests" / "fuzz"
Runner = Callable[[int, int, Path], list[str]]


def formats() -> dict[str, Runner]:
    """Every format of every `tests/fuzz/*_inputs.py` module, named `module.format`."""
    found: dict[str, Runner] = {}
    for path in sorted(FUZZ.glob("*_inputs.py")):
        module = importlib.import_module(f"tests.fuzz.{path.stem}")
        for name, run in getattr(module, "FORMATS", {}).items():
            found[f"{path.stem.removesuffix('_inputs')}.{name}"] = run
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=5000, help="cases per format and seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--formats", nargs="+", help="format names (default: all)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if str(FUZZ.parents[1]) not in sys.path:  # `tests` importable from a checkout
        sys.path.insert(0, str(FUZZ.parents[1]))
    runners = formats()
    chosen = args.formats or sorted(runners)
    unknown = sorted(set(chosen) - set(runners))
    if unknown:
        raise SystemExit(f"unknown format(s) {unknown}; known: {sorted(runners)}")
    failures: list[str] = []
    print("| format | seed | cases | failures | seconds |\n|---|---:|---:|---:|---:|")
    for name in chosen:
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                found = runners[name](seed, args.cases, Path(tmp))
                took = time.perf_counter() - start
            print(f"| {name} | {seed} | {args.cases} | {len(found)} | {took:.1f} |", flush=True)
            failures += [f"{name} seed {seed}: {f}" for f in found]
    for failure in failures[:30]:
        print(failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
