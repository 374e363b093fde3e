"""Read a run folder into the plain data the report page draws: columns, not records.

Tolerant where a crash can leave marks (a line cut short is skipped and counted) and strict
where the input is not a run at all (no log, no header): that is a one-line `OctlmError`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from octlm.config.checks import shown, shown_path
from octlm.config.rl import sectioned as rl_sectioned
from octlm.config.shape import SHAPE_KEYS
from octlm.config.train import sectioned
from octlm.errors import OctlmError
from octlm.runlog.reader import read_log_counted, require_log

SAMPLES_NAME = "samples.txt"
MERGE_RECORD = "merge.json"
"""`octlm merge`'s record (trainer/checkpoint.py's MERGE_RECORD, which a test holds equal):
not imported from there, because that module loads torch and the report does not need it."""
STEP_FIELDS = ("step", "tokens", "loss", "lr", "grad_norm", "tok_per_s", "mfu")
VAL_FIELDS = ("step", "val_loss", "val_ppl", "val_bpb")
METRICS = ("acc", "centered", "bpb")
"""A standard-suite task's val fields, `METRIC/SUITE/TASK` (evaluate/tasks.py `task_fields`)."""
RL_KIND = "rl"
"""The header `kind` of an `octlm rl` run (octlm/rl/run.py's KIND, which a test holds equal)."""
RL_STEP_FIELDS = ("reward", "correct", "cut", "reply_len")
"""An RL step's rollout numbers (its `loss` is the policy-gradient surrogate)."""
RL_VAL_FIELDS = ("heldout_reward", "heldout_cut", "heldout_prompts")
HEADER_FIELDS = (
    "config",
    "model_config",
    "params",
    "params_non_embedding",
    "tokens_per_step",
    "packing",
    "fingerprints",
    "data_dir",
    "build",
    "git_commit",
    "argv",
    "time",
)


def number(value: Any) -> float | int | None:
    """A finite number, or None (a gap in a chart): the log writes NaN/inf as strings."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def load_run(run: str | Path, name: str | None = None) -> dict[str, Any]:
    """One run as columns (`steps`, `val`), its header fields, events, end record and samples."""
    path = require_log(run)
    records, bad = read_log_counted(path)
    headers = [r for r in records if r.get("type") == "header"]
    if not headers:
        raise OctlmError(
            f"{shown_path(path)} has no header record",
            "pass the log of a run written by `octlm train`",
        )
    header = headers[0]
    by_type: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_type.setdefault(str(r.get("type")), []).append(r)
    steps = sorted(by_type.get("step", []), key=_step)
    tokens_at = {r.get("step"): r.get("tokens") for r in steps}
    per_step = header.get("tokens_per_step")
    vals = sorted(by_type.get("val", []), key=_step)
    val = {k: [number(r.get(k)) for r in vals] for k in VAL_FIELDS}
    # A validation after step s has seen the tokens of steps 1..s.
    val["tokens"] = [
        tokens_at.get(r.get("step")) or _tokens_after(r.get("step"), per_step) for r in vals
    ]
    # Named series of the val records, aligned with its columns: a --data mixture's bits per
    # byte per dataset (val_bpb/NAME), and --eval-tasks' accuracy per task (acc_norm/NAME).
    val_sources, val_tasks = _named(vals, "val_bpb"), _named(vals, "acc_norm")
    # --eval-tasks' standard suites: each suite's aggregate per val record (the charts), and
    # its tasks' numbers at the latest validation that scored the suite (the table).
    suite_names = _suite_names(vals)
    config = header.get("config") if isinstance(header.get("config"), dict) else {}
    folder = path.parent
    rl = _rl(header, steps, vals)
    # An RL run has no training config: its settings are its own (`rl`), in RL's sections,
    # whose run/hardware/observe keys are training's (a shared key lines up in one row).
    resolved = _resolved(config, header.get("model_config")) if rl is None else {}
    sections = sectioned(resolved) if rl is None else rl_sectioned(rl["settings"])
    return {
        "name": name or folder.name,
        "path": str(folder.resolve()),
        **{k: header.get(k) for k in HEADER_FIELDS},
        "config": resolved,
        # The settings table's groups: by section, the keys that do not apply left out.
        "config_sections": sections,
        "grad_clip": number((config if rl is None else rl["settings"]).get("grad_clip")) or 0,
        "steps": {k: [number(r.get(k)) for r in steps] for k in STEP_FIELDS},
        "skipped": [r.get("step") for r in steps if r.get("skipped")],
        "val": val,
        "val_sources": val_sources,
        "val_tasks": val_tasks,
        "suite_centered": _suite_column(vals, "centered", suite_names),
        "suite_bpb": _suite_column(vals, "bpb", suite_names),
        "suites": [latest_suite(vals, n) for n in suite_names],
        "rl": rl,
        "events": [_event(r) for r in by_type.get("event", [])],
        "end": (by_type.get("end") or [None])[-1],
        "samples": _samples(folder, by_type.get("sample", [])),
        "bad_lines": bad,
    }


def _named(vals: list[dict[str, Any]], prefix: str) -> dict[str, list[float | int | None]]:
    """{NAME: that field per val record} for every `PREFIX/NAME` field of the records."""
    names = sorted({k.split("/", 1)[1] for r in vals for k in r if k.startswith(prefix + "/")})
    return {n: [number(r.get(f"{prefix}/{n}")) for r in vals] for n in names}


def _rl(
    header: dict[str, Any], steps: list[dict[str, Any]], vals: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """An `octlm rl` run's own: its settings (task, P prompts, G samples, ...), the source it
    started from, the optimizer it took over, its steps' rollout columns, and its val records'
    held-out columns with pass@K for each K scored. None for a training run."""
    if header.get("kind") != RL_KIND:
        return None
    parts = {k: header.get(k) for k in ("rl", "source", "optim")}
    settings, source, optim = (v if isinstance(v, dict) else {} for v in parts.values())
    return {
        "settings": settings,
        "source": source,
        "optim": optim,
        "world": header.get("world"),
        "steps": {k: [number(r.get(k)) for r in steps] for k in RL_STEP_FIELDS},
        "val": {k: [number(r.get(k)) for r in vals] for k in RL_VAL_FIELDS},
        "pass_at": _pass_at(vals),
    }


def _pass_at(vals: list[dict[str, Any]]) -> dict[str, list[float | int | None]]:
    """{"pass@K": that field per val record} for every K the records score, K ascending."""
    keys = {k for r in vals for k in r if re.fullmatch(r"pass@[0-9]+", k)}
    return {k: [number(r.get(k)) for r in vals] for k in sorted(keys, key=lambda k: int(k[5:]))}


def _suite_names(vals: list[dict[str, Any]]) -> list[str]:
    """The standard suites the records score, in log order: every suite task logs
    `bpb/SUITE/TASK` (a task file logs `acc/NAME` and `acc_norm/NAME`, never `bpb/...`)."""
    names: dict[str, None] = {}
    for r in vals:
        for k in r:
            parts = k.split("/")
            if parts[0] == "bpb" and len(parts) == 3:
                names[parts[1]] = None
    return list(names)


def _suite_column(
    vals: list[dict[str, Any]], key: str, suites: list[str]
) -> dict[str, list[float | int | None]]:
    """{SUITE: its aggregate `KEY/SUITE` per val record}, for the suites that log one."""
    return {
        s: [number(r.get(f"{key}/{s}")) for r in vals]
        for s in suites
        if any(f"{key}/{s}" in r for r in vals)
    }


def chance_of(acc: float | int | None, centered: float | int | None) -> float | None:
    """The chance level CORE's centering used: centered = (acc - chance) / (1 - chance), so
    chance = (acc - centered) / (1 - centered); none where centered is 1 (acc 1 tells nothing)."""
    if acc is None or centered is None or abs(1 - centered) < 1e-12:
        return None
    return round((acc - centered) / (1 - centered), 12)


def latest_suite(vals: list[dict[str, Any]], suite: str) -> dict[str, Any]:
    """One suite at the latest val record that scored it: the aggregate and, per task in log
    order, its format (accuracy where a centered accuracy is logged, else bits per byte), acc,
    centered, bpb, and the chance the task's acc and centered imply (at the newest validation
    where they tell it: acc 1 tells nothing)."""
    record = next(r for r in reversed(vals) if any(_suite_of(k) == suite for k in r))
    tasks = {k.split("/")[2]: None for k in record if _suite_of(k) == suite and k.count("/") == 2}
    rows = []
    for task in tasks:
        acc, centered, bpb = (number(record.get(f"{k}/{suite}/{task}")) for k in METRICS)
        accuracy = f"centered/{suite}/{task}" in record  # a NaN is still an accuracy task
        rows.append(
            {
                "task": task,
                "format": "accuracy" if accuracy else "bpb",
                "acc": acc,
                "centered": centered,
                "chance": _chance(vals, suite, task),
                "bpb": bpb,
            }
        )
    return {
        "name": suite,
        "step": record.get("step"),
        "centered": number(record.get(f"centered/{suite}")),
        "bpb": number(record.get(f"bpb/{suite}")),
        "tasks": rows,
    }


def _chance(vals: list[dict[str, Any]], suite: str, task: str) -> float | None:
    for r in reversed(vals):
        got = chance_of(
            number(r.get(f"acc/{suite}/{task}")), number(r.get(f"centered/{suite}/{task}"))
        )
        if got is not None:
            return got
    return None


def _suite_of(key: str) -> str | None:
    """SUITE of a suite field (`METRIC/SUITE/TASK`, or the aggregate `centered/SUITE` and
    `bpb/SUITE`); None for any other (a task file's `acc/NAME`, `acc_norm/NAME`)."""
    parts = key.split("/")
    if len(parts) == 3 and parts[0] in METRICS:
        return parts[1]
    return parts[1] if len(parts) == 2 and parts[0] in ("centered", "bpb") else None


def _resolved(config: dict[str, Any], model: Any) -> dict[str, Any]:
    """The config with the shape keys a preset decided (None in the log) read from the model
    the run built, so the settings table shows each run's shape, not nulls."""
    if not isinstance(model, dict):
        return config
    found = {k: model[k] for k in SHAPE_KEYS if config.get(k) is None and k in model}
    return {**config, **found}


def _step(record: dict[str, Any]) -> float:
    return number(record.get("step")) or 0  # a damaged record sorts first, never raises


def _tokens_after(step: Any, per_step: Any) -> int | None:
    if isinstance(step, int) and isinstance(per_step, int):
        return step * per_step  # the steps done by then (runlog: step numbers)
    return None


def _event(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "type"}


def _samples(folder: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Generated text: `samples.txt` beside the log, and `sample` records (text, step) in it."""
    samples = []
    file = folder / SAMPLES_NAME
    if file.is_file():
        text = file.read_text(encoding="utf-8", errors="replace").strip()
        if text:
            samples.append({"source": SAMPLES_NAME, "text": text})
    for r in records:
        if isinstance(r.get("text"), str):
            samples.append({"source": f"log, step {r.get('step', '?')}", "text": r["text"]})
    return samples


def is_merge(folder: str | Path) -> bool:
    """An `octlm merge` folder (merge.json, no log): the report lists it, it draws no curves."""
    folder = Path(folder)
    return (folder / MERGE_RECORD).is_file() and not (folder / "log.jsonl").exists()


def load_merge(folder: str | Path) -> dict[str, Any]:
    """A merge as the report shows it: its sources and, if `octlm merge` scored them, the
    merge against the newest checkpoint it was made of."""
    path = Path(folder) / MERGE_RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OctlmError(
            f"{shown_path(path)} cannot be read ({shown(str(exc))})",
            "merge again with `octlm merge`",
        ) from None
    parts = record.get("merged_from") if isinstance(record, dict) else None
    if not isinstance(parts, list):
        raise OctlmError(
            f"{shown_path(path)} names no merged checkpoints", "merge again with `octlm merge`"
        )
    return {
        "name": Path(folder).name,
        "path": str(Path(folder).resolve()),
        "sources": [{"step": p.get("step"), "weight": p.get("weight")} for p in parts],
        "weights_sha256": record.get("weights_sha256"),
        "eval": record.get("eval"),
    }


def load_runs(runs: list[str | Path]) -> list[dict[str, Any]]:
    """Several runs; names are folder names, made longer (parent/name) where two collide."""
    paths = [require_log(r).parent for r in runs]
    short = [p.name for p in paths]
    names = [f"{p.parent.name}/{p.name}" if short.count(p.name) > 1 else p.name for p in paths]
    names = [n if names.count(n) == 1 else f"{n} ({i + 1})" for i, n in enumerate(names)]
    return [load_run(r, n) for r, n in zip(runs, names, strict=True)]
