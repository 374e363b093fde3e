"""`python -m octlm train` (or `rl`) in a subprocess: the one way a tool launches a run.

A tool writes the settings once with `write_config` (every key but the per-launch ones, and the
data folder or RL source resolved, so the embedded corpus is prepared here once and not in each
run), then launches runs with `train` (or `launch`), which returns the run's last error line
when it fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from octlm.config.files import to_toml
from octlm.config.rl import RLConfig
from octlm.config.train import TrainConfig

# Given by each launch (`train`'s arguments and flags), never written into the shared TOML.
PER_LAUNCH_KEYS = ("out", "resume", "stop_at", "progress")


def write_config(cfg: TrainConfig | RLConfig, path: Path) -> Path:
    """The TOML every launched run reads: `cfg` without PER_LAUNCH_KEYS, the data (an RL
    run's source) resolved."""
    values = {k: v for k, v in cfg.to_dict().items() if k not in PER_LAUNCH_KEYS}
    if isinstance(cfg, RLConfig):
        values["source"] = str(Path(cfg.run.source).resolve())
    else:
        values["data"] = resolved_data(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_toml(values), encoding="utf-8")
    return path


def resolved_data(cfg: TrainConfig) -> str:
    """`data` as every launched run reads it: the folder absolute (the embedded corpus prepared
    here, once), or each dataset of a mixture absolute with its weight as written."""
    from octlm.trainer.inputs import resolve_data  # prepares the embedded corpus on first use

    mixture = cfg.inputs.mixture
    if mixture is None:
        return str(resolve_data(cfg).resolve())
    return ",".join(f"{Path(p).resolve()}:{w!r}" for p, w in mixture)


def train_argv(config: Path, out: Path, *flags: str, command: str = "train") -> list[str]:
    """The command line of one run of `octlm COMMAND` (train, or rl): `config`'s settings,
    into `out`, `flags` winning."""
    return [
        sys.executable,
        "-m",
        "octlm",
        command,
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


def launch(
    command: str, config: Path, out: Path, *flags: str, env: dict[str, str] | None = None
) -> str | None:
    """Run one run of `octlm COMMAND` to its end; None when it succeeded, else its last error
    line."""
    argv = train_argv(config, out, *flags, command=command)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    return None if proc.returncode == 0 else last_line(proc.stderr)


def train(config: Path, out: Path, *flags: str, env: dict[str, str] | None = None) -> str | None:
    """Run one training run to its end; None when it succeeded, else its last error line."""
    return launch("train", config, out, *flags, env=env)
