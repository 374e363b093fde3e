"""Malformed variants of the data surface's inputs, through the real CLI in this process: task
files in each of the three layouts (`octlm eval trained --tasks FILE`: the tasks are read before
any model is loaded, so `trained` need hold no run) and mixture specs (`octlm train
--print-config` with the `--data` string, or with a TOML file's [data] table). `run_tasks`,
`run_mixture_flag` and `run_mixture_toml` each return the failures of `n` seeded cases; the
fast lane runs a few hundred (tests/fuzz/test_data_fuzz.py), bench/fuzz_inputs.py thousands.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from tests.fuzz.harness import ODD_VALUES, problems, run_cli, swap_numbers, variants

LAYOUTS = {
    "octlm": [
        {"context": "A cat", "choices": [" sat", " flew"], "gold": 0, "delimiter": ""},
        {"context": "The sea is", "choices": ["wet", "dry", "blue"], "gold": 2},
    ],
    "hellaswag": [
        {"ctx": "He opens", "endings": ["the door", "a sky"], "label": "1"},
        {"ctx": "She sings", "endings": ["a song", "a stone", "the sun"], "label": 0},
    ],
    "arc": [
        {"question": "2+2?", "choices": {"text": ["3", "4"], "label": ["A", "B"]},
         "answerKey": "B"},
        {"question": "Sky?", "choices": {"text": ["blue", "red"], "label": ["1", "2"]},
         "answerKey": "1"},
    ],
}  # fmt: skip
DATASETS = ("a", "b", "c")
WEIGHT_SWAPS = (*ODD_VALUES, "x", "1e308", "1e-320", "0", "-1", "nan", "inf", "1,", ":", "")


def task_file(layout: str) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in LAYOUTS[layout]).encode("utf-8")


def prepare(root: Path) -> None:
    """The folders every case starts from: a stand-in run folder and three dataset names."""
    (root / "trained").mkdir(exist_ok=True)
    for name in DATASETS:
        (root / name).mkdir(exist_ok=True)


def check(args: list[str], root: Path, label: str) -> list[str]:
    return [f"{label}: {p}" for p in problems(run_cli(args, root))]


def run_tasks(seed: int, n: int, root: Path) -> list[str]:
    """`n` malformed task files, the layouts in turn (every fifth named as FILE:odd value)."""
    prepare(root)
    rng, failures = random.Random(seed), []
    per_layout = {name: variants(task_file(name), seed, n, json_lines=True) for name in LAYOUTS}
    for i in range(n):
        layout = list(LAYOUTS)[i % len(LAYOUTS)]
        (root / "t.jsonl").write_bytes(next(per_layout[layout]))
        spec = f"t.jsonl:{rng.choice(WEIGHT_SWAPS)}" if i % 5 == 4 else "t.jsonl"
        failures += check(["eval", "trained", "--tasks", spec], root, f"{layout} #{i}")
    return failures


def mixture_specs(seed: int, n: int) -> list[str]:
    """`n` mixture specs: a valid `a:0.7,b:0.3` with its numbers swapped, a weight replaced by
    an odd value, a part doubled or respelt (`a/`, `./a`), a separator dropped or doubled."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = [
            f"{d}:{rng.choice(['0.7', '0.3', '7', '1', '1e-3'])}"
            for d in DATASETS[: rng.randint(1, 3)]
        ]
        kind = rng.randrange(4)
        if kind == 0:
            spec = swap_numbers(",".join(parts), rng)
        elif kind == 1:
            i = rng.randrange(len(parts))
            parts[i] = f"{parts[i].split(':')[0]}:{rng.choice(WEIGHT_SWAPS)}"
            spec = ",".join(parts)
        elif kind == 2:
            name = rng.choice(DATASETS)
            spec = ",".join([*parts, f"{rng.choice([name, name + '/', './' + name])}:1"])
        else:
            spec = rng.choice([",", ",,", ":", ""]).join(parts)
        out.append(spec)
    return out


def run_mixture_flag(seed: int, n: int, root: Path) -> list[str]:
    """`octlm train --print-config --data SPEC` for `n` malformed specs."""
    prepare(root)
    return [
        p
        for i, spec in enumerate(mixture_specs(seed, n))
        for p in check(["train", "--print-config", "--data", spec], root, f"--data {spec!r} #{i}")
    ]


def toml_tables(seed: int, n: int) -> list[bytes]:
    """`n` TOML files whose [data] table is malformed: a weight of another type or size, a
    name respelt, the table cut short or its bytes broken."""
    rng = random.Random(seed)
    valid = b'model = "tiny"\n[data]\n"a" = 0.7\n"b" = 0.3\n'
    odd = ["true", '"0.5"', "nan", "inf", "-inf", "1e308", "1e-320", "0", "-1", "[1]", "{x = 1}",
           str(10**400), "1979-05-27", '"\\ud800"']  # fmt: skip
    out = []
    for data in variants(valid, seed, n):
        kind = rng.randrange(3)
        if kind == 0:
            out.append(valid.replace(b"0.3", rng.choice(odd).encode()))
        elif kind == 1:
            out.append(
                valid.replace(b'"b"', rng.choice([b'"a/"', b'"./a"', b'"a,b"', b'""', b'" "']))
            )
        else:
            out.append(data)
    return out


def run_mixture_toml(seed: int, n: int, root: Path) -> list[str]:
    """`octlm train --print-config --config mix.toml` for `n` malformed [data] tables."""
    prepare(root)
    failures = []
    for i, data in enumerate(toml_tables(seed, n)):
        (root / "mix.toml").write_bytes(data)
        args = ["train", "--print-config", "--config", "mix.toml"]
        failures += check(args, root, f"[data] #{i} {data[:80]!r}")
    return failures


FORMATS: dict[str, Callable[[int, int, Path], list[str]]] = {
    "tasks": run_tasks,
    "mixture_flag": run_mixture_flag,
    "mixture_toml": run_mixture_toml,
}


def run(seed: int, n: int, root: Path) -> list[str]:
    """Every format's failures for `n` cases each (each format in its own folder of `root`)."""
    failures = []
    for name, runner in FORMATS.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        failures += [f"{name}: {f}" for f in runner(seed, n, folder)]
    return failures
