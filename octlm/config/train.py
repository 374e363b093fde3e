"""Training settings: `TrainConfig`, eight frozen sections, built from flat keys.

A TOML file holds the same keys as the `octlm train` flags (snake_case), and so do the Python API
and a sweep: `TrainConfig(lr=3e-3, optimizer="muon", ...)`. Precedence is flags > TOML >
defaults; unknown keys are errors. Each key belongs to one section, which holds its default,
docstring, rule and role beside it; each builder takes its section (`build_optimizer` the
optimizer's, `learning_rate` the schedule's, ...). The cut, by what a setting decides:

- `shape`: the network (a preset and its overrides, dropout);
- `optim`: the update (AdamW, Muon, clipping, z-loss);
- `lr_schedule`: the learning rate over the steps (and the run's length);
- `inputs`: what is read, how much per step, in what order and packing (and the seed);
- `hardware`: what it computes on (dtype, compile, determinism, ddp/fsdp, device);
- `evaluation`: when and on what it is scored;
- `run`: the folder and lifecycle (checkpoints, stop, resume, where it starts from);
- `observe`: what watches without changing (hashes, profiles, trackers, MFU's peak).

`trajectory()` is the subset that decides the numbers a run computes, flat as it always was:
its fingerprint must match on resume, while paths, intervals and logging may change freely.
Checks of keys from two sections (a context within the preset's, a model that fits the
machine, `stop_at` within `steps`) are `TrainConfig`'s own.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from octlm.config.inputs import RULES as INPUT_RULES
from octlm.config.inputs import InputSettings
from octlm.config.learning import (
    MUON_DEFAULTS,
    OptimSettings,
    ScheduleSettings,
    fused_or_default,
)
from octlm.config.learning import RULES as LEARNING_RULES
from octlm.config.rules import ConfigError, fill_sections, require
from octlm.config.run import RULES as RUN_RULES
from octlm.config.run import (
    EvalSettings,
    HardwareSettings,
    ObserveSettings,
    RunSettings,
    profile_problem,
    profile_window,
    reduction_or_default,
)
from octlm.config.shape import (
    PRESETS,
    SHAPE_KEYS,
    ShapeSettings,
    memory_problem,
    shape_problem,
)
from octlm.config.shape import RULES as SHAPE_RULES
from octlm.hashing import sha256_json

SECTIONS: dict[str, type] = {
    "shape": ShapeSettings,
    "optim": OptimSettings,
    "lr_schedule": ScheduleSettings,
    "inputs": InputSettings,
    "hardware": HardwareSettings,
    "evaluation": EvalSettings,
    "run": RunSettings,
    "observe": ObserveSettings,
}
"""Each section's attribute on `TrainConfig` and its class, in the order `--help`,
`--print-config` and the report show them."""
SECTION_OF = {f.name: name for name, cls in SECTIONS.items() for f in fields(cls) if f.init}
"""Each flat key's section (key names are unique across sections, so flags stay flat)."""
# The order checkpoints and log headers have always written the config's keys in (JSON objects
# keep insertion order): kept, so a run folder's files are the same bytes as before the sections.
# A new key is appended here and given to its section.
KEY_ORDER = (
    "model",
    *SHAPE_KEYS,
    "out",
    "data",
    "steps",
    "warmup",
    "lr",
    "min_lr_ratio",
    "schedule",
    "decay_steps",
    "decay_shape",
    "micro_batch",
    "accum",
    "context",
    "beta1",
    "beta2",
    "eps",
    "weight_decay",
    "optimizer",
    "muon_lr",
    "muon_momentum",
    "muon_ns_steps",
    "muon_gram",
    "muon_ns_dtype",
    "z_loss",
    "grad_clip",
    "dropout",
    "seed",
    "order",
    "packing",
    "doc_mask",
    "init_from",
    "blocks",
    "overfit_blocks",
    "dtype",
    "compile",
    "activation_checkpointing",
    "fused",
    "deterministic",
    "parallel",
    "dist_timeout",
    "device",
    "val_every",
    "val_batches",
    "eval_tasks",
    "hash_every",
    "hash_tensors",
    "ckpt_every",
    "keep_last",
    "keep_ckpts",
    "async_checkpoint",
    "stop_at",
    "resume",
    "allow_config_change",
    "skip_nonfinite",
    "peak_tflops",
    "progress",
    "profile_steps",
    "memory_snapshot",
    "log_to",
    "reduction",
    "deterministic_parts",
    "eval_tasks_every",
)
if set(KEY_ORDER) != set(SECTION_OF) or len(KEY_ORDER) != len(SECTION_OF):
    raise TypeError(f"KEY_ORDER and the sections differ: {set(KEY_ORDER) ^ set(SECTION_OF)}")
FIELDS = {f.name: f for cls in SECTIONS.values() for f in fields(cls) if f.init}
NON_TRAJECTORY_KEYS = tuple(k for k in KEY_ORDER if not FIELDS[k].metadata["trajectory"])
OMITTED_AT_DEFAULT = {
    k: FIELDS[k].default for k in KEY_ORDER if FIELDS[k].metadata.get("omit_default")
}
ABSENT_MEANS = {**OMITTED_AT_DEFAULT, "reduction": "collective"}
"""What a trajectory key missing from a run folder's fingerprint stood for."""
# The shape keys are checked once resolved (shape.shape_problem).
FIELD_RULES = {**SHAPE_RULES, **LEARNING_RULES, **INPUT_RULES, **RUN_RULES}


@dataclass(frozen=True, slots=True, init=False)
class TrainConfig:
    """The settings of one training run, as eight sections; built from flat keys."""

    shape: ShapeSettings
    optim: OptimSettings
    lr_schedule: ScheduleSettings
    inputs: InputSettings
    hardware: HardwareSettings
    evaluation: EvalSettings
    run: RunSettings
    observe: ObserveSettings

    def __init__(self, *args: Any, **keys: Any) -> None:
        fill_sections(self, args, keys, SECTIONS, KEY_ORDER, "octlm train")
        self._check_together()

    def __getattr__(self, name: str) -> Any:
        """A flat key read as the Python API always allowed (`config.lr`); octlm's own code reads
        sections (`cfg.lr_schedule.lr`)."""
        section = SECTION_OF.get(name)
        if section is None:
            raise AttributeError(f"'TrainConfig' object has no attribute {name!r}")
        return getattr(object.__getattribute__(self, section), name)

    def _check_together(self) -> None:
        """The checks whose keys sit in two sections."""
        steps, stop_at = self.lr_schedule.steps, self.run.stop_at
        if stop_at is not None:
            require(stop_at <= steps, f"stop_at={stop_at} must be between 1 and steps={steps}")
        preset = PRESETS[self.shape.model]
        context = self.inputs.context
        require(
            context <= preset.context,
            f"context {context} exceeds the {self.shape.model} model's {preset.context}",
            f"use --context {preset.context} or less",
        )
        shape = self.shape.resolved()
        problem = shape_problem(shape)
        if problem is None and self.run.init_from is None:  # else the source's shape is built
            # The vocabulary is the data's, unknown here: the embedded corpus is tokenized at
            # the preset's, and no tokenizer has fewer than its 256 byte tokens.
            vocab = preset.vocab_size if self.inputs.data is None else 256
            sizes = {"micro_batch": self.inputs.micro_batch, "context": context}
            parallel = self.hardware.parallel
            problem = memory_problem(shape, vocab_size=vocab, parallel=parallel, **sizes)
        if problem is not None:
            raise ConfigError(*problem)
        observe = self.observe
        problem = profile_problem(
            observe.profile_steps, observe.memory_snapshot, self.lr_schedule.steps, self.run.out
        )
        if problem is not None:
            raise ConfigError(*problem)

    @property
    def profile_window(self) -> tuple[int, int] | None:
        """(A, B) of `profile_steps`, None if unset or not 1 <= A <= B <= steps."""
        return profile_window(self.observe.profile_steps, self.lr_schedule.steps)

    @property
    def hash_interval(self) -> int:
        """Steps between weights hashes in the log: hash_every, by default val_every."""
        every = self.observe.hash_every
        return self.evaluation.val_every if every is None else every

    @property
    def tokens_per_step(self) -> int:
        return self.inputs.tokens_per_step

    def resolved(self) -> TrainConfig:
        """This config with every shape key written out (what `--print-config` prints)."""
        return self.replace(**self.shape.resolved())

    def to_dict(self) -> dict[str, Any]:
        """Every key, flat, in `KEY_ORDER` (what checkpoints and log headers record)."""
        return {k: getattr(getattr(self, SECTION_OF[k]), k) for k in KEY_ORDER}

    def by_section(self) -> dict[str, dict[str, Any]]:
        """{section: {key: value}} of the keys that apply to this run (`applicable`)."""
        return sectioned(self.to_dict())

    def trajectory(self, world: int = 1) -> dict[str, Any]:
        """The settings that decide the computed numbers (not paths, intervals or logging).
        `accum` counts micro-batches per step over all `world` ranks: the global batch is what
        the run is, however many processes share it."""
        d = self.to_dict()
        for key in NON_TRAJECTORY_KEYS:
            d.pop(key)
        preset = PRESETS[self.shape.model].to_dict()
        for key in SHAPE_KEYS:
            if d[key] == preset[key]:  # the preset's own value: the same run as leaving it out
                d[key] = None
        for key, default in OMITTED_AT_DEFAULT.items():
            if d[key] == default:  # absent, as in every run written before the key existed
                d.pop(key)
        if self.optim.optimizer == "muon":  # its settings belong to it, default or not
            d["muon_lr"], d["muon_momentum"] = self.optim.muon_lr, self.optim.muon_momentum
            # ... but the iterations, added later, only when set: Muon runs written before
            # keep their fingerprints (they ran the default five).
        d["accum"] = self.inputs.accum * world
        d["fused"] = fused_or_default(d["fused"])
        d["reduction"] = reduction_or_default(d["reduction"])
        if d["reduction"] == "collective":  # absent, as in every run written before tree
            d.pop("reduction")
        return d

    def fingerprint_for(self, world: int) -> str:
        return sha256_json(self.trajectory(world))

    def replace(self, **changes: Any) -> TrainConfig:
        """A new config with `changes` (flat keys) over this one's, checked again."""
        return TrainConfig(**{**self.to_dict(), **changes})


def flat_signature() -> inspect.Signature:
    """`TrainConfig(...)`'s keywords as `help()` and editors show them: every key, its type and
    default, in `KEY_ORDER` (the constructor itself takes `**keys`)."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for key in KEY_ORDER:
        f = FIELDS[key]
        kind = inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter(key, kind, default=f.default, annotation=f.type))
    return inspect.Signature(params, return_annotation=None)


TrainConfig.__init__.__signature__ = flat_signature()  # type: ignore[attr-defined]


def applicable(key: str, config: Mapping[str, Any]) -> bool:
    """Whether `key` means anything for a run of these flat settings: Muon's keys only under
    Muon, the wsd decay's only under wsd, `doc_mask` only with bos rows. A key that does not
    apply holds its default (the sections refuse anything else), so leaving it out of a printed
    config or a table loses nothing."""
    if key in MUON_DEFAULTS:
        return config.get("optimizer") == "muon"
    if key in ("decay_steps", "decay_shape"):
        return config.get("schedule") == "wsd"
    if key == "doc_mask":
        return config.get("packing") == "bos"
    return True


def sectioned(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A flat config (a `TrainConfig`'s, or a log header's from any octlm) grouped by section in
    `SECTIONS` order, keys that do not apply left out; keys no section knows (a newer octlm's)
    go under "other"."""
    out: dict[str, dict[str, Any]] = {name: {} for name in (*SECTIONS, "other")}
    known = [k for k in KEY_ORDER if k in config]
    for key in [*known, *(k for k in config if k not in SECTION_OF)]:
        if applicable(key, config):
            out[SECTION_OF.get(key, "other")][key] = config[key]
    return {name: keys for name, keys in out.items() if keys}


def config_keys() -> list[str]:
    return list(KEY_ORDER)


def default_values() -> dict[str, Any]:
    """Every key's default, in `KEY_ORDER`."""
    return {k: FIELDS[k].default for k in KEY_ORDER}
