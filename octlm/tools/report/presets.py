"""Schedule presets for the playground: lr, warmup, steps, min_lr_ratio and the schedule's kind
(cosine, or wsd with its decay_steps and decay_shape) of each config.

Read at report time from the configs shipped in the package (`octlm/configs/*.toml`, the names
`--config` takes), then from a `configs/` folder under the current one, keys a file leaves out
taking TrainConfig's defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from octlm.config.files import SHIPPED_CONFIGS, load_toml
from octlm.config.train import ConfigError, default_values

SCHEDULE_KEYS = ("lr", "warmup", "steps", "min_lr_ratio", "schedule", "decay_steps", "decay_shape")


def schedule_defaults() -> dict[str, Any]:
    # The dataclass defaults, without constructing TrainConfig (its check imports torch).
    defaults = default_values()
    return {k: defaults[k] for k in SCHEDULE_KEYS}


def config_dirs() -> list[Path]:
    """Folders searched for `*.toml`: the package's shipped configs, then `./configs`."""
    found: list[Path] = []
    for d in (SHIPPED_CONFIGS, Path.cwd() / "configs"):
        if d.is_dir() and d.resolve() not in found:
            found.append(d.resolve())
    return found


def schedule_of(values: dict[str, Any]) -> dict[str, Any] | None:
    """The schedule settings over the defaults; None if one is not usable (the page would draw
    nonsense where the trainer refuses)."""
    merged = {**schedule_defaults(), **{k: values[k] for k in SCHEDULE_KEYS if k in values}}
    ints_ok = all(_is_int(merged[k]) and merged[k] >= 0 for k in ("warmup", "steps"))
    floats_ok = all(_is_number(merged[k]) for k in ("lr", "min_lr_ratio"))
    if not (ints_ok and floats_ok and merged["steps"] > 0):
        return None
    if merged["schedule"] not in ("cosine", "wsd"):
        return None
    decay = merged["decay_steps"]
    if merged["schedule"] == "wsd" and not (_is_int(decay) and 0 < decay <= merged["steps"]):
        return None
    return {**merged, "lr": float(merged["lr"]), "min_lr_ratio": float(merged["min_lr_ratio"])}


def schedule_presets(dirs: list[Path] | None = None) -> list[dict[str, Any]]:
    """One preset per readable config file, sorted by name: {name, source, lr, warmup, ...}."""
    presets = []
    for d in config_dirs() if dirs is None else dirs:
        for path in sorted(d.glob("*.toml")):
            try:
                schedule = schedule_of(load_toml(path))
            except ConfigError:
                continue  # a broken file is the trainer's to report, not the page's
            if schedule is not None and all(p["name"] != path.stem for p in presets):
                presets.append({"name": path.stem, "source": str(path), **schedule})
    return presets


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
