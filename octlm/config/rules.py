"""What each `TrainConfig` field may be, checked where a config is built: the one check every
door shares (flags, a TOML file, a sweep, the Python API). The ranges' reasons are in
`octlm.config.checks`; the shape keys are checked once resolved (`octlm.config.shape`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
from typing import Any

from octlm.config import checks
from octlm.errors import OctlmError

DEVICE_PATTERN = r"auto|(cpu|cuda|mps)(:\d+)?"  # what octlm.device.resolve_device takes
MAX_DIST_TIMEOUT_S = 7 * 24 * 3600.0
"""A week: no collective waits longer for a peer (torch's own default is 30 minutes)."""
CHANGE_IT = "change it on the command line or in --config"
UNKNOWN_KEY_FIX = "see `octlm train --help` for the keys (flags with - replaced by _)"

# A new int or float field of TrainConfig must add its range here, else importing config fails.
RANGES: dict[str, checks.Int | checks.Number] = {
    **dict.fromkeys(("steps", "decay_steps", "micro_batch", "accum", "context"), checks.Int(1)),
    **dict.fromkeys(("val_batches", "keep_last", "stop_at"), checks.Int(1)),
    **dict.fromkeys(("warmup", "seed", "overfit_blocks", "val_every"), checks.Int(0)),
    **dict.fromkeys(("hash_every", "ckpt_every"), checks.Int(0)),
    **dict.fromkeys(("lr", "eps", "peak_tflops"), checks.Number(0, lo_open=True)),
    **dict.fromkeys(("weight_decay", "grad_clip"), checks.Number(0)),
    **dict.fromkeys(("beta1", "beta2", "dropout"), checks.Number(0, 1, hi_open=True)),
    "min_lr_ratio": checks.Number(0, 1),
    "muon_lr": checks.Number(0, 10, lo_open=True),
    "muon_momentum": checks.Number(0, 1, hi_open=True),
    "muon_ns_steps": checks.Int(1, 20),
    "muon_gram": checks.Bool(),
    "z_loss": checks.Number(0, 1),
    "dist_timeout": checks.Number(0, MAX_DIST_TIMEOUT_S, lo_open=True),
}
PATH_KEYS = ("out", "data", "init_from", "blocks")
SCHEDULES = ("cosine", "wsd")  # learning-rate shapes after warmup (octlm.trainer.schedule)
OPTIMIZERS = ("adamw", "muon")  # octlm.trainer.optim
NS_DTYPES = ("auto", "fast", "fp32", "bf16")  # Muon's Newton-Schulz products (trainer.muon)
MUON_DEFAULTS = {
    "muon_lr": 0.02,
    "muon_momentum": 0.95,
    "muon_ns_steps": 5,
    "muon_gram": False,
    "muon_ns_dtype": "auto",
}
"""TrainConfig's defaults of the Muon keys (its fields take them from here)."""
DECAY_SHAPES = ("linear", "1-sqrt")
PACKINGS = ("stream", "bos")  # pretraining rows (octlm.data.windows, octlm.data.bos)


_MIXTURE_PART = re.compile(r"(?P<path>.+):(?P<weight>[^:,]+)")


class ConfigError(OctlmError):
    """A bad setting in a TOML file or on the command line."""


def require(ok: bool, problem: str, fix: str = CHANGE_IT) -> None:
    if not ok:
        raise ConfigError(problem, fix)


def check_optimizer(optimizer: str, **muon: float | str) -> None:
    """The optimizer's name, and no Muon setting (`muon`: the muon_* keys) away from its
    default unless the optimizer is Muon."""
    require(
        optimizer in OPTIMIZERS, f"optimizer {optimizer!r} is unknown", f"use one of {OPTIMIZERS}"
    )
    ns_dtype = muon.get("muon_ns_dtype", MUON_DEFAULTS["muon_ns_dtype"])
    require(
        ns_dtype in NS_DTYPES, f"muon_ns_dtype {ns_dtype!r} is unknown", f"use one of {NS_DTYPES}"
    )
    if optimizer != "muon":
        for key, value in muon.items():
            require(
                value == MUON_DEFAULTS[key],
                f"{key} is for --optimizer muon, not {optimizer}",
                f"add --optimizer muon, or drop --{key.replace('_', '-')}",
            )


def check_data(data: str | None, blocks: str | None, overfit_blocks: int) -> None:
    """--data as one dataset, or a weighted mixture `A:0.7,B:0.3` (octlm.data.mixture)."""
    try:
        mixture = parse_mixture(data) if data else None
    except ValueError as exc:
        raise ConfigError(
            f"--data {data!r}: {exc}", "write datasets and weights as PATH:WEIGHT,PATH:WEIGHT"
        ) from None
    if mixture is not None:
        require(blocks is None, "--blocks trains on one text file, not a mixture", "drop one")
        require(
            not overfit_blocks,
            "--overfit-blocks memorises blocks of one dataset, not of a mixture",
            "drop --overfit-blocks, or pass one dataset",
        )


def check_packing(packing: str, doc_mask: bool, blocks: str | None) -> None:
    require(packing in PACKINGS, f"packing {packing!r} is unknown", f"use one of {PACKINGS}")
    require(
        not doc_mask or packing == "bos",
        "--doc-mask masks the documents of --packing bos rows, and this run packs none",
        "add --packing bos, or drop --doc-mask",
    )
    require(
        packing == "stream" or blocks is None,
        "--packing bos reads a prepared --data, not the --blocks text",
        "drop --blocks, or --packing",
    )


def check_schedule(
    schedule: str, decay_steps: int | None, decay_shape: str, steps: int, warmup: int
) -> None:
    require(schedule in SCHEDULES, f"schedule {schedule!r} is unknown", f"use {SCHEDULES}")
    require(
        decay_shape in DECAY_SHAPES,
        f"decay_shape {decay_shape!r} is unknown",
        f"use one of {DECAY_SHAPES}",
    )
    if schedule != "wsd":
        require(
            decay_steps is None and decay_shape == "linear",
            f"decay_steps and decay_shape are for --schedule wsd, not {schedule}",
            "add --schedule wsd, or drop --decay-steps and --decay-shape",
        )
        return
    span = steps - warmup
    require(decay_steps is not None, "--schedule wsd needs --decay-steps", "add --decay-steps N")
    require(
        decay_steps <= span,
        f"decay_steps={decay_steps!r} does not fit the {span} steps after warmup "
        f"(steps {steps} - warmup {warmup})",
        f"use --decay-steps between 1 and {span}",
    )


def field_rule(field: dataclasses.Field) -> checks.Int | checks.Number | checks.Bool | checks.Text:
    """The rule of one field, from its type: a number's range, true/false, a non-empty string."""
    kind = str(field.type).replace(" | None", "")
    if kind in ("int", "float"):
        return RANGES[field.name]
    if kind == "bool":
        return checks.Bool()
    return checks.PATH if field.name in PATH_KEYS else checks.Text()


def unknown_keys_problem(names: Any, known: list[str]) -> tuple[str, str] | None:
    """(problem, fix) naming the keys of `names` that are not in `known` (with the nearest known
    name when a key looks like a misspelling); None when every key is known."""
    unknown = sorted(set(names) - set(known))
    if not unknown:
        return None
    near = [m[0] for k in unknown if (m := difflib.get_close_matches(k, known, n=1))]
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    return f"unknown key(s) {', '.join(unknown)}{hint}", UNKNOWN_KEY_FIX


def named_settings_only(cls: type) -> type:
    """`cls(...)` and `dataclasses.replace(...)` refuse a positional value or an unknown key in
    one line, as a TOML file's unknown key is (the generated __init__ raises a TypeError)."""
    generated = cls.__init__
    known = [f.name for f in dataclasses.fields(cls)]

    @functools.wraps(generated)
    def __init__(self: Any, *args: Any, **settings: Any) -> None:
        if args:
            raise ConfigError(
                f"{cls.__name__} takes its settings by name, not {len(args)} positional value(s)",
                f"write {cls.__name__}(model='tiny', steps=50, ...)",
            )
        problem = unknown_keys_problem(settings, known)
        if problem is not None:
            raise ConfigError(*problem)
        generated(self, **settings)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


def parse_mixture(spec: str) -> list[tuple[str, float]] | None:
    """`--data A:0.7,B:0.3` as [(A, 0.7), (B, 0.3)]; None for a single dataset path (no
    weights). Raises ValueError naming a weight that is not a positive finite number."""
    parts = spec.split(",")
    found = [_MIXTURE_PART.fullmatch(p.strip()) for p in parts]
    if len(parts) == 1 and not _is_weighted(found[0]):
        return None
    out = []
    for part, match in zip(parts, found, strict=True):
        if match is None:
            raise ValueError(f"{part.strip()!r} is not PATH:WEIGHT")
        try:
            weight = float(match["weight"])
        except ValueError:
            raise ValueError(f"the weight of {part.strip()!r} is not a number") from None
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"the weight of {part.strip()!r} is not a positive number")
        out.append((match["path"].strip(), weight))
    paths = [p for p, _ in out]
    if len(set(paths)) != len(paths):
        raise ValueError("a dataset is named twice")
    return out


def _is_weighted(match: re.Match | None) -> bool:
    """A single `PATH:NUMBER` is a mixture of one; a path that merely holds a colon is not."""
    if match is None:
        return False
    try:
        float(match["weight"])
    except ValueError:
        return False
    return True
