"""What a tracker is given of a log record: its numbers by chart name, and the config as
hyperparameters. Shared by every sink (tensorboard_sink.py, wandb_sink.py); sinks.py builds the
sinks and guards them."""

from __future__ import annotations

from typing import Any

_NONFINITE = {"nan", "inf", "-inf"}  # how RunLog writes non-finite floats (JSON has none)


def numbers(record: dict[str, Any]) -> dict[str, float]:
    """A step or val record's numeric fields (but its step) as `train/KEY` or `val/KEY`: what is
    logged is what is charted, so a field the log gains (memory, say) is charted with no change
    here. Non-finite values, written as strings in the log, are numbers again."""
    group = "val" if record["type"] == "val" else "train"
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("type", "step") or isinstance(value, bool):
            continue
        if isinstance(value, str) and value in _NONFINITE:
            value = float(value)
        if isinstance(value, int | float):
            out[f"{group}/{key.removeprefix('val_')}"] = float(value)
    return out


def hparams(header: dict[str, Any]) -> dict[str, Any]:
    """The run's settings in its header as flat hyperparameters (trackers take numbers, strings
    and bools, not None): a training run's `config`, an `octlm rl` run's `rl` settings."""
    config = header["rl"] if header.get("kind") == "rl" else header["config"]
    return {k: ("" if v is None else v) for k, v in config.items()}
