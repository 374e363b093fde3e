"""bench/quality.py's trainers: each octlm variant's `octlm train` and nanoGPT's `train.py` in
a subprocess, probed, sized, run and scored one round at a time (`Bench.round`)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

import octlm
from bench.quality_data import LN2, BenchError, Data, bits_per_byte, run_logged, stream_nats
from bench.quality_probe import (
    PROBE_RUN_STEPS,
    calibration,
    nanogpt_warmup,
    octlm_warmup,
    probe_estimate,
    size_steps,
)
from bench.vs_nanogpt import ITER_LINE, Shape, nanogpt_model

SEED = 1337
"""octlm's default seed; with --vary-seed round r trains with SEED + r."""
NANOGPT_RECIPE = {  # nanoGPT's config/train_shakespeare_char.py
    "learning_rate": 1e-3,
    "min_lr": 1e-4,
    "beta2": 0.99,
    "weight_decay": 0.1,
}
NANOGPT_SIDES = {"bpe": "nanoGPT-bpe", "char": "nanoGPT-char"}


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


def nanogpt_checkout(args: argparse.Namespace) -> Path | None:
    """The nanoGPT checkout `--nanogpt` names (None without one), checked for its two files."""
    if args.nanogpt is None:
        return None
    checkout = args.nanogpt.resolve()
    if not (checkout / "train.py").is_file() or not (checkout / "model.py").is_file():
        raise BenchError(f"{checkout} has no train.py and model.py: pass a nanoGPT checkout")
    return checkout


def trainer_env(threads: int) -> dict:
    """The environment of every trainer's subprocess: this octlm first on its path."""
    octlm_root = str(Path(octlm.__file__).resolve().parents[1])  # the subprocesses' octlm
    path = os.pathsep.join(p for p in (octlm_root, os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": path,
    }
