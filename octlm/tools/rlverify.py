"""`octlm rl ... --verify-split K`: prove an RL run's exact resume on the user's own settings,
model and machine, as `octlm verify-resume` does for training: one straight run and, for each
split K, a run stopped at K and resumed, each in its own process. A split run is identical when
its final weights hash, its optimizer tensors' hash and every step's and held-out evaluation's
numbers (rewards, loss, gradient norm, the rollouts' hash, pass@k) equal the straight run's."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from octlm.errors import OctlmError
from octlm.hashing import weights_sha256
from octlm.rl.settings import RLConfig
from octlm.runlog.reader import LOG_NAME, read_log
from octlm.tools.subrun import last_line
from octlm.tools.verify import RunSummary
from octlm.trainer import checkpoint as ckpt

PER_LAUNCH = ("source", "out", "resume", "stop_at", "progress")
TIMINGS = ("dt", "rollout_s", "update_s", "tok_per_s", "elapsed")
"""A step record's wall-clock fields: never part of the bits."""


def rl_argv(cfg: RLConfig, out: Path, *flags: str) -> list[str]:
    """The command line of one run of `cfg`'s settings into `out`, `flags` added."""
    argv = [sys.executable, "-m", "octlm", "rl", str(Path(cfg.source).resolve())]
    for f in fields(RLConfig):
        value = getattr(cfg, f.name)
        if f.name in PER_LAUNCH or value is None:
            continue
        argv += [f"--{f.name.replace('_', '-')}", str(value)]
    return [*argv, "--out", str(out), "--no-progress", *flags]


def _run(cfg: RLConfig, out: Path, *flags: str) -> None:
    proc = subprocess.run(rl_argv(cfg, out, *flags), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise OctlmError(
            f"RL run {out.name} failed: {last_line(proc.stderr)}", "fix the settings and rerun"
        )


def numbers(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Each step's and evaluation's record without its timings, by (type, step)."""
    return {
        (r["type"], r["step"]): {k: v for k, v in r.items() if k not in TIMINGS}
        for r in records
        if r.get("type") in ("step", "val")
    }


def _summarise(run: Path) -> tuple[str, str, dict[tuple[str, int], dict[str, Any]]]:
    records = read_log(run)
    ends = [r for r in records if r["type"] == "end" and isinstance(r.get("weights_sha256"), str)]
    if not ends:
        raise OctlmError(f"RL run {run.name} did not finish", f"see its {LOG_NAME} (use --keep)")
    path, checksum = ckpt.find_checkpoint(run)
    _, tensors = ckpt.load_checkpoint(path, checksum)
    optimizer = weights_sha256(ckpt.optimizer_tensors(tensors))
    return ends[-1]["weights_sha256"], optimizer, numbers(records)


def _compare(k: int, ref: RunSummary, ref_numbers: dict, run: Path) -> RunSummary:
    w, o, got = _summarise(run)
    after = [key for key in got if key[0] == "step" and key[1] > k]
    parted = sorted(
        key[1] for key in set(ref_numbers) | set(got) if ref_numbers.get(key) != got.get(key)
    )
    same = w == ref.weights_sha256 and o == ref.optimizer_sha256 and not parted
    if same:
        verdict = "identical"
    elif parted:
        verdict = f"differs from step {parted[0]}"
    else:
        verdict = "differs: final weights or optimizer state"
    return RunSummary(f"split@{k}", k, w, o, len(after), verdict, same)


def verify_rl(
    cfg: RLConfig,
    splits: list[int],
    *,
    keep: bool = False,
    workdir: Path | None = None,
    echo: Callable[[str], None] = print,
) -> tuple[list[RunSummary], Path | None]:
    """Run and compare; the summaries (straight first) and the kept folder, if any."""
    bad = [k for k in splits if not 0 < k < cfg.steps]
    if bad or not splits:
        raise OctlmError(
            f"split(s) {bad or splits} must lie strictly between 0 and --steps {cfg.steps}",
            "pass --verify-split K with 0 < K < --steps",
        )
    root = Path(tempfile.mkdtemp(prefix="octlm-verify-rl-", dir=workdir))
    try:
        echo(f"straight RL run of {cfg.steps} steps ...")
        _run(cfg, root / "straight")
        w, o, ref_numbers = _summarise(root / "straight")
        summaries = [RunSummary("straight", None, w, o, 0, "reference", True)]
        for k in sorted(set(splits)):
            echo(f"RL run stopped at {k} and resumed ...")
            out = root / f"split-{k}"
            _run(cfg, out, "--stop-at", str(k))
            _run(cfg, out, "--resume")
            summaries.append(_compare(k, summaries[0], ref_numbers, out))
    except BaseException:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
        raise
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return summaries, (root if keep else None)
