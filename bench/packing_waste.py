"""Why prompt/completion examples are packed: padding's share of the positions a run computes,
packed (best-fit decreasing, `octlm.data.packing.pack`) against one example per window and
against packing in input order (next fit), on several length mixes and contexts; and what the
per-example attention mask costs in step time.

    python -m bench.packing_waste                # the waste table (counting only: any machine)
    python -m bench.packing_waste --part speed   # masked vs plain causal step, interleaved

Length mixes: the embedded plays cut into real prompt/completion pairs (a speech and the reply
to it, tokenised with the tiny tokenizer), their short form (a line and a one-line reply), and
two log-normal mixes shaped like instruction-tuning sets (medians and spreads given below: a
stand-in, no such set is on this machine).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from octlm.data.dataset_tokenizer import tokenizer_at
from octlm.data.packing import pack, waste_shares
from octlm.model import GPT, preset
from octlm.prepare.corpus import embedded_documents
from octlm.prepare.text import embedded_dataset

CONTEXTS = (256, 512, 1024, 2048)


def speeches() -> list[list[str]]:
    out = []
    for work in sorted(embedded_documents(), key=lambda d: d.id):
        blocks = [s.split("\n") for s in work.text.split("\n\n")]
        out.append([b for b in blocks if len(b) > 1 and b[0].isupper() and b[0].endswith(".")])
    return out


def play_mixes() -> dict[str, np.ndarray]:
    """Example sizes (positions: tokens - 1) of the two play-derived mixes."""
    tok = tokenizer_at(embedded_dataset(4096) / "tokenizer.json")
    long_p, long_c, short_p, short_c = [], [], [], []
    for play in speeches():
        for a, b in zip(play, play[1:], strict=False):
            long_p.append("\n".join(a) + "\n\n" + b[0] + "\n")
            long_c.append("\n".join(b[1:]))
            short_p.append(f"{a[-1]}\n{b[0]}\n")
            short_c.append(b[1])
    mixes = {}
    for name, prompts, completions in (
        ("plays: speech -> reply", long_p, long_c),
        ("plays: line -> one-line reply", short_p, short_c),
    ):
        p = tok.encode_batch(prompts, add_special_tokens=False)
        c = tok.encode_batch(completions, add_special_tokens=False)
        # [BOS] + prompt + completion + EOS tokens fill tokens - 1 positions
        mixes[name] = np.array([len(x) + len(y) + 1 for x, y in zip(p, c, strict=True)])
    return mixes


def lognormal_mix(
    n: int, prompt: tuple[float, float], completion: tuple[float, float]
) -> np.ndarray:
    rng = np.random.default_rng(0)
    p = np.exp(rng.normal(np.log(prompt[0]), prompt[1], n)).astype(np.int64) + 1
    c = np.exp(rng.normal(np.log(completion[0]), completion[1], n)).astype(np.int64) + 1
    return p + c + 1


def next_fit_padding(sizes: np.ndarray, capacity: int) -> float:
    """Packing in input order: a window closes when the next example does not fit."""
    fits = sizes[(sizes <= capacity) & (sizes > 0)]
    windows, room = 0, 0
    for size in fits.tolist():
        if size > room:
            windows, room = windows + 1, capacity
        room -= size
    return 1 - int(fits.sum()) / (windows * capacity)


def batch_longest_padding(sizes: np.ndarray, capacity: int, batch: int = 8) -> float:
    """One example per row, rows padded to the longest of their batch (what HF's and litgpt's
    collators do), batches of `batch` examples in input order."""
    fits = sizes[(sizes <= capacity) & (sizes > 0)]
    n = len(fits) // batch * batch
    rows = fits[:n].reshape(-1, batch)
    return 1 - int(rows.sum()) / int(rows.max(axis=1).sum() * batch)


def waste_table() -> None:
    mixes = play_mixes()
    mixes["log-normal: prompt 40 x/÷2.5, completion 120 x/÷2.7"] = lognormal_mix(
        50_000, (40, 0.9), (120, 1.0)
    )
    mixes["log-normal: prompt 300 x/÷2, completion 250 x/÷2.2"] = lognormal_mix(
        50_000, (300, 0.7), (250, 0.8)
    )
    print("padding share of computed positions (lower is better); skipped = longer than T")
    columns = ("T", "median", "p95", "skipped", "one/window", "batch max", "next fit", "best fit")
    print(f"{'mix':52s} " + " ".join(f"{c:>10s}" for c in columns) + f" {'windows':>8s}")
    for name, sizes in mixes.items():
        for T in CONTEXTS:
            shares = waste_shares(sizes, T)
            skipped = float(np.mean(sizes > T))
            cells = (
                f"{T:10d} {int(np.median(sizes)):10d} {int(np.percentile(sizes, 95)):10d} "
                f"{skipped:10.1%} {shares['padded']:10.1%} {batch_longest_padding(sizes, T):10.1%} "
                f"{next_fit_padding(sizes, T):10.1%} {shares['packed']:10.2%}"
            )
            print(f"{name:52s} {cells} {shares['windows']:8,d}")
    t0 = time.perf_counter()
    pack(mixes["log-normal: prompt 40 x/÷2.5, completion 120 x/÷2.7"], 1024)
    print(f"pack() of 50,000 examples at T=1024: {time.perf_counter() - t0:.2f} s")


def speed(rounds: int, context: int, micro_batch: int) -> None:
    """Forward + backward of the tiny model on one batch, plain causal vs segment-masked
    (4 examples a row), interleaved A/B; paired median of the ratios."""
    torch.manual_seed(0)
    model = GPT(preset("tiny", context=context))
    x = torch.randint(3, 4096, (micro_batch, context))
    seg = torch.arange(context).repeat(micro_batch, 1) * 4 // context + 1
    ratios = []
    for _ in range(rounds):
        times = {}
        for name, extra in (("plain", ()), ("masked", (seg,))):
            t0 = time.perf_counter()
            loss, n = model(x, x, *extra)
            (loss / n).backward()
            model.zero_grad(set_to_none=True)
            times[name] = time.perf_counter() - t0
        ratios.append(times["masked"] / times["plain"])
    print(
        f"tiny, T={context}, batch {micro_batch}, {torch.get_num_threads()} threads: masked / "
        f"plain step time, median of {rounds} interleaved pairs: {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("waste", "speed"), default="waste")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    args = parser.parse_args()
    if args.part == "waste":
        waste_table()
    else:
        speed(args.rounds, args.context, args.micro_batch)


if __name__ == "__main__":
    main()
