"""`octlm verify-resume`: prove exact resume on the user's own config, model and machine.

One straight run of N steps and, for each split K, a run stopped at K and resumed, each in its
own process. A split run is `identical` when its final weights hash, its AdamW state hash and
every loss and gradient norm after K equal the straight run's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octlm.config import TrainConfig
from octlm.errors import OctlmError
from octlm.hashing import weights_sha256
from octlm.rundiff import diff_runs
from octlm.runlog import read_log
from octlm.train import checkpoint as ckpt

_NOT_PASSED = ("out", "resume", "stop_at", "progress")


@dataclass(frozen=True)
class RunSummary:
    name: str
    split: int | None
    weights_sha256: str
    optimizer_sha256: str
    steps_after_split: int
    verdict: str
    identical: bool


def to_toml(values: dict[str, Any]) -> str:
    """A flat TOML document of str/int/float/bool values (None values are left out)."""
    lines = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


def _train(config: Path, out: Path, *extra: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "octlm",
        "train",
        "--config",
        str(config),
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise OctlmError(f"training run {out.name} failed: {last}", "fix the config and rerun")


def _summarise(run: Path) -> tuple[str, str, list[dict[str, Any]]]:
    records = read_log(run)
    ends = [r for r in records if r["type"] == "end"]
    if not ends:
        raise OctlmError(f"run {run.name} did not finish", "see its log.jsonl (use --keep)")
    path, sha = ckpt.find_checkpoint(run)
    _, tensors = ckpt.load_checkpoint(path, sha)
    return (
        ends[-1]["weights_sha256"],
        weights_sha256(ckpt.split_tensors(tensors, "optim.")),
        records,
    )


def verify_resume(
    cfg: TrainConfig,
    splits: list[int],
    *,
    keep: bool = False,
    workdir: Path | None = None,
    echo: Callable[[str], None] = print,
) -> tuple[list[RunSummary], Path | None]:
    """Run and compare; returns the summaries (straight first) and the kept folder, if any."""
    bad = [k for k in splits if not 0 < k < cfg.steps]
    if bad or not splits:
        raise OctlmError(
            f"split(s) {bad or splits} must lie strictly between 0 and steps={cfg.steps}",
            "pass --split K with 0 < K < --steps",
        )
    from octlm.train.loop import resolve_data  # prepares the embedded corpus once, here

    values = {k: v for k, v in cfg.to_dict().items() if k not in _NOT_PASSED}
    values["data"] = str(resolve_data(cfg).resolve())
    root = Path(tempfile.mkdtemp(prefix="octlm-verify-", dir=workdir))
    try:
        config = root / "config.toml"
        config.write_text(to_toml(values))
        echo(f"straight run of {cfg.steps} steps ...")
        _train(config, root / "straight")
        ref_w, ref_o, ref_records = _summarise(root / "straight")
        summaries = [RunSummary("straight", None, ref_w, ref_o, 0, "reference", True)]
        for k in sorted(set(splits)):
            echo(f"run stopped at {k} and resumed ...")
            out = root / f"split-{k}"
            _train(config, out, "--stop-at", str(k))
            _train(config, out, "--resume")
            w, o, records = _summarise(out)
            after = [r for r in records if r["type"] == "step" and r["step"] >= k]
            result = diff_runs(ref_records, records)
            same = w == ref_w and o == ref_o and result.first is None
            if same:
                verdict = "identical"
            elif result.first is not None:
                verdict = (
                    f"differs from step {result.first.step} "
                    f"(largest |loss diff| {result.max_loss_diff:.3e})"
                )
            else:
                verdict = "differs: final weights or optimizer state"
            summaries.append(RunSummary(f"split@{k}", k, w, o, len(after), verdict, same))
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
