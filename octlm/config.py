"""Training settings: one frozen dataclass, loaded from TOML and overridden by flags.

A TOML file holds the same keys as the `octlm train` flags (snake_case). Precedence is
flags > TOML > defaults; unknown keys are errors. `trajectory()` is the subset that decides the
numbers a run computes: its fingerprint must match on resume, while paths, intervals and
logging may change freely.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from octlm.errors import OctlmError
from octlm.hashing import sha256_json

DTYPES = ("fp32", "bf16", "fp16")


class ConfigError(OctlmError):
    """A bad setting in a TOML file or on the command line."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    model: str = "small"
    """Model preset: micro, tiny, small or main."""
    out: str = "runs/octlm"
    """Run folder: log.jsonl, checkpoints, snapshots."""
    data: str | None = None
    """Prepared dataset folder (`octlm prepare`); default: the embedded corpus."""
    steps: int = 440
    """Optimizer steps in the whole run (the cosine ends here)."""
    warmup: int = 20
    """Linear warmup steps."""
    lr: float = 1.5e-3
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Floor of the cosine as a fraction of the peak."""
    micro_batch: int = 16
    """Sequences per micro-batch."""
    accum: int = 32
    """Micro-batches per optimizer step (gradient accumulation)."""
    context: int = 1024
    """Tokens per sequence (at most the preset's context)."""
    beta1: float = 0.9
    """AdamW decay rate of the gradient mean (first moment)."""
    beta2: float = 0.95
    """AdamW decay rate of the squared-gradient mean (second moment)."""
    eps: float = 1e-8
    """AdamW epsilon added to the root of the second moment."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay, applied to tensors with 2+ dimensions only."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping (the norm is still logged)."""
    dropout: float = 0.0
    """Model dropout (attention and residual)."""
    seed: int = 1337
    """Seeds the model init and the data order."""
    blocks: str | None = None
    """Train and validate on in-memory blocks made from this text/JSONL file (the first seed's
    path: a short stream is padded and PAD targets are masked); the tokenizer comes from data."""
    overfit_blocks: int = 0
    """If > 0, train and validate on only the first N blocks of the train stream (seed 1, Day 1)."""
    dtype: str = "bf16"
    """fp32, or autocast over fp32 weights with bf16 or fp16 (fp16 adds a GradScaler)."""
    compile: bool = False
    """Wrap the model with torch.compile."""
    fused: bool = False
    """Use the fused AdamW kernel."""
    deterministic: bool = False
    """torch.use_deterministic_algorithms(True) plus the CUDA settings it needs."""
    parallel: str = "ddp"
    """With several processes (torchrun): ddp (replicated) or fsdp (FSDP2, sharded)."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (cuda when available)."""
    val_every: int = 20
    """Validate every N steps and at the end; 0 disables periodic validation."""
    val_batches: int = 40
    """Micro-batches of the validation stream to evaluate (always the same first ones)."""
    hash_every: int | None = None
    """Write the model's weights_sha256 to the log every N steps; default: at every validation;
    0: only at the end."""
    ckpt_every: int = 40
    """Checkpoint every N steps and at the end; 0 = only at the end and on interruption."""
    keep_last: int = 2
    """Full checkpoints kept (rotated); a damaged newest one falls back to the one before."""
    keep_ckpts: bool = False
    """Also keep a weights-only snapshot at every checkpoint."""
    async_checkpoint: bool = True
    """Write checkpoints in a background thread from a private copy of the state, so training
    goes on while they are written; every exit waits for the write in flight."""
    stop_at: int | None = None
    """Stop cleanly once this many steps are done, with a checkpoint, as an interruption would."""
    resume: bool = False
    """Continue from the newest valid checkpoint in `out` (start fresh if it holds none)."""
    allow_config_change: bool = False
    """Resume even though trajectory settings changed (e.g. more steps); the log records that
    the run is no longer exact."""
    skip_nonfinite: bool = False
    """Skip steps with a non-finite loss or gradient norm (counted in the log) instead of
    stopping."""
    peak_tflops: float | None = None
    """Device peak for MFU; default: a table for known GPUs, none on CPU."""
    progress: bool | None = None
    """Progress bar: on a terminal by default."""

    def __post_init__(self) -> None:
        from octlm.model import PRESETS  # lazy: the CLI parser must not pay for importing torch

        _check(self.model in PRESETS, f"model {self.model!r} is unknown", f"use {sorted(PRESETS)}")
        for name in ("steps", "micro_batch", "accum", "context"):
            value = getattr(self, name)
            _check(_is_int(value) and value > 0, f"{name}={value!r} must be a positive integer")
        for name in ("warmup", "val_every", "val_batches", "ckpt_every", "overfit_blocks", "seed"):
            value = getattr(self, name)
            _check(_is_int(value) and value >= 0, f"{name}={value!r} must be an integer >= 0")
        _check(_is_int(self.keep_last) and self.keep_last >= 1, "keep_last must be >= 1")
        _check(
            self.warmup <= self.steps,
            f"warmup={self.warmup} is longer than steps={self.steps}",
            "use --warmup at most --steps",
        )
        if self.hash_every is not None:
            _check(_is_int(self.hash_every) and self.hash_every >= 0, "hash_every must be >= 0")
        _check(0 < self.lr < float("inf"), f"lr={self.lr} must be a positive finite number")
        if self.peak_tflops is not None:
            _check(self.peak_tflops > 0, f"peak_tflops={self.peak_tflops} must be positive")
        _check(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "beta1 and beta2 must be in [0, 1)")
        _check(self.eps > 0, f"eps={self.eps} must be positive")
        _check(self.weight_decay >= 0, f"weight_decay={self.weight_decay} must be >= 0")
        _check(self.grad_clip >= 0, f"grad_clip={self.grad_clip} must be >= 0 (0 = no clipping)")
        _check(0 <= self.dropout < 1, f"dropout={self.dropout} must be in [0, 1)")
        _check(
            self.parallel in ("ddp", "fsdp"),
            f"parallel {self.parallel!r} is unknown",
            "use ddp or fsdp",
        )
        _check(self.dtype in DTYPES, f"dtype {self.dtype!r} is unknown", f"use one of {DTYPES}")
        preset_context = PRESETS[self.model].context
        _check(
            self.context <= preset_context,
            f"context {self.context} exceeds the {self.model} model's {preset_context}",
            f"use --context {preset_context} or less",
        )
        if self.stop_at is not None:
            _check(
                _is_int(self.stop_at) and 0 < self.stop_at <= self.steps,
                f"stop_at={self.stop_at} must be between 1 and steps={self.steps}",
            )

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.accum * self.context

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def trajectory(self, world: int = 1) -> dict[str, Any]:
        """The settings that decide the computed numbers (not paths, intervals or logging).
        `accum` counts micro-batches per step over all `world` ranks: the global batch is what
        the run is, however many processes share it."""
        d = self.to_dict()
        for key in NON_TRAJECTORY_KEYS:
            d.pop(key)
        d["accum"] = self.accum * world
        return d

    @property
    def fingerprint(self) -> str:
        return sha256_json(self.trajectory())

    def fingerprint_for(self, world: int) -> str:
        return sha256_json(self.trajectory(world))

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


# Where files go, how often to look, and when to stop do not change a single computed bit.
NON_TRAJECTORY_KEYS = (
    "out",
    "data",  # checked separately through the dataset fingerprint
    "blocks",  # likewise: its blocks' content is part of the data fingerprint
    "hash_every",
    "val_every",
    "val_batches",
    "ckpt_every",
    "keep_ckpts",
    "keep_last",
    "async_checkpoint",  # the write works on a private copy taken between two steps
    "allow_config_change",
    "skip_nonfinite",  # changes nothing unless a step is non-finite, when it is logged
    "stop_at",
    "resume",
    "peak_tflops",
    "progress",
    "device",  # checked separately through the build record
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(
    ok: bool, problem: str, fix: str = "change it on the command line or in --config"
) -> None:
    if not ok:
        raise ConfigError(problem, fix)


def config_keys() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def load_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}", "check the --config path")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc})", "fix the file") from None
    unknown = sorted(set(data) - set(config_keys()))
    if unknown:
        raise ConfigError(
            f"{path}: unknown key(s) {', '.join(unknown)}",
            "see `octlm train --help` for the keys (flags with - replaced by _)",
        )
    return data


def make_config(toml_path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """TOML < overrides (flags); None overrides mean "not given" and are skipped."""
    values: dict[str, Any] = load_toml(toml_path) if toml_path else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return TrainConfig(**values)
    except TypeError as exc:  # a wrongly typed TOML value trips a comparison
        raise ConfigError(f"bad config value ({exc})", "check the types in the TOML file") from None


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Keys whose values differ, as `key: old -> new`."""
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def field_docs() -> dict[str, str]:
    """Each TrainConfig field's docstring (the string under it), for `--help`."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(TrainConfig))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:], strict=False):
        is_doc = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
        if isinstance(node, ast.AnnAssign) and is_doc and isinstance(nxt.value.value, str):
            docs[node.target.id] = nxt.value.value  # type: ignore[attr-defined]
    return docs
