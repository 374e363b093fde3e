"""Why prompt/completion examples are packed: padding's share of the positions a run computes,
packed (best-fit decreasing, `octlm.data.packing.pack`) against one example per window and
against packing in input order (next fit), on several length mixes and contexts; and what the
per-example attention mask costs in step time.

    python -m bench.packing_waste                # the waste table (counting only: any machine)
    python -m bench.packing_waste --part speed   # masked vs plain causal step, interleaved
    python -m bench.packing_waste --part bos     # pretraining rows: BOS-aligned, carry vs crop

Length mixes: the embedded plays cut into real prompt/completion pairs (a speech and the reply
to it, tokenised with the tiny tokenizer), their short form (a line and a one-line reply), and
two log-normal mixes shaped like instruction-tuning sets (medians and spreads given below: a
stand-in, no such set is on this machine).

`--part bos` counts, for pretraining documents, what `--packing bos` (`octlm.data.bos`: rows
start at documents, what does not fit is carried into later rows) reads and what cropping would
drop (nanochat's BOS best-fit: the longest document in a buffer of 1,000 that fits the room
left, and when none fits, the shortest cropped to the room, its rest dropped). Corpora: the
embedded plays as prepared (4096 BPE: whole plays, tens of thousands of tokens each), their
speeches as documents (tens of tokens), and a log-normal stand-in for web text (median 400
tokens, spread x/÷2.5).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import statistics
import time

import numpy as np
import torch

from octlm.config.shape import preset
from octlm.data.bos import BosRows
from octlm.data.dataset_tokenizer import tokenizer_at
from octlm.data.packing import pack, waste_shares
from octlm.data.shards import ShardDataset, TokenStream
from octlm.model.gpt import GPT
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


def crop_share(lengths: np.ndarray, capacity: int, buffer: int = 1000) -> float:
    """Share of the tokens that BOS best-fit with cropping drops (see the module docstring)."""
    pending = iter(lengths.tolist())
    pool: list[int] = []
    dropped = 0
    while True:
        room = capacity
        while room:
            pool.extend(itertools.islice(pending, buffer - len(pool)))
            if not pool:
                return dropped / int(lengths.sum())
            pool.sort()
            j = bisect.bisect_right(pool, room) - 1
            if j >= 0:
                room -= pool.pop(j)
            else:  # nothing fits: the shortest document, cropped to the room
                dropped += pool.pop(0) - room
                room = 0


def documents_stream(lengths: np.ndarray) -> TokenStream:
    """Documents of `lengths` tokens, each ending with EOS (1); what they hold is not read."""
    tokens = np.full(int(lengths.sum()), 3, dtype=np.uint16)
    tokens[np.cumsum(lengths) - 1] = 1
    return TokenStream([tokens])


def document_lengths() -> dict[str, np.ndarray]:
    tok = tokenizer_at(embedded_dataset(4096) / "tokenizer.json")
    plays = ShardDataset.open(embedded_dataset(4096)).train
    ends = np.flatnonzero(np.asarray(plays.window(0, len(plays))) == tok.eos_id)
    texts = ["\n".join(b) for play in speeches() for b in play]
    return {
        "embedded plays (train split)": np.diff(np.concatenate(([-1], ends))),
        "speeches of the plays": np.array([len(x) + 2 for x in tok.encode_batch(texts)]),
        "log-normal 400 x/÷2.5 (web-like)": np.exp(
            np.random.default_rng(0).normal(np.log(400), 0.9, 20_000)
        ).astype(np.int64)
        + 2,
    }


def bos_table() -> None:
    print(
        "pretraining rows of T + 1 tokens: --packing bos (carry) against cropping; shares of "
        "the corpus's tokens, and of rows"
    )
    columns = ("T", "docs", "median", "crop drops", "bos drops", "bos pads", "rows@doc", "max")
    print(f"{'corpus':34s} " + " ".join(f"{c:>10s}" for c in columns))
    for name, lengths in document_lengths().items():
        stream = documents_stream(lengths)
        for T in CONTEXTS:
            rows = BosRows(stream, T, 1, "bench", cached_blocks=0)
            n_blocks = -(-len(rows) // rows.rows_per_block)
            at_doc = np.concatenate([rows.block(b).at_start for b in range(n_blocks)])
            unread = (len(stream) - len(rows) * (T + 1)) / len(stream)
            possible = min(1.0, len(lengths) / len(rows))
            cells = (
                f"{T:10d} {len(lengths):10,d} {int(np.median(lengths)):10d} "
                f"{crop_share(lengths, T + 1):10.1%} {unread:10.2%} {0:10.1%} "
                f"{at_doc.mean():10.1%} {possible:10.1%}"
            )
            print(f"{name:34s} {cells}")
    print("rows@doc: rows that start at a document; max: documents / rows, the most possible")


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("waste", "speed", "bos"), default="waste")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if args.part == "waste":
        waste_table()
    elif args.part == "bos":
        bos_table()
    else:
        speed(args.rounds, args.context, args.micro_batch)


if __name__ == "__main__":
    main()
