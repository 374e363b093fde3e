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
import json
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from bench.quality_data import VOCAB, BenchError, Data, prepare_data
from bench.quality_probe import NANOGPT_WARMUP, OCTLM_WARMUP_SHARE, PROBE_DROP, PROBE_STEPS
from bench.quality_runs import (
    NANOGPT_RECIPE,
    NANOGPT_SIDES,
    Bench,
    Side,
    check_variants,
    nanogpt_checkout,
    parse_variants,
    trainer_env,
)
from bench.vs_nanogpt import Shape

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


def print_setup(args: argparse.Namespace, data: Data, nanogpt: bool) -> None:
    """What the rounds will train on and be scored on."""
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
    if not nanogpt:
        print("no --nanogpt: octlm variants only", flush=True)


def run_rounds(bench: Bench, sides: list[Side]) -> None:
    """Every side's rounds, in `round_order`, each printed as it ends."""
    args = bench.args
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


def run_bench(args: argparse.Namespace, work: Path) -> dict:
    variants = parse_variants(args.octlm)
    checkout = nanogpt_checkout(args)
    modes = ("bpe", "char") if args.mode == "both" else (args.mode,)
    env = trainer_env(args.threads)
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
    print_setup(args, data, checkout is not None)
    run_rounds(Bench(args, work, data, env, checkout), sides)
    result = summary(sides)
    print_summary(result)
    return {
        "config": run_settings(args, checkout, variants),
        "data": data_numbers(data),
        "rounds": {side.name: side.rounds for side in sides},
        **result,
    }


def run_settings(
    args: argparse.Namespace, checkout: Path | None, variants: dict[str, list[str]]
) -> dict:
    """The `config` part of `--json`: the bench's settings."""
    return {
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
    }


def data_numbers(data: Data) -> dict:
    """The `data` part of `--json`: what was trained on and scored."""
    return {
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
