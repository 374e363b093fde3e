"""`octlm verify-resume` (and `octlm rl --verify-split`): prove exact resume on the user's own
settings, model and machine, for a training run or an RL run.

One straight run of N steps and, for each split K, a run stopped at K and resumed, each in its
own process (`octlm train` or `octlm rl` on the same settings file). A split run is `identical`
when its final weights hash, its optimizer state hash and every loss and gradient norm after K
equal the straight run's; an RL run's every other step and held-out number too (rewards, the
rollouts' hash, pass@k: all but the timings). Training runs log per-tensor digests after every
step unless asked not to (`with_digests`): a split that parts then names the first step and
tensor that differ, as `octlm diff` does (about 0.2% of a step on `tiny`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octlm.config.rl import RLConfig
from octlm.config.train import TrainConfig
from octlm.errors import OctlmError, QuotedError
from octlm.hashing import weights_sha256
from octlm.runlog.reader import LOG_NAME, read_log
from octlm.tools import subrun
from octlm.tools.rundiff import diff_runs, tensor_verdict
from octlm.trainer import checkpoint as ckpt


@dataclass(frozen=True)
class RunSummary:
    name: str
    split: int | None
    weights_sha256: str
    optimizer_sha256: str
    steps_after_split: int
    verdict: str
    identical: bool


RL_TIMINGS = ("dt", "rollout_s", "update_s", "tok_per_s", "elapsed")
"""An RL step record's wall-clock fields: never part of the bits."""


def _run(cfg: TrainConfig | RLConfig, config: Path, out: Path, *flags: str) -> None:
    if isinstance(cfg, RLConfig):
        what, error = "RL run", subrun.launch("rl", config, out, *flags)
    else:
        what, error = "training run", subrun.train(config, out, *flags)
    if error is not None:
        raise QuotedError(f"{what} {out.name} failed: {error}", "fix the settings and rerun")


def rl_numbers(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Each RL step's and held-out score's record without its timings, by (type, step)."""
    return {
        (r["type"], r["step"]): {k: v for k, v in r.items() if k not in RL_TIMINGS}
        for r in records
        if r.get("type") in ("step", "val")
    }


def _rl_parting(ref: list[dict[str, Any]], run: list[dict[str, Any]]) -> int | None:
    """The first step whose RL numbers differ (None: none do)."""
    a, b = rl_numbers(ref), rl_numbers(run)
    return min((key[1] for key in set(a) | set(b) if a.get(key) != b.get(key)), default=None)


def _summarise(run: Path) -> tuple[str, str, list[dict[str, Any]]]:
    records = read_log(run)
    ends = [r for r in records if r["type"] == "end" and isinstance(r.get("weights_sha256"), str)]
    if not ends:
        raise OctlmError(f"run {run.name} did not finish", f"see its {LOG_NAME} (use --keep)")
    path, checksum = ckpt.find_checkpoint(run)
    _, tensors = ckpt.load_checkpoint(path, checksum)
    return ends[-1]["weights_sha256"], weights_sha256(ckpt.optimizer_tensors(tensors)), records


def with_digests(cfg: TrainConfig, tensors_given: bool, every_given: bool) -> TrainConfig:
    """The config verify-resume runs: --hash-tensors at every step unless the user set
    hash_tensors (on or off), and an own --hash-every kept."""
    if tensors_given:
        return cfg
    return cfg.replace(hash_tensors=True, hash_every=cfg.observe.hash_every if every_given else 1)


def _check_splits(steps: int, splits: list[int]) -> None:
    bad = [k for k in splits if not 0 < k < steps]
    if bad or not splits:
        raise OctlmError(
            f"split(s) {bad or splits} must lie strictly between 0 and steps={steps}",
            "pass --split K with 0 < K < --steps",
        )


def _compare(
    k: int, ref: RunSummary, run: Path, ref_records: list[dict[str, Any]], rl: bool
) -> RunSummary:
    w, o, records = _summarise(run)
    after = [r for r in records if r["type"] == "step" and r.get("step", -1) > k]  # k+1 on
    result = diff_runs(ref_records, records)
    parted = _rl_parting(ref_records, records) if rl else None
    same = w == ref.weights_sha256 and o == ref.optimizer_sha256 and result.first is None
    same = same and parted is None
    if same:
        verdict = "identical"
    elif result.tensors is not None:
        verdict = f"differs: {tensor_verdict(result.tensors)}"
    elif result.first is not None:
        verdict = (
            f"differs from step {result.first.step} "
            f"(largest |loss diff| {result.max_loss_diff:.3e})"
        )
    elif parted is not None:
        verdict = f"differs from step {parted} (its rewards, rollouts or held-out score)"
    else:
        verdict = "differs: final weights or optimizer state"
    return RunSummary(f"split@{k}", k, w, o, len(after), verdict, same)


def verify_resume(
    cfg: TrainConfig | RLConfig,
    splits: list[int],
    *,
    keep: bool = False,
    workdir: Path | None = None,
    echo: Callable[[str], None] = print,
) -> tuple[list[RunSummary], Path | None]:
    """Run and compare; returns the summaries (straight first) and the kept folder, if any."""
    rl = isinstance(cfg, RLConfig)
    steps = cfg.policy.steps if isinstance(cfg, RLConfig) else cfg.lr_schedule.steps
    _check_splits(steps, splits)
    root = Path(tempfile.mkdtemp(prefix="octlm-verify-", dir=workdir))
    kind = "RL run" if rl else "run"
    try:
        config = subrun.write_config(cfg, root / "config.toml")
        echo(f"straight {kind} of {steps} steps ...")
        _run(cfg, config, root / "straight")
        ref_w, ref_o, ref_records = _summarise(root / "straight")
        summaries = [RunSummary("straight", None, ref_w, ref_o, 0, "reference", True)]
        for k in sorted(set(splits)):
            echo(f"{kind} stopped at {k} and resumed ...")
            out = root / f"split-{k}"
            _run(cfg, config, out, "--stop-at", str(k))
            _run(cfg, config, out, "--resume")
            summaries.append(_compare(k, summaries[0], out, ref_records, rl))
    except BaseException:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
        raise
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return summaries, (root if keep else None)


def format_table(summaries: list[RunSummary]) -> list[str]:
    rows = [("run", "weights_sha256", "optimizer_sha256", "steps after split", "verdict")]
    for s in summaries:
        after = "-" if s.split is None else str(s.steps_after_split)
        rows.append((s.name, s.weights_sha256[:16], s.optimizer_sha256[:16], after, s.verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
        for r in rows
    ]


def format_result(summaries: list[RunSummary], kept: Path | None) -> list[str]:
    """The table, where the runs were kept, and the verdict line."""
    ok = all(s.identical for s in summaries)
    return [
        *format_table(summaries),
        *([f"runs kept in {kept}"] if kept else []),
        "identical: every resumed run matches the straight run bit for bit"
        if ok
        else "NOT identical: see the table",
    ]
