"""Can the data side keep up? The loader against training, and prepare against raw tokenizing.

    .venv/bin/python -m bench.data_rate [--rounds 3] [--part all|loader|tokenize]
        [--packing stream|bos]

1. Micro-batches/s that `Sampler.batch` delivers from the memmapped demo shards for the small
   run's micro-batches (16 x 1024 tokens, accumulation 32: the seed's small.toml), against the
   micro-batches/s training consumes: one forward/backward of the small shape (vocabulary 4096,
   fp32, CPU) on a real 16 x 1024 micro-batch, timed in the same round. Also against the seed's
   GPU rate (small.toml: ~99,500 tokens/s = 6.07 micro-batches/s; quoted, not measured here).
   `--packing bos` reads BOS-aligned rows (`octlm.data.bos`) instead of stream windows.
2. Tokens/s of `octlm.prepare.text` on the embedded corpus with the demo tokenizer (reading
   and splitting the documents, encoding, writing and hashing the shards, the manifest), with
   its fast encoder (octlm.tokenizer.fastbpe) and with OCTLM_ENCODER=hf, against HF tokenizers'
   raw `encode_batch` on the same documents with the same tokenizer, the fast encoder alone (a
   fresh one each round: its set-up and an empty piece cache included), and, when tiktoken is
   importable, a `tiktoken.Encoding` built from that tokenizer's BPE (same ranks, the GPT-2
   split regex that the ByteLevel pre-tokenizer uses). The order of the five is reversed every
   other round; ratios are medians of same-round pairs. Checks that the fast encoder's and
   tiktoken's ids equal HF's over the whole corpus. tiktoken is not an octlm dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tokenizers
import torch

from octlm.config.shape import preset
from octlm.data.bos import BosRows
from octlm.data.dataset_tokenizer import dataset_tokenizer
from octlm.data.order import Sampler
from octlm.data.shards import ShardDataset
from octlm.data.windows import StreamWindows
from octlm.model.gpt import GPT
from octlm.prepare.corpus import read_documents
from octlm.prepare.text import PrepareConfig, prepare
from octlm.tokenizer.core import SPECIAL_TOKENS, Tokenizer
from octlm.tokenizer.fastbpe import ENCODER_ENV, DocumentEncoder

if not __package__:  # run as `python bench/data_rate.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import DATA

GPT2_SPLIT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SEED_GPU_TOKENS_PER_S = 99_500  # the shipped small config's comment
JOBS = ("prepare", "prepare_hf", "hf", "fast", "tiktoken")


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


def timed_prepare(tok_path: Path, encoder: str) -> tuple[float, dict]:
    """Seconds for one whole `prepare` into a temporary folder, with OCTLM_ENCODER=encoder."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    old = os.environ.get(ENCODER_ENV)
    os.environ[ENCODER_ENV] = encoder
    try:
        t0 = time.perf_counter()
        manifest = prepare(
            PrepareConfig(out=tmp / "data", tokenizer=tok_path, force=True), progress=False
        )
        return time.perf_counter() - t0, manifest
    finally:
        if old is None:
            os.environ.pop(ENCODER_ENV)
        else:
            os.environ[ENCODER_ENV] = old
        shutil.rmtree(tmp, ignore_errors=True)


def tokenize_round(r: int, tok_path: Path, hf: tokenizers.Tokenizer, enc, texts: list[str]) -> dict:
    """One round of the five tokenizer paths: seconds per job, and each job's output."""
    tokenizer = Tokenizer.load(tok_path)
    work = {
        "hf": lambda: [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)],
        "fast": lambda: DocumentEncoder(tokenizer).encode_batch(texts),
    }
    if enc is not None:
        work["tiktoken"] = lambda: enc.encode_ordinary_batch(texts)
    timings: dict[str, float] = {}
    outputs: dict[str, object] = {}
    for job in JOBS if r % 2 == 0 else JOBS[::-1]:
        if job.startswith("prepare"):
            setting = "hf" if job == "prepare_hf" else "auto"
            timings[job], outputs[job] = timed_prepare(tok_path, setting)
        elif job in work:
            t0 = time.perf_counter()
            outputs[job] = work[job]()
            timings[job] = time.perf_counter() - t0
    return {"timings": timings, "outputs": outputs}


def loader_round(r: int, sampler: Sampler, model: GPT, args, first: int, tokens: int):
    loader, first = loader_rate(sampler, args.loader_seconds, first)
    x, y = sampler.batch(r, 0)
    t0 = time.perf_counter()
    loss, _ = model(x, y)
    (loss / tokens).backward()
    train_s = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return loader, train_s, first


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--part", choices=("all", "loader", "tokenize"), default="all")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--loader-seconds", type=float, default=1.0)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--accum", type=int, default=32)
    ap.add_argument(
        "--packing",
        choices=("stream", "bos"),
        default="stream",
        help="the loader's rows: stream windows at any offset, or BOS-aligned rows (--packing bos)",
    )
    ap.add_argument(
        "--cold",
        action="store_true",
        help="with --packing bos: keep no block, so every row deals its block afresh (the cost "
        "on a corpus far larger than the cache, where a random row's block is rarely kept)",
    )
    return ap


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    data = Path(args.data)
    ds = ShardDataset.open(data)
    vocab = ds.manifest["tokenizer"]["vocab_size"]
    if args.packing == "bos":
        eos = dataset_tokenizer(ds).eos_id
        cache = {"cached_blocks": 0} if args.cold else {}
        windows = BosRows(ds.train, args.context, eos, ds.fingerprint, **cache)
    else:
        windows = StreamWindows(ds.train, args.context, 1, ds.fingerprint)  # the random order's
    sampler = Sampler(
        windows,
        seed=1337,
        context=args.context,
        micro_batch=args.micro_batch,
        accum=args.accum,
    )
    torch.manual_seed(0)
    model = GPT(preset("small", vocab_size=vocab, context=args.context))
    flops = model.flops_per_token(args.context)
    tokens = args.micro_batch * args.context
    gpu_rate = SEED_GPU_TOKENS_PER_S / tokens

    tok_path = data / "tokenizer.json"
    hf = tokenizers.Tokenizer.from_file(str(tok_path))
    hf.encode_special_tokens = True  # as octlm.tokenizer.core.Tokenizer sets it
    texts = [d.text for d in read_documents(())]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    enc, tk_version = build_tiktoken(tok_path)
    loading, tokenizing = args.part in ("all", "loader"), args.part in ("all", "tokenize")

    print(
        f"threads {torch.get_num_threads()}; {args.packing} rows{' (cold)' if args.cold else ''}; "
        f"micro-batch {args.micro_batch} "
        f"x {args.context}, "
        f"accum {args.accum}; small shape at vocabulary {vocab} ({flops / 1e6:.0f} MFLOP/token); "
        f"corpus {len(texts)} documents, {n_bytes / 1e6:.2f} MB"
    )
    loads, toks, first = [], [], 0
    for r in range(args.rounds):
        line = f"round {r}:"
        if loading:
            loader, train_s, first = loader_round(r, sampler, model, args, first, tokens)
            loads.append((loader, train_s))
            line += (
                f" loader {loader:,.0f} micro-batches/s, training {1 / train_s:.4f} "
                f"micro-batches/s ({train_s:.1f} s each), ratio {loader * train_s:,.0f}x;"
            )
        if tokenizing:
            toks.append(tokenize_round(r, tok_path, hf, enc, texts))
            line += " " + ", ".join(f"{job} {s:.3f} s" for job, s in toks[-1]["timings"].items())
        print(line, flush=True)
    if loading:
        print_loader(loads, gpu_rate)
    if tokenizing:
        print_tokenizing(toks, texts, n_bytes, tk_version, tok_path)


def print_loader(loads: list[tuple[float, float]], gpu_rate: float) -> None:
    loader_med = statistics.median(r[0] for r in loads)
    train_med = statistics.median(r[1] for r in loads)
    ratio = statistics.median(r[0] * r[1] for r in loads)
    print(
        "\n| loader micro-batches/s | training micro-batches/s (CPU, measured) | loader / training "
        "(median paired) | seed GPU micro-batches/s (quoted) | loader / seed GPU |"
    )
    print("|---:|---:|---:|---:|---:|")
    print(
        f"| {loader_med:,.0f} | {1 / train_med:.4f} | {ratio:,.0f}x | {gpu_rate:.2f} | "
        f"{loader_med / gpu_rate:,.0f}x |"
    )


def print_tokenizing(toks: list[dict], texts, n_bytes: int, tk_version, tok_path: Path) -> None:
    first = toks[0]["outputs"]
    hf_ids = first["hf"]
    hf_tokens = sum(map(len, hf_ids))
    prep_tokens = sum(first["prepare"]["splits"][s]["tokens"] for s in ("train", "val"))
    labels = {
        "prepare": ("octlm prepare (whole), fast encoder", prep_tokens),
        "prepare_hf": ("octlm prepare (whole), OCTLM_ENCODER=hf", prep_tokens),
        "hf": ("HF encode_batch (raw)", hf_tokens),
        "fast": ("fast encoder alone (DocumentEncoder.encode_batch)", prep_tokens),
        "tiktoken": (f"tiktoken {tk_version} encode_ordinary_batch (raw)", hf_tokens),
    }

    def paired(job: str, base: str) -> float:
        return statistics.median(t["timings"][job] / t["timings"][base] for t in toks)

    print(
        "\n| tokenizer path | s (median) | tokens | tokens/s | MB/s of text | time / HF "
        "encode_batch (median paired) | time / prepare with OCTLM_ENCODER=hf (median paired) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for job in JOBS:
        if job not in toks[0]["timings"]:
            continue
        label, n = labels[job]
        med = statistics.median(t["timings"][job] for t in toks)
        print(
            f"| {label} | {med:.3f} | {n:,} | {n / med:,.0f} | {n_bytes / 1e6 / med:.2f} | "
            f"{paired(job, 'hf'):.3f} | {paired(job, 'prepare_hf'):.3f} |"
        )
    same_fp = all(
        t["outputs"]["prepare"]["fingerprint"] == t["outputs"]["prepare_hf"]["fingerprint"]
        for t in toks
    )
    print(
        f"prepare writes {prep_tokens:,} tokens: HF's {hf_tokens:,} plus BOS and EOS for each of "
        f"{len(texts)} documents ({prep_tokens - hf_tokens - 2 * len(texts)} unexplained); same "
        f"dataset fingerprint with and without the fast encoder in every round: {same_fp}; "
        f"encoder note {first['prepare']['encoder']}"
    )
    fast_same = [ids[1:-1].tolist() for ids in first["fast"]] == hf_ids
    print(f"fast encoder ids identical to HF over the whole corpus: {fast_same}")
    if "tiktoken" not in first:
        print("tiktoken is not installed: skipped")
        return
    tk_ids = first["tiktoken"]
    diff_docs = sum(a != b for a, b in zip(tk_ids, hf_ids, strict=True))
    ordered, other_splits = bpe_facts(tok_path)
    print(
        f"tiktoken ids identical to HF over the whole corpus: {tk_ids == hf_ids} ({diff_docs} of "
        f"{len(texts)} documents differ); merges in id order: {ordered}; vocabulary entries with a "
        f"two-token split that is not their merge: {other_splits}"
    )


if __name__ == "__main__":
    main()
