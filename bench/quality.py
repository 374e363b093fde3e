"""octlm against nanoGPT's `train.py` on held-out bits per byte, at an equal wall-clock budget.

    .venv/bin/python -m bench.quality --nanogpt PATH [--mode bpe|char|both] [--budget 240]
        [--rounds 3] [--octlm NAME=FLAGS ...] [--work DIR] [--json FILE]

    # the ablation, octlm alone (no --nanogpt: only the octlm variants run)
    .venv/bin/python -m bench.quality --octlm adamw= --octlm muon="--optimizer muon"

    # a check that it all runs, in a few minutes (numbers of no meaning)
    .venv/bin/python -m bench.quality --nanogpt PATH --budget 5 --rounds 1 --probe-steps 5 \
        --score-bytes 20000

PATH is a checkout of github.com/karpathy/nanoGPT, run as it is: its own `train.py` in a
subprocess (working directory in the scratch folder, so the checkout is never written to) and
its own `model.py` imported to read back the `ckpt.pt` it saves. Nothing of it is copied here.

The text. Both sides train on the same documents of the embedded corpus (42 works of
Shakespeare) and are scored on the same held-out ones, which neither side ever trains on:
`split_heldout` holds out the last documents in corpus order, whole, until they hold at least
10% of the characters (troilus_and_cressida, twelfth_night, two_gentlemen_of_verona,
winters_tale: 10.4%). The other documents are written as JSON lines and prepared with
`octlm prepare --vocab-size 4096 --val-docs 1 --context 256`: octlm's own byte-level BPE trained
on them alone, and its own encoding. `prepare` always keeps a validation split; `--val-docs 1`
makes it the one document its rule picks (the smallest sha256 of the id: as_you_like_it), and
that document is trained on by neither side, so both train on exactly the prepared train split.
The prepared data is cached in the work folder under a digest of its inputs and recipe.

The two modes (`--mode both` runs both):

- bpe (the primary comparison): nanoGPT is fed octlm's token stream. The prepared train split's
  tokens become nanoGPT's `data/<name>/train.bin` (uint16), the validation split its `val.bin`,
  and `meta.pkl` says vocab_size 4096 (nanoGPT's format, written here as `vs_nanogpt` does).
- char: nanoGPT's classic character-level setup on the same training documents (joined with
  blank lines), its vocabulary the characters they hold.

octlm's side is the same in both modes (it trains on its BPE data); each `--octlm NAME=FLAGS`
is one octlm variant, the flags (shell-split) appended to its `octlm train` command, so they
override the bench's own (the default: one variant `octlm` with no extra flags).

The model class for every side: 6 layers, width 384, 6 heads, context 256, 8 sequences a step,
no accumulation, fp32, CPU, no compile, dropout 0, `--threads` (2) OpenMP threads. octlm runs
`octlm train --model small --n-layers 6 --d-model 384 --n-heads 6 --context 256 --micro-batch 8
--accum 1 --dtype fp32 --steps N --warmup W --val-every 0 --ckpt-every 0 --val-batches 1`, its
schedule otherwise at its defaults (lr 1.5e-3, cosine to 0.1 of the peak); W is 5% of N, the
share its default run has (20 warmup steps of 440), so the schedule keeps its shape at any
budget. nanoGPT runs its `train.py` with its own small-model recipe (config/
train_shakespeare_char.py: lr 1e-3, min_lr 1e-4, beta2 0.99, weight_decay 0.1, warmup 100),
passed as overrides so that the shape stays ours. Its warmup is 100 iterations, but never a
larger share of the run than octlm's 5%: at 1-2 s a step on 2 cores the default budget is a
few hundred steps, of which 100 would be most, and the comparison would measure the warmup
(from 2000 steps on, the recipe's 100 stands). `max_iters = lr_decay_iters = eval_interval = N`
and `always_save_checkpoint=True`: it evaluates (eval_iters 1) and saves `ckpt.pt` at iteration
N, holding the weights after N steps (it then trains one more step, which is not kept and not
counted).

Equal wall clock. Before each training run its side is probed: 15 steps (`--probe-steps`), the
median step time of all but the first 3, and the extra time those first 3 took over it. The
run's steps are then sized so that its training loop ends at `--budget` seconds (240):
N = (budget - extra) / median. From the second round on, the budget in that sum is divided by
the side's calibration: the median, over its earlier rounds, of the training seconds it took
over the seconds its probe predicted. A short probe can misjudge one trainer's pace the same
way every round (on a quiet 2-core machine nanoGPT's probe was 3-8% slower than its runs, so
it trained 221-235 s of the 240 while octlm trained 241-245 s): the calibration takes that
bias out of every round after the first.
The probe is repeated in every round, right before that side's run: the 2 shared cores drift by
±15%, and a fresh probe sizes each run for the speed the machine has at that moment (the rounds
then differ by their step counts, which is the noise an equal-wall-clock comparison has; the
seeds are fixed, nanoGPT's in its train.py). Training seconds are each trainer's own clock of its
loop: octlm's last `elapsed`, nanoGPT's per-iteration times of iterations 0..N-1.

Scoring, by the bench, in fp32 under torch.no_grad, the same for every side of a mode: the
held-out documents as one stream (bpe: each `<|bos|> text <|eos|>`, encoded with the dataset's
tokenizer; char: joined with blank lines, a character unseen in training mapped to id 0 and
counted), cut into non-overlapping windows of 256 inputs (+1 target shift), every token but the
first predicted once, from logits over all positions. Bits per byte is the total negative
log-likelihood in bits over the held-out documents' UTF-8 bytes (their text alone: the document
boundaries' tokens or blank lines are scored but add no bytes, the same denominator in both
modes). octlm's model is read with `octlm.load(run)`, nanoGPT's `ckpt.pt` with its own GPT.
Scoring reads every held-out token: on 2 cores about 0.5 ms a token, so some 100 s per run for
BPE (182k tokens) and 190 s for characters (525k), beside the 240 s of training. `--score-bytes
N` scores only the first N bytes of the held-out text (whole documents, then one cut short):
for quick checks, or to trade some precision for time (every side of a mode reads the same
text, so the paired ratios lose less than the bpb values do).

Rounds (`--rounds`, 3) run every side once, the order rotated a place each round. Printed: per
round each side's steps, training seconds and held-out bpb; then per side the median bpb, its
min-max over rounds, steps and ms/step; each octlm variant's median bpb over nanoGPT's (bpe and,
with char, char), and each later variant's over the first variant's, with the median of the
per-round paired ratios. `--json FILE` writes every
number. A failed subprocess ends the bench with a one-line message and a non-zero exit.

Everything is written under `--work` (default: a temporary folder, removed at the end unless
the bench fails: the failed command's output is then in its `failed.log`; with a folder given,
the prepared data stays there for the next run). Run folders and checkpoints are
removed once scored unless `--keep-runs`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import pickle
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import octlm
from bench.vs_nanogpt import ITER_LINE, Shape, nanogpt_model
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
PROBE_STEPS = 15
PROBE_DROP = 3
"""A probe's first steps, left out of its median (first-call set-up, nanoGPT's first evaluation)."""
OCTLM_WARMUP_SHARE = 0.05
PROBE_RUN_STEPS = 100_000
"""octlm's probe: a run of this many steps stopped at --probe-steps (`--stop-at`)."""
CALIBRATION_RANGE = (0.8, 1.25)
"""The bounds of a side's calibration (`calibration`)."""
SEED = 1337
"""octlm's default seed; with --vary-seed round r trains with SEED + r."""
NANOGPT_RECIPE = {  # nanoGPT's config/train_shakespeare_char.py
    "learning_rate": 1e-3,
    "min_lr": 1e-4,
    "beta2": 0.99,
    "weight_decay": 0.1,
}
NANOGPT_WARMUP = 100
SCORE_BATCH = 8
LN2 = math.log(2.0)
NANOGPT_SIDES = {"bpe": "nanoGPT-bpe", "char": "nanoGPT-char"}


class BenchError(Exception):
    """Ends the bench with its one-line message."""


# -- the pure parts ------------------------------------------------------------------------------


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


def parse_variants(specs: Sequence[str] | None) -> dict[str, list[str]]:
    """`--octlm NAME=FLAGS` values as {name: shell-split flags}; none given: `octlm=`."""
    variants: dict[str, list[str]] = {}
    for spec in specs or ["octlm="]:
        name, sep, flags = spec.partition("=")
        name = name.strip()
        if not sep or not name or name.startswith("nanoGPT") or any(c.isspace() for c in name):
            raise BenchError(
                f"--octlm {spec!r}: write NAME=FLAGS, e.g. muon='--optimizer muon' (a name "
                "without spaces, not starting with nanoGPT)"
            )
        if name in variants:
            raise BenchError(f"--octlm {spec!r}: the name {name!r} is given twice")
        try:
            variants[name] = shlex.split(flags)
        except ValueError as exc:
            raise BenchError(f"--octlm {spec!r}: {exc}") from None
    return variants


def probe_estimate(times_ms: Sequence[float], drop: int = PROBE_DROP) -> tuple[float, float]:
    """From a probe's per-step times (ms, from its first step): the median step time of all but
    the first `drop`, and the seconds those first steps took beyond it (at least 0)."""
    if len(times_ms) <= drop:
        raise BenchError(f"the probe timed {len(times_ms)} steps, more than {drop} are needed")
    median = statistics.median(times_ms[drop:])
    extra = max(0.0, sum(times_ms[:drop]) - drop * median) / 1e3
    return median, extra


def size_steps(budget_s: float, step_ms: float, extra_s: float = 0.0) -> int:
    """The steps whose training ends at `budget_s`: `extra_s` (the first steps' set-up) plus
    steps x `step_ms`; at least 1."""
    return max(1, int((budget_s - extra_s) * 1e3 / step_ms))


def calibration(earlier: Sequence[dict]) -> float:
    """How a side's earlier rounds' training seconds compared with what their probes predicted
    (the median of train_s / (extra + steps x probe ms)); 1 before any round. A probe of a few
    steps can be biased for one trainer (nanoGPT's first steps are a few percent slower than its
    run's average here), and that bias would take a share of the budget from one side only."""
    ratios = [
        r["train_s"] / (r["probe_extra_s"] + r["steps"] * r["probe_ms_per_step"] / 1e3)
        for r in earlier
        if math.isfinite(r["probe_ms_per_step"])
    ]
    # Bounded: beyond a quarter the probe is not biased but wrong (a tiny budget whose first
    # steps' set-up dominates, a load spike), and an earlier round's accident would size a run
    # far off the budget.
    return (
        min(max(statistics.median(ratios), CALIBRATION_RANGE[0]), CALIBRATION_RANGE[1])
        if ratios
        else 1.0
    )


def octlm_warmup(steps: int) -> int:
    """octlm's warmup: the share of the run its default has (20 steps of 440), at least 1."""
    return max(1, round(OCTLM_WARMUP_SHARE * steps))


def nanogpt_warmup(steps: int) -> int:
    """nanoGPT's recipe's 100 warmup iterations, but no larger a share of the run than octlm's
    warmup has (the cap binds under 2000 steps; at a few hundred, 100 would be most of the run).
    Always below `steps`: its cosine divides by lr_decay_iters - warmup_iters."""
    return min(NANOGPT_WARMUP, round(OCTLM_WARMUP_SHARE * steps))


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


# -- data ----------------------------------------------------------------------------------------


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
    folder = work / f"data-{digest}"
    dataset = folder / "octlm"
    if not (dataset / "manifest.json").is_file():
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
    if not nanogpt:
        return data
    if "bpe" in modes:
        data.bpe_dataset = f"octlm_bpe_{digest}"
        out = work / "data" / data.bpe_dataset
        if not (out / "meta.pkl").is_file():
            out.mkdir(parents=True, exist_ok=True)
            for split, stream in (("train", ds.train), ("val", ds.val)):
                stream.window(0, len(stream)).astype(np.uint16).tofile(out / f"{split}.bin")
            write_meta(out, {"vocab_size": VOCAB})
    if "char" in modes:
        data.char_dataset = f"octlm_char_{digest}"
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
            write_meta(
                out, {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
            )
        heldout_text = "\n\n".join(d.text for d in heldout)
        data.char_heldout, data.char_unseen = char_ids(heldout_text, stoi)
    return data


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


# -- running the trainers ------------------------------------------------------------------------


def octlm_train_args(
    shape: Shape,
    data: Path,
    steps: int,
    warmup: int,
    out: Path,
    flags: Sequence[str],
    stop_at: int | None = None,
) -> list[str]:
    """`octlm train` at the bench's shape (what follows `octlm` on its command line); a
    variant's `flags` last, so that they override the bench's own."""
    opts = {
        "--model": "small",
        "--n-layers": shape.layers,
        "--d-model": shape.width,
        "--n-heads": shape.heads,
        "--context": shape.context,
        "--micro-batch": shape.batch,
        "--accum": 1,
        "--dtype": "fp32",
        "--dropout": 0,
        "--data": data,
        "--steps": steps,
        "--warmup": warmup,
        "--val-every": 0,
        "--val-batches": 1,
        "--ckpt-every": 0,
        "--out": out,
    }
    if stop_at is not None:
        opts["--stop-at"] = stop_at
    args = ["train", *(x for k, v in opts.items() for x in (k, str(v)))]
    return [*args, "--no-compile", "--no-progress", "--no-resume", *flags]


def check_variants(variants: dict[str, list[str]], data: Path, work: Path) -> None:
    """Each variant's command through `octlm train --print-config` (its parser and its
    config checks, nothing built), in this process, before anything runs: a flag this octlm
    lacks or a value it refuses ends the bench now rather than rounds later."""
    from octlm.cli.main import main as octlm_main

    for name, flags in variants.items():
        argv = octlm_train_args(Shape(), data, 1000, 50, work / "check", flags)
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = octlm_main([*argv, "--print-config"])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
        if code:
            lines = err.getvalue().strip().splitlines() or [f"exit {code}"]
            raise BenchError(f"octlm variant {name!r}: {lines[-1]}")


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
class Side:
    name: str
    mode: str
    """bpe or char: which held-out stream scores it (octlm variants: bpe)."""
    flags: list[str] | None = None
    """An octlm variant's extra flags; None for nanoGPT."""
    rounds: list[dict] = field(default_factory=list)

    @property
    def is_octlm(self) -> bool:
        return self.flags is not None


@dataclass
class Bench:
    args: argparse.Namespace
    work: Path
    data: Data
    env: dict
    checkout: Path | None
    shape: Shape = field(default_factory=Shape)

    def octlm_run(
        self,
        side: Side,
        steps: int,
        warmup: int,
        out: Path,
        stop_at: int | None = None,
        seed: int | None = None,
    ) -> tuple[list, float, dict]:
        """Train; the log's step records, the process's wall seconds and the run's config (as
        its log's header has it: a variant's flags applied, after `seed` if one is given)."""
        if out.exists():
            shutil.rmtree(out)
        flags = ([] if seed is None else ["--seed", str(seed)]) + (side.flags or [])
        args = octlm_train_args(self.shape, self.data.octlm, steps, warmup, out, flags, stop_at)
        cmd = [sys.executable, "-m", "octlm", *args]
        _, wall = run_logged(f"octlm variant {side.name!r}", cmd, self.work, self.env)
        records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        header = next(r for r in records if r["type"] == "header")
        return [r for r in records if r["type"] == "step"], wall, header["config"]

    def nanogpt_cmd(self, dataset: str, out: Path, steps: int, final: bool) -> list[str]:
        s = self.shape
        cmd = [
            sys.executable,
            str(self.checkout / "train.py"),
            f"--dataset={dataset}",
            "--device=cpu",
            "--compile=False",
            "--dtype=float32",
            f"--n_layer={s.layers}",
            f"--n_head={s.heads}",
            f"--n_embd={s.width}",
            f"--block_size={s.context}",
            f"--batch_size={s.batch}",
            "--gradient_accumulation_steps=1",
            "--dropout=0.0",
            "--bias=False",
            *(f"--{k}={v}" for k, v in NANOGPT_RECIPE.items()),
            f"--warmup_iters={nanogpt_warmup(steps)}",
            f"--max_iters={steps}",
            f"--lr_decay_iters={steps}",
            "--eval_iters=1",
            "--log_interval=1",
            f"--out_dir={out}",
        ]
        if final:  # evaluate and save at iteration `steps`: the weights after `steps` steps
            return [*cmd, f"--eval_interval={steps}", "--always_save_checkpoint=True"]
        return [*cmd, "--eval_interval=1000000", "--always_save_checkpoint=False"]

    def nanogpt_run(self, side: Side, steps: int, out: Path, final: bool) -> tuple[list, float]:
        """Train; its per-iteration times (ms) and the process's wall seconds."""
        if out.exists():
            shutil.rmtree(out)
        dataset = self.data.bpe_dataset if side.mode == "bpe" else self.data.char_dataset
        cmd = self.nanogpt_cmd(dataset, out, steps, final)
        text, wall = run_logged(side.name, cmd, self.work, self.env)
        times = {
            int(m.group(1)): float(m.group(2)) for m in map(ITER_LINE.match, text.splitlines()) if m
        }
        return [times[i] for i in sorted(times)], wall

    def probe(self, side: Side, out: Path) -> tuple[float, float]:
        if side.is_octlm:
            # A long run stopped early: the variant's own flags (a --warmup of its own, say)
            # fit it as they fit the real one.
            steps = PROBE_RUN_STEPS
            records, _, _ = self.octlm_run(
                side, steps, octlm_warmup(steps), out, self.args.probe_steps
            )
            elapsed = [0.0] + [r["elapsed"] for r in records]
            times = [1e3 * (b - a) for a, b in zip(elapsed, elapsed[1:], strict=False)]
        else:
            times, _ = self.nanogpt_run(side, self.args.probe_steps - 1, out, final=False)
        if len(times) != self.args.probe_steps:
            raise BenchError(
                f"{side.name}: the probe logged {len(times)} of {self.args.probe_steps} steps"
            )
        shutil.rmtree(out)
        return probe_estimate(times)

    def round(self, side: Side, r: int) -> dict:
        out = self.work / "runs" / f"r{r}-{side.name}"
        if self.args.steps is not None:  # equal steps: no probe, the same count for every side
            probe_ms, extra_s, steps = math.nan, math.nan, self.args.steps
            calib = math.nan
        else:
            probe_ms, extra_s = self.probe(side, out)
            calib = calibration(side.rounds)
            steps = size_steps(self.args.budget / calib, probe_ms, extra_s)
        if side.is_octlm:
            seed = SEED + r if self.args.vary_seed else None
            records, wall, config = self.octlm_run(side, steps, octlm_warmup(steps), out, seed=seed)
            warmup = config["warmup"]  # the bench's, or a variant's own
            if not records or records[-1]["step"] != steps:
                raise BenchError(f"{side.name}: the run did not reach step {steps}")
            train_s = records[-1]["elapsed"]
            loaded = octlm.load(out)
            if loaded.tokenizer.fingerprint != self.data.tokenizer_fingerprint:
                raise BenchError(f"{side.name}: the run's tokenizer is not the dataset's")
            model = loaded.model.float().eval()

            def logits_of(x, y):
                return model(x)
        else:
            warmup = nanogpt_warmup(steps)
            times, wall = self.nanogpt_run(side, steps, out, final=True)
            if len(times) < steps:
                raise BenchError(f"{side.name}: the run logged {len(times)} of {steps} steps")
            train_s = sum(times[:steps]) / 1e3
            model = self.nanogpt_checkpoint(out / "ckpt.pt", steps)

            def logits_of(x, y):
                return model(x, y)[0]  # with targets, nanoGPT's GPT gives every position's logits

        stream = self.data.bpe_heldout if side.mode == "bpe" else self.data.char_heldout
        t0 = time.perf_counter()
        nats, predicted = stream_nats(logits_of, stream, self.shape.context)
        score_s = time.perf_counter() - t0
        if not self.args.keep_runs:
            shutil.rmtree(out)
        return {
            "round": r,
            "steps": steps,
            "warmup": warmup,
            "probe_ms_per_step": probe_ms,
            "probe_extra_s": extra_s,
            "calibration": calib,
            "train_s": train_s,
            "ms_per_step": 1e3 * train_s / steps,
            "process_s": wall,
            "heldout_tokens_predicted": predicted,
            "heldout_nll_bits": nats / LN2,
            "bpb": bits_per_byte(nats, self.data.heldout_bytes),
            "score_s": score_s,
        }

    def nanogpt_checkpoint(self, path: Path, steps: int) -> torch.nn.Module:
        if not path.is_file():
            raise BenchError(f"nanoGPT wrote no {path}")
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        if ckpt["iter_num"] != steps:
            raise BenchError(f"{path} holds iteration {ckpt['iter_num']}, not {steps}")
        model = nanogpt_model(self.checkout, self.shape, ckpt["model_args"]["vocab_size"])
        prefix = "_orig_mod."
        state = {k.removeprefix(prefix): v for k, v in ckpt["model"].items()}
        model.load_state_dict(state)
        return model.float().eval()


# -- the report ----------------------------------------------------------------------------------


def summary(sides: Sequence[Side]) -> dict:
    per_side = {}
    for side in sides:
        rs = side.rounds
        bpb = [x["bpb"] for x in rs]
        per_side[side.name] = {
            "mode": side.mode,
            "flags": side.flags,
            "median_bpb": statistics.median(bpb),
            "min_bpb": min(bpb),
            "max_bpb": max(bpb),
            "median_steps": statistics.median(x["steps"] for x in rs),
            "median_ms_per_step": statistics.median(x["ms_per_step"] for x in rs),
            "median_train_s": statistics.median(x["train_s"] for x in rs),
        }
    ratios = {}
    octlm_sides = [side for side in sides if side.is_octlm]
    for i, side in enumerate(octlm_sides):
        # nanoGPT's sides; for the later variants of an ablation, also the first variant
        refs = [ref for ref in sides if not ref.is_octlm] + octlm_sides[: min(i, 1)]
        for ref in refs:
            paired = [a["bpb"] / b["bpb"] for a, b in zip(side.rounds, ref.rounds, strict=True)]
            ratios[f"{side.name} / {ref.name}"] = {
                "ratio_of_medians": per_side[side.name]["median_bpb"]
                / per_side[ref.name]["median_bpb"],
                "paired_median": statistics.median(paired),
                "paired": paired,
            }
    return {"sides": per_side, "ratios": ratios}


def print_summary(result: dict) -> None:
    print()
    print("| side | held-out bpb (median) | min - max | steps | ms/step | train s |")
    print("|---|---:|---|---:|---:|---:|")
    for name, s in result["sides"].items():
        print(
            f"| {name} | {s['median_bpb']:.4f} | {s['min_bpb']:.4f} - {s['max_bpb']:.4f} | "
            f"{s['median_steps']:.0f} | {s['median_ms_per_step']:.1f} | "
            f"{s['median_train_s']:.1f} |"
        )
    if result["ratios"]:
        print()
    for name, r in result["ratios"].items():
        print(
            f"{name} bpb: {r['ratio_of_medians']:.4f} (ratio of medians), paired median "
            f"{r['paired_median']:.4f} (rounds: {', '.join(f'{x:.4f}' for x in r['paired'])})"
        )


def round_order(sides: list[Side], first: int, rounds: int) -> list[tuple[int, Side]]:
    """(round number, side) in the order they run: rounds `first` to `first + rounds - 1`, each
    side first in turn, so a later run of the bench with `--first-round` continues the rotation
    (and, with --vary-seed, the seeds) where an earlier one stopped."""
    order = []
    for n in range(first, first + rounds):
        shift = (n - 1) % len(sides)
        order += [(n, side) for side in sides[shift:] + sides[:shift]]
    return order


def run_bench(args: argparse.Namespace, work: Path) -> dict:
    variants = parse_variants(args.octlm)
    checkout = None
    if args.nanogpt is not None:
        checkout = args.nanogpt.resolve()
        if not (checkout / "train.py").is_file() or not (checkout / "model.py").is_file():
            raise BenchError(f"{checkout} has no train.py and model.py: pass a nanoGPT checkout")
    modes = ("bpe", "char") if args.mode == "both" else (args.mode,)
    octlm_root = str(Path(octlm.__file__).resolve().parents[1])  # the subprocesses' octlm
    path = os.pathsep.join(p for p in (octlm_root, os.environ.get("PYTHONPATH")) if p)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": path,
    }
    torch.set_num_threads(args.threads)
    data = prepare_data(work, modes, checkout is not None, env, args.threads, args.score_bytes)
    check_variants(variants, data.octlm, work)
    if checkout is not None:
        # train.py reads configurator.py from its working directory: the checkout's.
        link = work / "configurator.py"
        if not link.exists():
            link.symlink_to(checkout / "configurator.py")
    sides = [Side(name, "bpe", flags) for name, flags in variants.items()]
    if checkout is not None:
        sides += [Side(NANOGPT_SIDES[m], m) for m in modes]
    print(
        (f"{args.steps} steps per run" if args.steps else f"budget {args.budget:.0f} s per run")
        + f", {args.rounds} rounds, {args.threads} threads; "
        f"shape {Shape()}; held-out: {len(data.heldout_ids)} documents "
        f"({', '.join(data.heldout_ids)}), {data.heldout_bytes:,} bytes, "
        f"{len(data.bpe_heldout):,} BPE tokens"
        + (
            f", {len(data.char_heldout):,} characters ({data.char_unseen} unseen in training)"
            if data.char_heldout is not None
            else ""
        ),
        flush=True,
    )
    print(
        f"training: {data.train_docs} documents, {data.train_bytes:,} bytes, "
        f"{data.train_tokens:,} BPE tokens (vocabulary {VOCAB})"
        + (
            f", {data.char_train_tokens:,} characters (vocabulary {data.char_vocab})"
            if data.char_dataset
            else ""
        ),
        flush=True,
    )
    if checkout is None:
        print("no --nanogpt: octlm variants only", flush=True)
    bench = Bench(args, work, data, env, checkout)
    for n, side in round_order(sides, args.first_round, args.rounds):
        x = bench.round(side, n)
        side.rounds.append(x)
        print(
            f"round {n}: {side.name}: {x['steps']} steps (warmup {x['warmup']}, "
            f"probe {x['probe_ms_per_step']:.1f} ms/step, calibration "
            f"{x['calibration']:.3f}), trained {x['train_s']:.1f} s "
            f"({x['ms_per_step']:.1f} ms/step), "
            f"held-out {x['bpb']:.4f} bpb",
            flush=True,
        )
    result = summary(sides)
    print_summary(result)
    return {
        "config": {
            "budget_s": None if args.steps else args.budget,
            "steps": args.steps,
            "rounds": args.rounds,
            "first_round": args.first_round,
            "threads": args.threads,
            "mode": args.mode,
            "shape": vars(Shape()),
            "nanogpt": str(checkout) if checkout else None,
            "variants": variants,
            "octlm_warmup_share": OCTLM_WARMUP_SHARE,
            "nanogpt_recipe": {**NANOGPT_RECIPE, "warmup_iters": f"min({NANOGPT_WARMUP}, 5%)"},
            "probe_steps": args.probe_steps,
            "score_bytes": args.score_bytes,
            "probe_drop": PROBE_DROP,
        },
        "data": {
            "digest": data.digest,
            "heldout_documents": data.heldout_ids,
            "heldout_bytes": data.heldout_bytes,
            "heldout_bpe_tokens": len(data.bpe_heldout),
            "heldout_chars": None if data.char_heldout is None else len(data.char_heldout),
            "heldout_unseen_chars": data.char_unseen,
            "train_documents": data.train_docs,
            "train_bytes": data.train_bytes,
            "train_bpe_tokens": data.train_tokens,
            "char_vocab": data.char_vocab or None,
        },
        "rounds": {side.name: side.rounds for side in sides},
        **result,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout (omit: octlm variants only)")
    ap.add_argument("--mode", choices=("bpe", "char", "both"), default="both")
    ap.add_argument("--budget", type=float, default=240.0, help="training seconds per run")
    ap.add_argument(
        "--steps",
        type=int,
        help="equal steps instead of equal time: every run trains this many steps, no probe "
        "(for tuning: the scores then do not depend on the machine's load)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS for every side")
    ap.add_argument(
        "--octlm",
        action="append",
        metavar="NAME=FLAGS",
        help="an octlm variant: a name and extra `octlm train` flags (shell-split); repeat for "
        "several, e.g. --octlm adamw= --octlm muon='--optimizer muon'; default: octlm=",
    )
    ap.add_argument(
        "--probe-steps",
        type=int,
        default=PROBE_STEPS,
        help=f"steps of each probe, the first {PROBE_DROP} not timed (default {PROBE_STEPS})",
    )
    ap.add_argument(
        "--score-bytes",
        type=int,
        help="score only the first N bytes of the held-out text, for quick checks (default: all)",
    )
    ap.add_argument(
        "--vary-seed",
        action="store_true",
        help="octlm's seed (init and data order) is 1337 + the round, so the spread over rounds "
        "includes the seed's; nanoGPT's is fixed in its train.py",
    )
    ap.add_argument(
        "--first-round",
        type=int,
        default=1,
        help="number the rounds from this one (their seeds with --vary-seed, and the sides' "
        "order), to add rounds to an earlier run of the bench (default 1)",
    )
    ap.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    ap.add_argument("--keep-runs", action="store_true", help="keep run folders and checkpoints")
    ap.add_argument("--json", type=Path, help="write every number to this file")
    return ap


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.budget <= 0 or args.rounds < 1 or args.threads < 1 or args.first_round < 1:
        sys.exit("bench: --budget, --rounds, --threads and --first-round must be positive")
    if args.steps is not None and args.steps < 1:
        sys.exit("bench: --steps must be positive")
    if args.probe_steps <= PROBE_DROP:
        sys.exit(f"bench: --probe-steps must be more than {PROBE_DROP}")
    if args.score_bytes is not None and args.score_bytes < 2:
        sys.exit("bench: --score-bytes must be at least 2")
    # A SIGTERM (`timeout`, a job scheduler) unwinds like Ctrl-C: the running trainer is killed
    # with the bench rather than left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench: terminated"))
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        work = args.work.resolve()
    else:
        work = Path(tempfile.mkdtemp(prefix="octlm-quality-"))
    try:
        result = run_bench(args, work)
    except BenchError as exc:
        sys.exit(f"bench: {exc}")  # a temporary work folder stays, for the failed.log it names
    if args.work is None:
        shutil.rmtree(work)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
