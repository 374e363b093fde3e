"""`octlm diff`: the first step where two run logs part, or proof that they match.

Compared per step: loss and gradient norm (exact float equality, as logged), and the weights
hash wherever both logs recorded one (`hash` records, and the `end` record at the last step).
A log cut short by a kill, or with a damaged line, is compared on what is readable (a note
says how many lines were skipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octlm.runlog import read_log_counted


@dataclass(frozen=True)
class Divergence:
    step: int
    field: str
    a: Any
    b: Any


@dataclass(frozen=True)
class DiffResult:
    common_steps: int
    steps_a: int
    steps_b: int
    first: Divergence | None
    """The first differing step, None when the runs match on every common step."""
    details: list[Divergence]
    """Every field that differs at that first step."""
    max_loss_diff: float
    """Largest |loss_a - loss_b| over all common steps."""


def _index(records: list[dict[str, Any]]) -> tuple[dict[int, dict], dict[int, str | None]]:
    def at(kind: str) -> list[dict[str, Any]]:  # a readable but damaged record has no step
        return [r for r in records if r.get("type") == kind and isinstance(r.get("step"), int)]

    steps = {r["step"]: r for r in at("step")}
    hashes = {r["step"]: r.get("weights_sha256") for r in at("hash")}
    for r in at("end"):
        hashes[r["step"]] = r.get("weights_sha256")  # the weights after the last step
    return steps, hashes


def diff_runs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> DiffResult:
    steps_a, hashes_a = _index(a)
    steps_b, hashes_b = _index(b)
    common = sorted(set(steps_a) & set(steps_b))
    first: Divergence | None = None
    details: list[Divergence] = []
    max_diff = 0.0
    for s in common:
        ra, rb = steps_a[s], steps_b[s]
        here = [
            Divergence(s, key, ra.get(key), rb.get(key))
            for key in ("loss", "grad_norm")
            if ra.get(key) != rb.get(key)
        ]
        if s in hashes_a and s in hashes_b and hashes_a[s] != hashes_b[s]:
            here.append(Divergence(s, "weights_sha256", hashes_a[s], hashes_b[s]))
        if isinstance(ra.get("loss"), float) and isinstance(rb.get("loss"), float):
            max_diff = max(max_diff, abs(ra["loss"] - rb["loss"]))
        if here and first is None:
            first, details = here[0], here
    return DiffResult(len(common), len(steps_a), len(steps_b), first, details, max_diff)


def format_diff(result: DiffResult, name_a: str, name_b: str) -> list[str]:
    if result.common_steps == 0:
        return [f"{name_a} and {name_b} share no step"]
    if result.first is None:
        lines = [f"match: {result.common_steps} common steps identical (loss, grad_norm, hashes)"]
    else:
        lines = [f"the runs part at step {result.first.step}:"]
        for d in result.details:
            if isinstance(d.a, float) and isinstance(d.b, float):
                lines.append(f"  {d.field:14s} {d.a!r} vs {d.b!r}  (diff {d.b - d.a:+.3e})")
            else:
                lines.append(f"  {d.field:14s} {d.a} vs {d.b}")
        lines.append(
            f"  largest loss difference over {result.common_steps} common steps: "
            f"{result.max_loss_diff:.3e}"
        )
    if result.steps_a != result.steps_b:
        lines.append(f"note: {name_a} logged {result.steps_a} steps, {name_b} {result.steps_b}")
    return lines


def diff_folders(run_a: str | Path, run_b: str | Path) -> tuple[list[str], bool]:
    """`octlm diff`: the report's lines, and whether the runs match on every common step."""
    (a, bad_a), (b, bad_b) = read_log_counted(run_a), read_log_counted(run_b)
    result = diff_runs(a, b)
    lines = format_diff(result, str(run_a), str(run_b))
    for run, bad in ((run_a, bad_a), (run_b, bad_b)):
        if bad:
            lines.append(f"note: {run} has {bad} unreadable line(s), skipped")
    return lines, result.first is None and result.common_steps > 0
