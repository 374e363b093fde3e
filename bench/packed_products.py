"""What packing the weights once (`octlm/model/packed.py`) saves the plain decode's products: a
decoding step's chain of weight products (every layer's q, k, v, o, w1, w3, w2, then the tied
head) at 1..32 rows, `F.linear` against `PackedWeights.linear`, fp32, this CPU.

    .venv/bin/python -m bench.packed_products [--preset small] [--rounds 5] [--threads 1]
        [--exact]

Each round times both ways for every row count back to back, alternating which goes first; the
result is each way's median milliseconds per chain and the median of the per-round ratios
(packed / F.linear time). Below `MIN_ROWS` the packed way is `F.linear` itself. `--exact` adds
the exact path's product kernels 1 and 2 (`octlm/model/exact_products.py`) on the same chain,
each weight alone, its rows padded to a multiple of 2 as the exact path pads them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from octlm.config.shape import PRESETS, preset
from octlm.model.exact_products import ROWS, tiled_linear
from octlm.model.gpt import GPT
from octlm.model.packed import PackedWeights


def chain_weights(model: GPT) -> list[Tensor]:
    weights: list[Tensor] = []
    for layer in model.layers:
        attn, ffn = layer.attention, layer.feed_forward
        for module in (attn.wq, attn.wk, attn.wv, attn.wo, ffn.w1, ffn.w3, ffn.w2):
            weights.append(module.weight.detach())
    return [*weights, model.tok_embeddings.weight.detach()]


def timed(weights: list[Tensor], rows: int, linear: Callable[[Tensor, Tensor], Tensor]) -> float:
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for w in weights:
            linear(inputs[w.shape[1]], w)
        best.append(time.perf_counter() - t0)
    return statistics.median(best) * 1e3


def exact_way(kernel: int) -> Callable[[Tensor, Tensor], Tensor]:
    """The exact path's product by `kernel`, its weights packed once (as a decode's cache)."""
    packs: dict[int, object] = {}

    def linear(x: Tensor, weight: Tensor) -> Tensor:
        short = -x.shape[0] % ROWS
        return tiled_linear(F.pad(x, (0, 0, 0, short)) if short else x, weight, packs, kernel)

    return linear


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--exact", action="store_true", help="also the exact kernels 1 and 2")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    weights = chain_weights(GPT(preset(args.preset)))
    packed = PackedWeights()
    ways = {"F.linear": F.linear, "packed": packed.linear}
    if args.exact:
        ways.update({"kernel 1": exact_way(1), "kernel 2": exact_way(2)})
    times: dict[tuple[str, int], list[float]] = {}
    ratios: dict[int, list[float]] = {}
    with torch.no_grad():
        for r in range(args.rounds):
            for rows in args.rows:
                names = list(ways)
                order = names[r % len(names) :] + names[: r % len(names)]
                got = {name: timed(weights, rows, ways[name]) for name in order}
                for name, ms in got.items():
                    times.setdefault((name, rows), []).append(ms)
                    ratios.setdefault((name, rows), []).append(ms / got["F.linear"])
    print(f"{args.preset}, {len(weights)} products a step, threads {args.threads}, fp32")
    others = list(ways)[1:]
    print("| rows | F.linear ms | " + " | ".join(f"{n} ms (/ F.linear)" for n in others) + " |")
    print("|---:|---:|" + "---:|" * len(others))
    for rows in args.rows:
        cells = [f"{statistics.median(times['F.linear', rows]):.2f}"]
        for name in others:
            ms, ratio = (statistics.median(d[name, rows]) for d in (times, ratios))
            cells.append(f"{ms:.2f} ({ratio:.2f}x)")
        print(f"| {rows} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
