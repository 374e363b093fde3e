"""Can the data side keep up? The loader against training, and prepare against raw tokenizing.

    .venv/bin/python -m bench.data_rate [--rounds 3]

1. Micro-batches/s that `Sampler.batch` delivers from the memmapped demo shards for the small
   run's micro-batches (16 x 1024 tokens, accumulation 32: the seed's small.toml), against the
   micro-batches/s training consumes: one forward/backward of the small shape (vocabulary 4096,
   fp32, CPU) on a real 16 x 1024 micro-batch, timed in the same round. Also against the seed's
   GPU rate (small.toml: ~99,500 tokens/s = 6.07 micro-batches/s; quoted, not measured here).
2. Tokens/s of `octlm.data.prepare` on the embedded corpus with the demo tokenizer (reading
   and splitting the documents, encoding, writing and hashing the shards, the manifest)
   against HF tokenizers' raw `encode_batch` on the same documents with the same tokenizer,
   and, when tiktoken is importable, a `tiktoken.Encoding` built from that tokenizer's BPE
   (same ranks, the GPT-2 split regex that the ByteLevel pre-tokenizer uses), with a check
   that its ids equal HF's over the whole corpus. tiktoken is not an octlm dependency.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer

from octlm.data.corpus import read_documents
from octlm.data.order import Sampler
from octlm.data.prepare import PrepareConfig, prepare
from octlm.data.shards import ShardDataset
from octlm.model import GPT, preset
from octlm.tokenizer import SPECIAL_TOKENS

DATA = "runs/demo/data"
GPT2_SPLIT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SEED_GPU_TOKENS_PER_S = 99_500  # configs/small.toml's comment


def loader_rate(sampler: Sampler, seconds: float, first: int) -> tuple[float, int]:
    """Micro-batches/s over about `seconds`, walking steps and micro-batches in order."""
    n, t0 = 0, time.perf_counter()
    while (dt := time.perf_counter() - t0) < seconds:
        k = first + n
        sampler.batch(k // sampler.accum, k % sampler.accum)
        n += 1
    return n / dt, first + n


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte -> printable character table (what ByteLevel uses), inverted."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def build_tiktoken(path: Path):
    """A tiktoken.Encoding with the HF BPE's ids as ranks; None when tiktoken is missing."""
    try:
        import tiktoken
    except ImportError:
        return None, None
    dec = byte_decoder()
    spec = json.loads(path.read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    ranks = {
        bytes(dec[c] for c in token): idx
        for token, idx in vocab.items()
        if token not in SPECIAL_TOKENS
    }
    enc = tiktoken.Encoding(
        "octlm-bpe",
        pat_str=GPT2_SPLIT,
        mergeable_ranks=ranks,
        special_tokens={t: vocab[t] for t in SPECIAL_TOKENS},
    )
    return enc, tiktoken.__version__


def bpe_facts(path: Path) -> tuple[bool, int]:
    """(merge i makes token id first_merge + i for every merge, how many vocabulary entries
    split into two other entries in a way that is not their merge). The second is where
    rank-based BPE (tiktoken) could, on some input, merge differently from merge-list BPE."""
    spec = json.loads(path.read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    merges = [
        tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["model"]["merges"]
    ]
    first = len(vocab) - len(merges)
    ordered = all(vocab[a + b] == first + i for i, (a, b) in enumerate(merges))
    pairs = set(merges)
    other = 0
    for token in vocab:
        if token in SPECIAL_TOKENS:
            continue
        for k in range(1, len(token)):
            x, y = token[:k], token[k:]
            if x in vocab and y in vocab and (x, y) not in pairs:
                other += 1
    return ordered, other


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--loader-seconds", type=float, default=1.0)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--accum", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = Path(args.data)
    ds = ShardDataset.open(data)
    vocab = ds.manifest["tokenizer"]["vocab_size"]
    sampler = Sampler(
        ds.train, seed=1337, context=args.context, micro_batch=args.micro_batch, accum=args.accum
    )
    torch.manual_seed(0)
    model = GPT(preset("small", vocab_size=vocab, context=args.context))
    flops = model.flops_per_token(args.context)
    tokens = args.micro_batch * args.context
    gpu_rate = SEED_GPU_TOKENS_PER_S / tokens

    tok_path = data / "tokenizer.json"
    hf = HFTokenizer.from_file(str(tok_path))
    hf.encode_special_tokens = True  # as octlm.tokenizer.Tokenizer sets it
    texts = [d.text for d in read_documents(())]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    enc, tk_version = build_tiktoken(tok_path)

    print(
        f"threads {torch.get_num_threads()}; micro-batch {args.micro_batch} x {args.context}, "
        f"accum {args.accum}; small shape at vocabulary {vocab} ({flops / 1e6:.0f} MFLOP/token); "
        f"corpus {len(texts)} documents, {n_bytes / 1e6:.2f} MB"
    )
    rows, first = [], 0
    for r in range(args.rounds):
        loader, first = loader_rate(sampler, args.loader_seconds, first)
        x, y = sampler.batch(r, 0)
        t0 = time.perf_counter()
        loss, _ = model(x, y)
        (loss / tokens).backward()
        train_s = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)

        timings = {}
        order = ["prepare", "hf", "tiktoken"] if r % 2 == 0 else ["tiktoken", "hf", "prepare"]
        for job in order:
            if job == "prepare":
                tmp = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
                t0 = time.perf_counter()
                manifest = prepare(
                    PrepareConfig(out=tmp / "data", tokenizer=tok_path, force=True),
                    progress=False,
                )
                timings[job] = time.perf_counter() - t0
                shutil.rmtree(tmp, ignore_errors=True)
                prep_tokens = sum(manifest["splits"][s]["tokens"] for s in ("train", "val"))
            elif job == "hf":
                t0 = time.perf_counter()
                hf_ids = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
                timings[job] = time.perf_counter() - t0
                hf_tokens = sum(map(len, hf_ids))
            elif enc is not None:
                t0 = time.perf_counter()
                tk_ids = enc.encode_ordinary_batch(texts)
                timings[job] = time.perf_counter() - t0
        rows.append((loader, train_s, timings))
        line = (
            f"round {r}: loader {loader:,.0f} micro-batches/s, training {1 / train_s:.4f} "
            f"micro-batches/s ({train_s:.1f} s each), ratio {loader * train_s:,.0f}x; prepare "
            f"{prep_tokens / timings['prepare']:,.0f} tok/s, HF encode_batch "
            f"{hf_tokens / timings['hf']:,.0f} tok/s"
        )
        if "tiktoken" in timings:
            line += f", tiktoken {hf_tokens / timings['tiktoken']:,.0f} tok/s"
        print(line)

    loader_med = statistics.median(r[0] for r in rows)
    train_med = statistics.median(r[1] for r in rows)
    ratio = statistics.median(r[0] * r[1] for r in rows)
    print(
        "\n| loader micro-batches/s | training micro-batches/s (CPU, measured) | loader / training "
        "(median paired) | seed GPU micro-batches/s (quoted) | loader / seed GPU |"
    )
    print("|---:|---:|---:|---:|---:|")
    print(
        f"| {loader_med:,.0f} | {1 / train_med:.4f} | {ratio:,.0f}x | {gpu_rate:.2f} | "
        f"{loader_med / gpu_rate:,.0f}x |"
    )

    def med(job: str) -> float:
        return statistics.median(r[2][job] for r in rows)

    print(
        "\n| tokenizer path | s (median) | tokens | tokens/s | MB/s of text | time / HF "
        "encode_batch (median paired) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    jobs = [("octlm prepare (whole)", "prepare", prep_tokens), ("HF encode_batch", "hf", hf_tokens)]
    if enc is not None:
        jobs.append((f"tiktoken {tk_version} encode_ordinary_batch", "tiktoken", hf_tokens))
    for label, job, n in jobs:
        paired = statistics.median(r[2][job] / r[2]["hf"] for r in rows)
        print(
            f"| {label} | {med(job):.3f} | {n:,} | {n / med(job):,.0f} | "
            f"{n_bytes / 1e6 / med(job):.2f} | {paired:.3f} |"
        )
    print(
        f"prepare writes {prep_tokens:,} tokens: HF's {hf_tokens:,} plus BOS and EOS for each of "
        f"{len(texts)} documents ({prep_tokens - hf_tokens - 2 * len(texts)} unexplained)"
    )
    if enc is None:
        print("tiktoken is not installed: skipped")
        return
    same = tk_ids == hf_ids
    diff_docs = sum(a != b for a, b in zip(tk_ids, hf_ids, strict=True))
    ordered, other_splits = bpe_facts(tok_path)
    print(
        f"tiktoken ids identical to HF over the whole corpus: {same} ({diff_docs} of "
        f"{len(texts)} documents differ); merges in id order: {ordered}; vocabulary entries with a "
        f"two-token split that is not their merge: {other_splits}"
    )


if __name__ == "__main__":
    main()
