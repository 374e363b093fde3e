"""`octlm sweep`: a grid of settings x repeats, each a real `octlm train` run, resumable.

Every run is `octlm train --resume` in its own folder, so re-running a killed sweep skips the
finished runs (their log ends with an `end` record) and resumes the interrupted one exactly.
Repeat r of a setting trains with seed + r. The summary gives each setting's final validation
loss as mean, min and max over repeats, and marks a difference from the best setting that is
smaller than the spread between repeats as "within noise".
"""

from __future__ import annotations

import csv
import os
import queue
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from octlm.config import checks
from octlm.config.checks import shown_path
from octlm.config.train import TrainConfig
from octlm.errors import OctlmError, QuotedError
from octlm.runlog.reader import log_file, read_log
from octlm.tools import subrun
from octlm.tools.sweep_plan import RunSpec, fmt_value, plan_from


def visible_gpus() -> list[str]:
    """The GPUs a job may be given: CUDA_VISIBLE_DEVICES's entries when set, else every device
    torch sees; none without CUDA."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    import torch  # only here: the sweep's other work needs no torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def gpu_slots(gpus: list[str], jobs: int) -> list[str]:
    """The GPUs `jobs` parallel runs get, one each; [] when there is no GPU (the runs share the
    CPU's threads) or one job (it keeps what it sees). More jobs than GPUs is an error: two runs
    on one GPU would fight for its memory."""
    if not gpus or jobs <= 1:
        return []
    if jobs > len(gpus):
        raise OctlmError(
            f"--jobs {jobs} with {len(gpus)} visible GPU(s) ({','.join(gpus)}): one job per GPU",
            f"pass --jobs {len(gpus)} or fewer",
        )
    return gpus[:jobs]


def finished(run: Path) -> bool:
    """Whether the run's log ends it (a log cut by a kill reads up to the cut: not finished)."""
    return log_file(run).is_file() and any(r["type"] == "end" for r in read_log(run))


def final_val_loss(run: Path) -> float | None:
    vals = [r["val_loss"] for r in read_log(run) if r["type"] == "val" and "val_loss" in r]
    return float(vals[-1]) if vals else None


class Sweep:
    def __init__(self, out: Path, base: TrainConfig, specs: list[RunSpec], jobs: int) -> None:
        self.out, self.base, self.specs, self.jobs = out, base, specs, jobs
        self.config_path = out / "base.toml"
        self.durations: list[float] = []
        self.failures: dict[str, str] = {}
        self.gpus: queue.Queue[str] | None = None  # free GPUs, when each job gets its own
        self.todo = 0

    def run_dir(self, spec: RunSpec) -> Path:
        return self.out / "runs" / spec.name

    def flags(self, spec: RunSpec) -> list[str]:
        """What one run adds to the base settings: its seed and setting, and --resume."""
        flags = ["--seed", str(spec.seed), "--resume"]
        for key, value in spec.setting:
            flags += [f"--{key.replace('_', '-')}", fmt_value(value)]
        return flags

    def _env(self, gpu: str | None) -> dict[str, str]:
        env = dict(os.environ)
        if self.jobs > 1 and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.jobs))
        if gpu is not None:  # the run sees its one GPU as cuda:0
            env["CUDA_VISIBLE_DEVICES"] = gpu
        return env

    def _run_one(self, index: int, spec: RunSpec) -> None:
        # Runs of this invocation not yet done, counted from what the workers recorded (re-reading
        # every run's log before each run would be quadratic in the sweep size).
        remaining = self.todo - len(self.durations) - len(self.failures)
        eta = ""
        if self.durations:
            seconds = statistics.mean(self.durations) * remaining / self.jobs
            eta = f", ETA {int(seconds // 60)}:{int(seconds % 60):02d}"
        print(
            f"[{index + 1}/{len(self.specs)}] {spec.name} (seed {spec.seed}){eta}",
            file=sys.stderr,
            flush=True,
        )
        t0 = time.perf_counter()
        run_dir, flags = self.run_dir(spec), self.flags(spec)
        gpu = self.gpus.get() if self.gpus is not None else None
        try:
            error = subrun.train(self.config_path, run_dir, *flags, env=self._env(gpu))
        finally:
            if self.gpus is not None:
                self.gpus.put(gpu)
        if error is not None:
            self.failures[spec.name] = error
            print(f"  {spec.name} failed: {error}", file=sys.stderr, flush=True)
            return
        self.durations.append(time.perf_counter() - t0)

    def run(self) -> None:
        slots = gpu_slots(visible_gpus(), self.jobs)
        self.gpus = None
        if slots:  # one job per GPU: a job takes a free one and gives it back when done
            self.gpus = queue.Queue()
            for gpu in slots:
                self.gpus.put(gpu)
        subrun.write_config(self.base, self.config_path)  # prepares the embedded corpus once
        todo = [(i, s) for i, s in enumerate(self.specs) if not finished(self.run_dir(s))]
        self.todo = len(todo)
        skipped = len(self.specs) - len(todo)
        if skipped:
            print(f"{skipped} of {len(self.specs)} runs already finished: skipped", file=sys.stderr)
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            list(pool.map(lambda item: self._run_one(*item), todo))

    def summarise(self) -> list[dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        for spec in self.specs:
            row = rows.setdefault(
                spec.setting_name, {"setting": spec.setting_name, "losses": [], "failed": 0}
            )
            run = self.run_dir(spec)
            loss = final_val_loss(run) if finished(run) else None
            if loss is None:
                row["failed"] += 1
            else:
                row["losses"].append(loss)
        out = []
        for row in rows.values():
            losses = row.pop("losses")
            row.update(
                repeats=len(losses),
                mean=statistics.mean(losses) if losses else None,
                min=min(losses) if losses else None,
                max=max(losses) if losses else None,
            )
            row["spread"] = row["max"] - row["min"] if losses else None
            out.append(row)
        mark_noise(out)
        return out


def mark_noise(rows: list[dict[str, Any]]) -> None:
    """Compare every setting with the best: a gap smaller than the larger of the two settings'
    repeat spreads (max - min) is "within noise"; one repeat each cannot tell."""
    scored = [r for r in rows if r["mean"] is not None]
    if not scored:
        return
    best = min(scored, key=lambda r: r["mean"])
    for r in rows:
        if r["mean"] is None:
            r["vs_best"] = "failed"
        elif r is best:
            r["vs_best"] = "best"
        elif r["repeats"] < 2 or best["repeats"] < 2:
            r["vs_best"] = f"+{r['mean'] - best['mean']:.3f} (one repeat: noise unknown)"
        else:
            gap, noise = r["mean"] - best["mean"], max(r["spread"], best["spread"])
            r["vs_best"] = f"+{gap:.3f} " + ("within noise" if gap <= noise else "beyond noise")


def write_summary(out: Path, rows: list[dict[str, Any]], failures: dict[str, str]) -> None:
    def num(v: float | None) -> str:
        return "" if v is None else f"{v:.4f}"

    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["setting", "repeats", "failed", "mean", "min", "max", "spread", "vs_best"])
        for r in rows:
            writer.writerow(
                [
                    r["setting"],
                    r["repeats"],
                    r["failed"],
                    num(r["mean"]),
                    num(r["min"]),
                    num(r["max"]),
                    num(r["spread"]),
                    r.get("vs_best"),
                ]
            )
    lines = [
        "| setting | repeats | final val loss mean | min | max | vs best |",
        "|---|---:|---:|---:|---:|---|",
    ]
    ordered = sorted(rows, key=lambda r: (r["mean"] is None, r["mean"] or 0.0))
    for r in ordered:
        lines.append(
            f"| {r['setting']} | {r['repeats']} | {num(r['mean'])} | {num(r['min'])} "
            f"| {num(r['max'])} | {r.get('vs_best', '')} |"
        )
    if failures:
        lines += ["", "Failed runs:"] + [f"- {k}: {v}" for k, v in sorted(failures.items())]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def planned(
    base: TrainConfig, table: dict, grids: list[str], sets: list[str], repeats: int | None
) -> list[RunSpec]:
    """`plan_from`, a refused value named as the user typed it: `--grid lr=-1.0 ...`, changed
    in that option (not in the settings file, whose key the value shares)."""
    try:
        return plan_from(base, table, grids=grids, sets=sets, repeats=repeats)
    except QuotedError:
        raise
    except OctlmError as exc:
        for option, given in (("--grid", grids), ("--set", sets)):
            keys = {part.partition("=")[0].strip() for spec in given for part in spec.split(",")}
            key = next((k for k in keys if k and exc.problem.startswith(f"{k}=")), None)
            if key is not None:
                raise QuotedError(f"{option} {exc.problem}", f"change {key} in {option}") from None
        raise


def run_sweep(
    base: TrainConfig,
    table: dict,
    *,
    grids: list[str],
    sets: list[str],
    repeats: int | None,
    out: str | Path | None,
    jobs: int,
) -> list[dict[str, Any]]:
    """Plan, run and summarise the sweep (the summary printed); a sweep with failed runs is an
    error naming them, raised after every other run has finished and the summary is written."""
    out = "sweeps/sweep" if out is None else out
    checks.check_path("--out", out)
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise OctlmError(f"--out {shown_path(folder)} is a file", "choose a folder for the sweep")
    checks.check_processes("--jobs", jobs)
    specs = planned(base, table, grids, sets, repeats)
    sweep = Sweep(folder, base, specs, jobs)
    sweep.run()
    rows = sweep.summarise()
    write_summary(folder, rows, sweep.failures)
    print((folder / "summary.md").read_text(), end="")
    print(f"wrote {folder / 'summary.md'} and {folder / 'summary.csv'}")
    if sweep.failures:
        names = sorted(sweep.failures)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise QuotedError(
            f"{len(names)} of {len(specs)} runs failed: {shown}",
            f"see their errors in {folder / 'summary.md'}; run the same command again to retry "
            "them (finished runs are skipped)",
        )
    return rows
