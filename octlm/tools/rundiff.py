"""`octlm diff`: the first step where two run logs part, or proof that they match.

Compared per step: loss and gradient norm (exact float equality, as logged), and the weights
hash wherever both logs recorded one (`hash` records, and the `end` record at the last step).
A log cut short by a kill, or with a damaged line, is compared on what is readable (a note
says how many lines were skipped).

Runs made with --hash-tensors also log `tensors` records (every weight's digest and every
gradient's, before clipping); then the first step whose digests differ names a tensor. Within a
step the forward comes first (the loss), then the backward (gradients), then the update
(weights), so the first tensor is the first differing gradient in backward order (reversed
parameter order: the backward computes the last layers first, and a difference it makes there
flows on to every earlier layer), and only when every gradient matched, the first differing
weight in parameter order. A resume logs the weights it loaded at its checkpoint's step: a
checkpoint that did not give back a weight's exact bits is named there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octlm.runlog.reader import read_log_counted


@dataclass(frozen=True)
class Divergence:
    step: int
    field: str
    a: Any
    b: Any


@dataclass(frozen=True)
class TensorParting:
    """Where the per-tensor digests first differ."""

    step: int
    grads: list[str]
    """The gradients that differ, in backward order (the first one first)."""
    weights: list[str]
    """The weights that differ, in parameter order."""
    loss_matched: bool | None
    """Whether the step's loss was equal in both (None: a log has no step record there)."""
    loaded: bool
    """The weights compared are the ones a resume loaded at this step."""


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
    tensors: TensorParting | None = None
    """The first step whose per-tensor digests differ; None without them or when they match."""
    digested: bool = False
    """Whether both logs hold per-tensor digests (--hash-tensors) at some common step."""


def _index(records: list[dict[str, Any]]) -> tuple[dict[int, dict], dict[int, str | None]]:
    def at(kind: str) -> list[dict[str, Any]]:  # a readable but damaged record has no step
        return [r for r in records if r.get("type") == kind and isinstance(r.get("step"), int)]

    steps = {r["step"]: r for r in at("step")}
    hashes = {r["step"]: r.get("weights_sha256") for r in at("hash")}
    for r in at("end"):
        hashes[r["step"]] = r.get("weights_sha256")  # the weights after the last step
    return steps, hashes


def _tensor_index(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """{step: {"weights", "grads", "loaded"}} from `tensors` records in file order: a resume's
    record of the weights it loaded (at its checkpoint's step) replaces the weights logged
    there, the gradients stay."""
    index: dict[int, dict[str, Any]] = {}
    for r in records:
        if r.get("type") != "tensors" or not isinstance(r.get("step"), int):
            continue
        entry = index.setdefault(r["step"], {"weights": {}, "grads": {}, "loaded": False})
        if isinstance(r.get("weights"), dict):
            entry["weights"], entry["loaded"] = r["weights"], bool(r.get("loaded"))
        if isinstance(r.get("grads"), dict):
            entry["grads"] = r["grads"]
    return index


def _differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """Names whose digests differ, in `a`'s order (then names only `b` has)."""
    return [n for n in {**a, **b} if a.get(n) != b.get(n)]


def _tensor_parting(
    s: int, ta: dict[str, Any], tb: dict[str, Any], loss_matched: bool | None
) -> TensorParting | None:
    # A resume's record of the weights it loaded (or a skipped step's) has no gradients.
    both = ta["grads"] and tb["grads"]
    grads = _differing(ta["grads"], tb["grads"])[::-1] if both else []  # backward order
    weights = _differing(ta["weights"], tb["weights"])
    if not grads and not weights:
        return None
    return TensorParting(s, grads, weights, loss_matched, ta["loaded"] or tb["loaded"])


def diff_runs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> DiffResult:
    steps_a, hashes_a = _index(a)
    steps_b, hashes_b = _index(b)
    tensors_a, tensors_b = _tensor_index(a), _tensor_index(b)
    common = sorted(set(steps_a) & set(steps_b) | set(tensors_a) & set(tensors_b))
    parting: TensorParting | None = None
    first: Divergence | None = None
    details: list[Divergence] = []
    max_diff = 0.0
    for s in common:
        ra, rb = steps_a.get(s, {}), steps_b.get(s, {})
        here = [
            Divergence(s, key, ra.get(key), rb.get(key))
            for key in ("loss", "grad_norm")
            if ra.get(key) != rb.get(key)
        ]
        if s in hashes_a and s in hashes_b and hashes_a[s] != hashes_b[s]:
            here.append(Divergence(s, "weights_sha256", hashes_a[s], hashes_b[s]))
        if parting is None and s in tensors_a and s in tensors_b:
            matched = ra.get("loss") == rb.get("loss") if ra and rb else None
            parting = _tensor_parting(s, tensors_a[s], tensors_b[s], matched)
            if parting is not None:
                here.append(Divergence(s, "tensors", parting.grads, parting.weights))
        if isinstance(ra.get("loss"), float) and isinstance(rb.get("loss"), float):
            max_diff = max(max_diff, abs(ra["loss"] - rb["loss"]))
        if here and first is None:
            first, details = here[0], here
    digested = bool(set(tensors_a) & set(tensors_b))
    n_common = len(set(steps_a) & set(steps_b))
    return DiffResult(
        n_common, len(steps_a), len(steps_b), first, details, max_diff, parting, digested
    )


def format_diff(result: DiffResult, name_a: str, name_b: str) -> list[str]:
    if result.common_steps == 0:
        return [f"{name_a} and {name_b} share no step"]
    if result.first is None:
        lines = [f"match: {result.common_steps} common steps identical (loss, grad_norm, hashes)"]
    else:
        lines = [f"the runs part at step {result.first.step}:"]
        for d in result.details:
            if d.field == "tensors":
                lines.append(f"  {d.field:14s} {len(d.a)} gradient(s), {len(d.b)} weight(s)")
            elif isinstance(d.a, float) and isinstance(d.b, float):
                lines.append(f"  {d.field:14s} {d.a!r} vs {d.b!r}  (diff {d.b - d.a:+.3e})")
            else:
                lines.append(f"  {d.field:14s} {d.a} vs {d.b}")
        lines.append(
            f"  largest loss difference over {result.common_steps} common steps: "
            f"{result.max_loss_diff:.3e}"
        )
        lines.extend(_tensor_lines(result))
    if result.steps_a != result.steps_b:
        lines.append(f"note: {name_a} logged {result.steps_a} steps, {name_b} {result.steps_b}")
    return lines


def tensor_verdict(parting: TensorParting) -> str:
    """`step 3: x's gradient differs first; the loss matched`."""
    loss = {True: "the loss matched", False: "the loss differed too", None: "no loss logged"}
    if parting.grads:
        return (
            f"step {parting.step}: {parting.grads[0]}'s gradient differs first; "
            + loss[parting.loss_matched]
        )
    how = "as the resume loaded them; " if parting.loaded else ""
    return (
        f"step {parting.step}: {parting.weights[0]}'s weights differ first ({how}every "
        f"gradient matched); {loss[parting.loss_matched]}"
    )


def _names(names: list[str], most: int = 4) -> str:
    more = f" (+{len(names) - most} more)" if len(names) > most else ""
    return ", ".join(names[:most]) + more if names else "none"


def _tensor_lines(result: DiffResult) -> list[str]:
    parting, first = result.tensors, result.first
    if parting is None:
        if result.digested:
            return ["  every per-tensor digest both logged matched"]
        return ["  hint: run both with --hash-tensors --hash-every 1 to name the tensor"]
    lines = [
        tensor_verdict(parting),
        f"  gradients that differ (backward order): {_names(parting.grads)}",
        f"  weights that differ: {_names(parting.weights)}",
    ]
    if first is not None and parting.step > first.step:
        lines.append(f"  note: no digests of step {first.step} in both logs (use --hash-every 1)")
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
