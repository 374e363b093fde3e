"""`python -m octlm train` in a subprocess: the one way a tool launches a training run.

A tool writes the settings once with `write_config` (every key but the per-launch ones, and the
data folder resolved, so the embedded corpus is prepared here once and not in each run), then
launches runs with `train`, which returns the run's last error line when it fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from octlm.config.files import to_toml
from octlm.config.train import TrainConfig

# Given by each launch (`train`'s arguments and flags), never written into the shared TOML.
PER_LAUNCH_KEYS = ("out", "resume", "stop_at", "progress")


def write_config(cfg: TrainConfig, path: Path) -> Path:
    """The TOML every launched run reads: `cfg` without PER_LAUNCH_KEYS, data resolved."""
    from octlm.trainer.inputs import resolve_data  # prepares the embedded corpus on first use

    values = {k: v for k, v in cfg.to_dict().items() if k not in PER_LAUNCH_KEYS}
    mixture = cfg.inputs.mixture
    if mixture is None:
        values["data"] = str(resolve_data(cfg).resolve())
    else:  # each dataset's path made absolute, its weight as written
        values["data"] = ",".join(f"{Path(p).resolve()}:{w!r}" for p, w in mixture)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_toml(values), encoding="utf-8")
    return path


def train_argv(config: Path, out: Path, *flags: str) -> list[str]:
    """The command line of one run: `config`'s settings, into `out`, `flags` winning."""
    return [
        sys.executable,
        "-m",
        "octlm",
        "train",
        "--config",
        str(config),
        "--out",
        str(out),
        "--no-progress",
        *flags,
    ]


def last_line(stderr: str) -> str:
    """What a failed run said last: its one-line `octlm: error: ...`, or its traceback's end."""
    return (stderr.strip().splitlines() or ["(no output)"])[-1]


def train(config: Path, out: Path, *flags: str, env: dict[str, str] | None = None) -> str | None:
    """Run one training run to its end; None when it succeeded, else its last error line."""
    proc = subprocess.run(
        train_argv(config, out, *flags), capture_output=True, text=True, env=env, check=False
    )
    return None if proc.returncode == 0 else last_line(proc.stderr)
