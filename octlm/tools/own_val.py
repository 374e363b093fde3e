"""What `octlm eval` scores for the loss: by default the run's own validation.

The settings the checkpoint records (micro-batch, `val_batches`, context, dtype, the data and
its packing, --overfit-blocks, a mixture) rebuild the run's validation sets with the trainer's
own `run_validation`, and the loop's own `validate_run` and `validate` score them: the loss
printed is the `val_loss` the run logged at the checkpoint's step, bit for bit on the device
type it validated on. A flag that changes what is scored (--split, --data, --batches,
--micro-batch, --dtype) still applies, and the summary line says the number is then not the
logged one; a file that records no settings (a snapshot, a merge of snapshots, an RL run) or
an older one that lacks a key is scored at the defaults, and the line says that too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from octlm.config.train import TrainConfig, config_keys, default_values
from octlm.data.dataset_tokenizer import dataset_tokenizer
from octlm.device import build_info
from octlm.errors import OctlmError
from octlm.evaluate.loss import (
    EvalResult,
    ValidationSet,
    first_batches,
    split_set,
    validate,
    validate_run,
)
from octlm.generation.trained import load_weights, merged_last, run_dataset
from octlm.model.gpt import GPT
from octlm.trainer.checkpoint import CheckpointInfo
from octlm.trainer.inputs import run_validation

OWN = "the run's own validation settings"
EVAL_DEFAULTS = {"val_batches": 40, "micro_batch": 16, "dtype": "fp32"}
"""What a file that does not record them is scored with (as `octlm eval` always did)."""


@dataclass(frozen=True)
class EvalPlan:
    """The sets `octlm eval` scores (a mixture's per dataset in `sources`), at `dtype`, and what
    the summary line calls them."""

    val: ValidationSet
    sources: dict[str, ValidationSet]
    dtype: str
    context: int
    what: str
    notes: tuple[str, ...]

    def score(self, model: GPT) -> EvalResult:
        """The loop's validation of these sets with `model`, on the model's device."""
        device = next(model.parameters()).device
        return validate_run(
            self.val,
            self.sources,
            lambda s: validate(model, s, device=device, dtype=self.dtype),
        )

    def summary(self, result: EvalResult) -> str:
        """One line: how many batches, rows and tokens were scored, of what, and whether that
        is the run's own validation."""
        sets = list(self.sources.values()) or [self.val]
        size = self.val.micro_batch
        rows = sum(len(s.indices) for s in sets)
        batches = sum(math.ceil(len(s.indices) / size) for s in sets)
        shape = (
            f"{batches:,} batches × {size:,} rows"
            if rows == batches * size
            else f"{rows:,} rows ({batches:,} batches of up to {size:,})"
        )
        positions = rows * self.context
        if result.tokens == positions:
            count = f"= {result.tokens:,} tokens of {self.what}"
        else:
            count = f"of {self.what}: {result.tokens:,} targets, the rest masked"
        return f"scored {shape} × {self.context:,} tokens {count} ({'; '.join(self.notes)})"


def plan_eval(
    info: CheckpointInfo,
    context: int,
    device: torch.device,
    *,
    split: str = "val",
    data: str | None = None,
    batches: int | None = None,
    micro_batch: int | None = None,
    dtype: str | None = None,
) -> EvalPlan:
    """What to score for a model of `context` read from `info`, on `device`: the run's own
    validation, with the flags given (None: the run's) applied over it."""
    settings, notes = recorded_settings(info, context)
    flags = {"--batches": batches, "--micro-batch": micro_batch, "--dtype": dtype}
    own = {"--batches": settings["val_batches"], "--micro-batch": settings["micro_batch"]}
    own["--dtype"] = settings["dtype"]
    value = {k: own[k] if v is None else v for k, v in flags.items()}
    differ = [k for k, v in flags.items() if v is not None and v != own[k]]
    changed = [f"{k} {flags[k]}" for k in differ]
    changed += [f"--split {split}"] * (split != "val") + [f"--data {data}"] * (data is not None)
    sizes = (value["--batches"], value["--micro-batch"])
    found = None
    if settings["recorded"] and split == "val" and data is None:
        found = _run_sets(info, settings, notes)
    if found is not None:
        val, sources, what = found
        if {"--batches", "--micro-batch"} & set(differ):
            val = first_batches(val.windows, val.token_bytes, *sizes)
            sources = {
                n: first_batches(s.windows, s.token_bytes, *sizes) for n, s in sources.items()
            }
        if not changed and not settings["merge"]:
            notes.insert(0, OWN)
    else:
        dataset = run_dataset(info, data)
        token_bytes = dataset_tokenizer(dataset).token_bytes_table
        val, sources, what = split_set(dataset, token_bytes, split, context, *sizes), {}, split
    if changed:
        notes.insert(0, f"not the run's validation: {', '.join(changed)}")
    notes += device_notes(settings, device)
    return EvalPlan(val, sources, value["--dtype"], context, what, tuple(notes))


def recorded_settings(info: CheckpointInfo, context: int) -> tuple[dict[str, Any], list[str]]:
    """The run's flat settings (a merge's: those of the newest checkpoint it was made of), with
    `recorded`: whether the file had any; and notes on what it did not record, which takes
    `EVAL_DEFAULTS` (the context: the model's)."""
    source, notes = info, []
    if info.config is None and (last := merged_last(info)) is not None:
        source, _ = load_weights(last)
        if source.config is not None:
            notes.append(f"the validation settings of {last.name}, the newest checkpoint merged")
    written = source.as_written()
    saved = written.get("config")
    found = saved if isinstance(saved, dict) else {}
    settings = {
        **default_values(),
        **EVAL_DEFAULTS,
        "context": context,
        **found,
        "recorded": bool(found),
        "merge": source is not info,
        "build": written.get("build"),
        "world": source.world,
    }
    defaults = f"{EVAL_DEFAULTS['val_batches']} batches of {EVAL_DEFAULTS['micro_batch']}, fp32"
    if not found:
        notes.append(f"{source.path.name} records no run settings: the defaults, {defaults}")
        return settings, notes
    missing = [k for k in EVAL_DEFAULTS if k not in found]
    notes += [f"{k} not recorded: the default {settings[k]}" for k in missing]
    if "context" not in found:
        notes.append(f"context not recorded: the model's {context}")
    return settings, notes


def _run_sets(
    info: CheckpointInfo, settings: dict[str, Any], notes: list[str]
) -> tuple[ValidationSet, dict[str, ValidationSet], str] | None:
    """The run's validation sets and what they are, built as the trainer builds them; None
    (and a note) when the recorded settings no longer build them here."""
    try:
        cfg = TrainConfig(**{k: v for k, v in settings.items() if k in config_keys()})
        dataset = run_dataset(info)
        val, sources = run_validation(cfg, dataset, dataset_tokenizer(dataset))
    except OctlmError as exc:
        notes.append(f"the run's validation cannot be rebuilt here ({exc.problem})")
        return None
    if cfg.inputs.overfit_blocks:
        what = "the run's memorised training windows"
    elif cfg.inputs.blocks:
        what = "the run's training blocks (--blocks)"
    elif sources:
        what = f"val of the mixture's {len(sources)} datasets"
    else:
        what = "val"
    return val, sources, what


def device_notes(settings: dict[str, Any], device: torch.device) -> list[str]:
    """Why the bits may differ from the logged ones with every setting the run's: another
    device, torch.compile, a sum over processes in another order."""
    notes = []
    build = settings.get("build") or {}
    ran_on = build.get("device")
    if ran_on and ran_on != build_info(device)["device"]:
        notes.append(f"the run validated on {ran_on}: the last digits may differ")
    if settings.get("compile"):
        notes.append("the run validated compiled: the last digits may differ")
    split = settings["world"] > 1 and settings.get("parallel") == "ddp"  # as `Run.score`
    if split and settings.get("reduction") != "tree":
        notes.append("the run validated summed over processes: the last digits may differ")
    return notes
