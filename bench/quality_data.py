"""bench/quality.py's text: the held-out split of the embedded corpus, the training data each
side reads (octlm's prepared dataset, nanoGPT's .bin files and meta.pkl), and the scoring of
the held-out stream in bits per byte (bench/quality.py's docstring says how and why).
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench.vs_nanogpt import Shape
from octlm.data.dataset_tokenizer import dataset_tokenizer
from octlm.data.shards import ShardDataset
from octlm.prepare.corpus import embedded_documents
from octlm.prepare.sources import Document
from octlm.prepare.split import TRAIN, KeyTable, SplitRule, plan_split

VOCAB = 4096
HELDOUT_SHARE = 0.1
PREPARE_SPLIT = SplitRule(val_fraction=None, val_docs=1, val_tokens=None)
"""`prepare --val-docs 1`: the one validation document prepare insists on (trained on by none)."""
DATA_RECIPE = "quality-1"
"""Part of the prepared data's cache key: change it when the way the data is made changes."""
SCORE_BATCH = 8
LN2 = math.log(2.0)


class BenchError(Exception):
    """Ends the bench with its one-line message."""


def split_heldout(
    docs: Sequence[Document], share: float = HELDOUT_SHARE
) -> tuple[list[Document], list[Document]]:
    """(training, held-out): the held-out documents are the last ones in input order, whole,
    taken until they hold at least `share` of all characters; at least one stays in training."""
    total = sum(len(d.text) for d in docs)
    held, chars = 0, 0
    while held < len(docs) - 1 and chars < share * total:
        held += 1
        chars += len(docs[-held].text)
    cut = len(docs) - held
    return list(docs[:cut]), list(docs[cut:])


def truncate_docs(docs: Sequence[Document], n_bytes: int | None) -> list[Document]:
    """The documents' text up to `n_bytes` UTF-8 bytes in all (None: all of it): whole documents,
    then the next one cut at a character boundary, the rest dropped."""
    if n_bytes is None:
        return list(docs)
    out, left = [], n_bytes
    for doc in docs:
        raw = doc.text.encode("utf-8")
        if len(raw) >= left:
            return [*out, Document(doc.id, raw[:left].decode("utf-8", errors="ignore"))]
        out.append(doc)
        left -= len(raw)
    return out


def prepare_train_docs(docs: Sequence[Document]) -> list[Document]:
    """The documents `octlm prepare --val-docs 1` puts in its train split (its own rule)."""
    keys = KeyTable()
    for doc in docs:
        keys.add(doc.id, len(doc.text))
    labels = plan_split(keys, PREPARE_SPLIT).labels
    return [d for d, label in zip(docs, labels, strict=True) if label == TRAIN]


def windows(n_tokens: int, context: int) -> list[tuple[int, int]]:
    """Non-overlapping (start, length) input windows over a stream of `n_tokens`: inputs
    [start, start + length), targets shifted by one; every token but the first is a target once."""
    return [(s, min(context, n_tokens - 1 - s)) for s in range(0, n_tokens - 1, context)]


def stream_nats(
    logits_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    stream: np.ndarray,
    context: int,
    batch: int = SCORE_BATCH,
) -> tuple[float, int]:
    """Total negative log-likelihood (nats, float64 sum of fp32 cross-entropies) of `stream`
    under a model, and the number of tokens predicted. `logits_of(x, y)` gives (B, T, V)
    logits for inputs x (B, T); y is passed for models that want targets to give them all."""
    data = torch.from_numpy(np.asarray(stream, dtype=np.int64))
    spans = windows(len(data), context)
    total, count = 0.0, 0
    groups: dict[int, list[int]] = {}
    for start, length in spans:  # full windows batched together, the last short one alone
        groups.setdefault(length, []).append(start)
    with torch.no_grad():
        for length, starts in groups.items():
            for i in range(0, len(starts), batch):
                chunk = starts[i : i + batch]
                x = torch.stack([data[s : s + length] for s in chunk])
                y = torch.stack([data[s + 1 : s + 1 + length] for s in chunk])
                logits = logits_of(x, y).float()
                nats = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
                total += float(nats)
                count += y.numel()
    return total, count


def bits_per_byte(nats: float, n_bytes: int) -> float:
    return nats / LN2 / n_bytes


def run_logged(what: str, cmd: list[str], cwd: Path, env: dict) -> tuple[str, float]:
    """Run `cmd`; its output and wall seconds. A failure raises BenchError naming `what` and
    the output's last line (the whole output is kept in `cwd/failed.log`)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        last = lines[-1] if lines else "no output"
        log = cwd / "failed.log"
        log.write_text(f"{shlex.join(cmd)}\n\n{text}")
        raise BenchError(f"{what} failed (exit {proc.returncode}): {last} (output: {log})")
    return text, wall


@dataclass
class Data:
    digest: str
    octlm: Path
    """The prepared dataset (`octlm prepare`) of the training documents."""
    tokenizer_fingerprint: str
    heldout_ids: list[str]
    heldout_bytes: int
    bpe_heldout: np.ndarray
    bpe_dataset: str = ""
    """nanoGPT's dataset name (a folder under `work/data`), when nanoGPT runs."""
    char_dataset: str = ""
    char_vocab: int = 0
    char_heldout: np.ndarray | None = None
    char_unseen: int = 0
    train_docs: int = 0
    train_bytes: int = 0
    train_tokens: int = 0
    char_train_tokens: int = 0


def digest_of(docs: Sequence[Document]) -> str:
    h = hashlib.sha256(f"{DATA_RECIPE} vocab {VOCAB} context {Shape().context}\n".encode())
    for doc in docs:
        h.update(json.dumps([doc.id, doc.text]).encode("utf-8") + b"\n")
    return h.hexdigest()[:12]


def prepare_data(
    work: Path,
    modes: Sequence[str],
    nanogpt: bool,
    env: dict,
    threads: int,
    score_bytes: int | None = None,
) -> Data:
    """The prepared training data for every side (cached under `work`) and the held-out streams
    (the first `score_bytes` of the held-out text, or all of it)."""
    docs = embedded_documents()
    train, held = split_heldout(docs)
    heldout = truncate_docs(held, score_bytes)
    digest = digest_of(train)
    dataset = prepare_octlm(work / f"data-{digest}", train, env, threads)
    ds = ShardDataset.open(dataset)
    trained = prepare_train_docs(train)
    train_bytes = sum(len(d.text.encode("utf-8")) for d in trained)
    if train_bytes != ds.manifest["splits"]["train"]["text_bytes"]:
        raise BenchError(
            f"{dataset}'s train split holds {ds.manifest['splits']['train']['text_bytes']} "
            f"bytes, the bench expects {train_bytes}: remove the folder and run again"
        )
    tokenizer = dataset_tokenizer(ds)
    bpe_heldout = np.concatenate(
        [
            np.asarray(ids, dtype=np.int64)
            for ids in tokenizer.encode_batch([d.text for d in heldout])
        ]
    )
    data = Data(
        digest=digest,
        octlm=dataset,
        tokenizer_fingerprint=tokenizer.fingerprint,
        heldout_ids=[d.id for d in heldout],
        heldout_bytes=sum(len(d.text.encode("utf-8")) for d in heldout),
        bpe_heldout=bpe_heldout,
        train_docs=len(trained),
        train_bytes=train_bytes,
        train_tokens=len(ds.train),
    )
    if nanogpt and "bpe" in modes:
        write_nanogpt_bpe(work, data, ds)
    if nanogpt and "char" in modes:
        write_nanogpt_char(work, data, train, trained, heldout)
    return data


def prepare_octlm(folder: Path, train: Sequence[Document], env: dict, threads: int) -> Path:
    """`octlm prepare` of the training documents into `folder/octlm`, unless already there."""
    dataset = folder / "octlm"
    if (dataset / "manifest.json").is_file():
        return dataset
    folder.mkdir(parents=True, exist_ok=True)
    jsonl = folder / "train.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for doc in train:
            f.write(json.dumps({"id": doc.id, "text": doc.text}) + "\n")
    cmd = [sys.executable, "-m", "octlm", "prepare", str(jsonl), "--out", str(dataset)]
    cmd += ["--vocab-size", str(VOCAB), "--val-docs", str(PREPARE_SPLIT.val_docs)]
    cmd += ["--context", str(Shape().context), "--workers", str(threads), "--force"]
    print(f"preparing the training documents (vocabulary {VOCAB}) in {dataset}", flush=True)
    run_logged("octlm prepare", cmd, folder, env)
    return dataset


def write_nanogpt_bpe(work: Path, data: Data, ds: ShardDataset) -> None:
    """nanoGPT's dataset of octlm's token stream (its train and validation splits)."""
    data.bpe_dataset = f"octlm_bpe_{data.digest}"
    out = work / "data" / data.bpe_dataset
    if not (out / "meta.pkl").is_file():
        out.mkdir(parents=True, exist_ok=True)
        for split, stream in (("train", ds.train), ("val", ds.val)):
            stream.window(0, len(stream)).astype(np.uint16).tofile(out / f"{split}.bin")
        write_meta(out, {"vocab_size": VOCAB})


def write_nanogpt_char(
    work: Path,
    data: Data,
    train: Sequence[Document],
    trained: Sequence[Document],
    heldout: Sequence[Document],
) -> None:
    """nanoGPT's character-level dataset of the documents prepare trains on (`trained`; the
    one it validates on, of `train`, is its val.bin), and the held-out characters."""
    data.char_dataset = f"octlm_char_{data.digest}"
    text = "\n\n".join(d.text for d in trained)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data.char_vocab = len(chars)
    data.char_train_tokens = len(text)
    out = work / "data" / data.char_dataset
    if not (out / "meta.pkl").is_file():
        out.mkdir(parents=True, exist_ok=True)
        val = "\n\n".join(d.text for d in train if d not in trained)
        for split, part in (("train", text), ("val", val)):
            char_ids(part, stoi)[0].astype(np.uint16).tofile(out / f"{split}.bin")
        write_meta(out, {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi})
    heldout_text = "\n\n".join(d.text for d in heldout)
    data.char_heldout, data.char_unseen = char_ids(heldout_text, stoi)


def char_ids(text: str, stoi: dict[str, int]) -> tuple[np.ndarray, int]:
    """Character ids; a character `stoi` lacks becomes id 0. Returns the ids and how many."""
    ids = np.fromiter((stoi.get(c, -1) for c in text), dtype=np.int64, count=len(text))
    unseen = int((ids < 0).sum())
    ids[ids < 0] = 0
    return ids, unseen


def write_meta(folder: Path, meta: dict) -> None:
    # nanoGPT's train.py reads its vocabulary size from this pickle: its format, written here.
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
