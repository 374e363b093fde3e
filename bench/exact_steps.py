"""The exact path's decode step (`octlm/model/exact.py`) against an earlier commit's module and
the plain cached step, in one process, interleaved: what a change to the exact path bought.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.exact_steps [--against 9787f5c]
        [--presets tiny small] [--batches 1 8] [--steps 40] [--rounds 7] [--full]

`--full` times instead the full forward of a scored batch (`SCORED`: an evaluation's
micro-batch, a prefill, an on-policy update's forward) for each path: the plain one is
`GPT.forward`.

The earlier modules are read from git (`git show COMMIT:octlm/model/exact.py` and the
siblings it had: `exact_products.py`, `exact_tiles.py`, `exact_blocks.py`) and imported beside
today's, so they run on today's model, RoPE and packing helpers (fine while those keep their
names; tests/model/test_exact_history.py holds kernels 1-2 to the old bits). Both sides run
their default kernel (today's `EXACT_KERNEL`, which older code reads as its newest). Each round
times, in rotating order, `--steps` decode steps of each path after the same 16-token prefill;
the result is each path's median step and the medians of the per-round ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

from octlm.config.shape import PRESETS, preset
from octlm.model import exact
from octlm.model.gpt import GPT
from octlm.model.kvcache import KVCache, forward_cached
from octlm.model.packed import PackedWeights

ROOT = Path(__file__).resolve().parents[1]
PROMPT = 16
SCORED = {"tiny": (16, 120), "small": (8, 250)}
"""Rows x tokens of `--full`'s batch per preset (others: 8 x 120). Not whole key tiles of 64:
kernels 1-2 before d2c71ac failed on those (a strided view)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="9787f5c", help="the commit whose module to time")
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=sorted(PRESETS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--full", action="store_true", help="time a scored batch's forward")
    return parser


def load(name: str, text: str) -> ModuleType:
    """`text` imported as module `name` (from a file of its own)."""
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


SIBLINGS = ("exact_tiles", "exact_products", "exact_blocks")
"""The exact path's modules beside `exact.py`, in an order each imports only earlier ones."""


def module_at(commit: str) -> ModuleType:
    """`octlm/model/exact.py` as it was at `commit`, on its sibling modules as they were then
    (those the commit has), imported under other names."""

    def show(name: str) -> str | None:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:octlm/model/{name}.py"],
            capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout if done.returncode == 0 else None

    def then(text: str) -> str:
        for name in SIBLINGS:
            text = text.replace(f"from octlm.model.{name} import", f"from {name}_before import")
        return text

    for name in SIBLINGS:
        text = show(name)
        if text is not None:
            load(f"{name}_before", then(text))
    text = show("exact")
    assert text is not None, f"{commit} has no octlm/model/exact.py"
    return load("exact_before", then(text))


def exact_step(module: ModuleType, model: GPT, ids: torch.Tensor, steps: int) -> float:
    """Seconds a decode step of `module`'s exact path takes, after a prefill of `ids`."""
    B = ids.shape[0]
    cache = module.ExactCache(model, B)
    lengths = torch.full((B,), ids.shape[1])
    module.forward_exact(model, ids, cache, at=lengths - 1)
    token, first = ids[:, -1:], torch.zeros(B, dtype=torch.long)
    t0 = time.perf_counter()
    for s in range(steps):
        module.forward_exact(model, token, cache, lengths + s, at=first)
    return (time.perf_counter() - t0) / steps


def plain_step(model: GPT, ids: torch.Tensor, steps: int) -> float:
    """Seconds a plain cached decode step takes (packed products from 2 rows, as
    `generate_batch`'s plain path)."""
    cache = KVCache(model, ids.shape[0])
    linear = PackedWeights().linear if ids.shape[0] > 1 else None
    forward_cached(model, ids, cache, linear=linear)
    t0 = time.perf_counter()
    for _ in range(steps):
        forward_cached(model, ids[:, -1:], cache, linear=linear)
    return (time.perf_counter() - t0) / steps


def full_forward(forward, ids: torch.Tensor) -> float:
    """Seconds one call of `forward(ids)` takes."""
    t0 = time.perf_counter()
    forward(ids)
    return time.perf_counter() - t0


def timed(model: GPT, ids: torch.Tensor, before: ModuleType, args: argparse.Namespace) -> dict:
    """Per path ("before", "now", "plain"): its step's (or with `--full` its forward's) seconds,
    one a round, the order rotated."""
    if args.full:
        paths = {
            "before": lambda: full_forward(lambda x: before.forward_exact(model, x), ids),
            "now": lambda: full_forward(lambda x: exact.forward_exact(model, x), ids),
            "plain": lambda: full_forward(model, ids),
        }
    else:
        paths = {
            "before": lambda: exact_step(before, model, ids, args.steps),
            "now": lambda: exact_step(exact, model, ids, args.steps),
            "plain": lambda: plain_step(model, ids, args.steps),
        }
    for run in paths.values():
        run()  # warm each
    times: dict[str, list[float]] = {k: [] for k in paths}
    for r in range(args.rounds):
        for key in list(paths)[r % 3 :] + list(paths)[: r % 3]:
            times[key].append(paths[key]())
    return times


def ratio(times: dict, a: str, b: str) -> float:
    """The median of the per-round ratios of path a's time to path b's."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


@torch.no_grad()  # (not set_grad_enabled: a test calls main in its process)
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    before = module_at(args.against)
    what = "the full forward of a scored batch" if args.full else f"{args.steps} decode steps"
    print(f"threads {torch.get_num_threads()}, {what}, {args.rounds} rounds, fp32")
    print("preset  batch  before ms  now ms  plain ms  now/before  before/plain  now/plain")
    for name in args.presets:
        torch.manual_seed(0)
        model = GPT(preset(name)).eval()
        shapes = [SCORED.get(name, (8, 120))] if args.full else [(b, PROMPT) for b in args.batches]
        for batch, length in shapes:
            ids = torch.randint(0, model.config.vocab_size, (batch, length))
            times = timed(model, ids, before, args)
            ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            print(
                f"{name:6s} {batch:6d} {ms['before']:10.2f} {ms['now']:7.2f} {ms['plain']:9.2f} "
                f"{ratio(times, 'now', 'before'):11.3f} {ratio(times, 'before', 'plain'):13.3f} "
                f"{ratio(times, 'now', 'plain'):10.3f}"
            )


if __name__ == "__main__":
    main()
