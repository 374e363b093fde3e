"""Training settings: one frozen dataclass, loaded from TOML and overridden by flags.

A TOML file holds the same keys as the `octlm train` flags (snake_case). Precedence is
flags > TOML > defaults; unknown keys are errors. `trajectory()` is the subset that decides the
numbers a run computes: its fingerprint must match on resume, while paths, intervals and
logging may change freely.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields
from typing import Any

from octlm.config import checks
from octlm.config.rules import (
    CHANGE_IT,
    DEVICE_PATTERN,
    MUON_DEFAULTS,
    ConfigError,
    check_data,
    check_optimizer,
    check_packing,
    check_schedule,
    field_rule,
    named_settings_only,
    require,
)
from octlm.config.shape import PRESETS, SHAPE_KEYS, memory_problem, resolve_shape, shape_problem
from octlm.hashing import sha256_json

DTYPES = ("fp32", "bf16", "fp16")
ORDERS = ("random", "epoch")  # training data orders (octlm.data.order)
FUSED_DEFAULT = True
"""`fused` of a new run that leaves it unset (False before octlm used fused AdamW by default)."""


def fused_or_default(fused: bool | None) -> bool:
    """`fused` as a new run uses it (a resume takes its checkpoint's: trainer/resume.py)."""
    return FUSED_DEFAULT if fused is None else fused


TRACKERS = ("tensorboard", "wandb")  # --log-to (octlm.trackers); each is its own extra


def _trajectory(default: Any) -> Any:
    """A setting that decides the numbers a run computes: part of the resume fingerprint."""
    return field(default=default, metadata={"trajectory": True})


def _new_trajectory(default: Any) -> Any:
    """A trajectory setting added after runs existed: `trajectory()` leaves it out while it has
    its default, so the fingerprint of every run folder written before it stays the same."""
    return field(default=default, metadata={"trajectory": True, "omit_default": True})


def _setting(default: Any) -> Any:
    """Where files go, how often to look, when to stop: changes not a single computed bit."""
    return field(default=default, metadata={"trajectory": False})


@named_settings_only
@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    model: str = _trajectory("small")
    """Model preset: micro, tiny, small or main; the base the shape settings below override."""
    # The shape: None is the preset's value. Each joins the trajectory only where it differs
    # from the preset's, so runs written before these keys, and a key set to the preset's own
    # value, keep the fingerprint of the plain preset.
    n_layers: int | None = _new_trajectory(None)
    """Transformer blocks (default: the preset's)."""
    d_model: int | None = _new_trajectory(None)
    """Width of the residual stream (default: the preset's)."""
    n_heads: int | None = _new_trajectory(None)
    """Query heads; must divide d_model into an even head size (default: the preset's)."""
    n_kv_heads: int | None = _new_trajectory(None)
    """Key/value heads (grouped-query attention); must divide n_heads (default: the preset's)."""
    d_ff: int | None = _new_trajectory(None)
    """Hidden width of the SwiGLU feed-forward (default: the preset's)."""
    rope_base: float | None = _new_trajectory(None)
    """RoPE frequency base, theta (default: the preset's)."""
    norm_eps: float | None = _new_trajectory(None)
    """Epsilon inside RMSNorm (default: the preset's)."""
    init_std: float | None = _new_trajectory(None)
    """Std of the normal init, residual projections scaled by 1/sqrt(2 n_layers) (default: the
    preset's)."""
    qk_norm: bool | None = _new_trajectory(None)
    """RMSNorm with a learned gain on each head's queries and keys, before RoPE (default: off)."""
    logit_softcap: float | None = _new_trajectory(None)
    """Cap the logits smoothly to (-C, C): C * tanh(logits / C); 0 is off (default: off)."""
    value_residual: bool | None = _new_trajectory(None)
    """Every block after the first attends with the mean of its own values and the first
    block's: ResFormer's value residual, as in modded-nanogpt (default: off)."""
    zero_init_residual: bool | None = _new_trajectory(None)
    """Start the blocks' output projections (wo, w2) at zero instead of the scaled normal, so
    each block begins as the identity (default: off)."""
    out: str = _setting("runs/octlm")
    """Run folder: log.jsonl, checkpoints, snapshots."""
    data: str | None = _setting(None)  # checked through the dataset fingerprint instead
    """Prepared dataset folder (`octlm prepare`), or a weighted mixture of several that share a
    tokenizer, PATH:WEIGHT,PATH:WEIGHT (docs/data.md); default: the embedded corpus."""
    steps: int = _trajectory(440)
    """Optimizer steps in the whole run (the cosine ends here)."""
    warmup: int = _trajectory(20)
    """Linear warmup steps."""
    lr: float = _trajectory(1.5e-3)
    """Peak learning rate."""
    min_lr_ratio: float = _trajectory(0.1)
    """Floor of the schedule as a fraction of the peak."""
    schedule: str = _new_trajectory("cosine")
    """After warmup: cosine (half a cosine to the floor at `steps`) or wsd (warmup-stable-decay:
    the peak held, then a decay to the floor over the last `decay_steps`)."""
    decay_steps: int | None = _new_trajectory(None)
    """wsd only: length of the final decay, at most steps - warmup."""
    decay_shape: str = _new_trajectory("linear")
    """wsd only: linear, or 1-sqrt (floor + (peak - floor) * (1 - sqrt(progress)))."""
    micro_batch: int = _trajectory(16)
    """Sequences per micro-batch."""
    accum: int = _trajectory(32)
    """Micro-batches per optimizer step (gradient accumulation)."""
    context: int = _trajectory(1024)
    """Tokens per sequence (at most the preset's context)."""
    beta1: float = _trajectory(0.9)
    """AdamW decay rate of the gradient mean (first moment)."""
    beta2: float = _trajectory(0.95)
    """AdamW decay rate of the squared-gradient mean (second moment)."""
    eps: float = _trajectory(1e-8)
    """AdamW epsilon added to the root of the second moment."""
    weight_decay: float = _trajectory(0.1)
    """AdamW decoupled weight decay, applied to tensors with 2+ dimensions only."""
    optimizer: str = _new_trajectory("adamw")
    """adamw, or muon: Muon (momentum, then Newton-Schulz orthogonalisation) for the blocks'
    2-D weight matrices, AdamW with the settings above for the embedding and the norm gains."""
    muon_lr: float = _new_trajectory(MUON_DEFAULTS["muon_lr"])
    """--optimizer muon: peak learning rate of the Muon matrices (the schedule scales it as it
    scales --lr); each matrix's update is scaled up by sqrt(max(1, rows / cols))."""
    muon_momentum: float = _new_trajectory(MUON_DEFAULTS["muon_momentum"])
    """--optimizer muon: Nesterov momentum of the Muon matrices."""
    muon_ns_steps: int = _new_trajectory(MUON_DEFAULTS["muon_ns_steps"])
    """--optimizer muon: Newton-Schulz iterations per update (fewer: a cheaper step, a rougher
    orthogonalisation)."""
    muon_gram: bool = _new_trajectory(MUON_DEFAULTS["muon_gram"])
    """--optimizer muon: iterate a rectangular matrix's Newton-Schulz on its small Gram matrix
    (the same polynomial, rounded differently: about a quarter fewer flops on a 384x1024)."""
    muon_ns_dtype: str = _new_trajectory(MUON_DEFAULTS["muon_ns_dtype"])
    """--optimizer muon: the Newton-Schulz products' dtype: auto (bf16 on a GPU, as in the
    reference, except through the Gram matrix; fp32 elsewhere), fast (bf16 where the device
    multiplies bf16 fast: a GPU, or a CPU with AMX, where it is about three times fp32's speed;
    fp32 elsewhere, where bf16 is many times slower; settled when the run starts), fp32, or
    bf16 (on any device)."""
    z_loss: float = _new_trajectory(0.0)
    """Weight of the z-loss, the mean of log(Z)^2 over targets (Z: the softmax's normaliser),
    added to the objective against drifting logits; logged beside the loss. 0: off."""
    grad_clip: float = _trajectory(1.0)
    """Clip the global gradient norm to this; 0 disables clipping (the norm is still logged)."""
    dropout: float = _trajectory(0.0)
    """Model dropout (attention and residual)."""
    seed: int = _trajectory(1337)
    """Seeds the model init and the data order."""
    order: str = _new_trajectory("random")
    """Training data order: random (windows at any offset, drawn afresh each step) or epoch
    (every aligned block of context + 1 tokens once per epoch, shuffled per epoch); on
    prompt/completion data, packed windows drawn with replacement, or each once per epoch."""
    packing: str = _new_trajectory("stream")
    """How pretraining text becomes rows: stream (windows of the token stream at any offset)
    or bos (rows that start at a document wherever the data allows, filled best-fit;
    docs/data.md)."""
    doc_mask: bool = _new_trajectory(False)
    """With --packing bos: attention and RoPE positions stay inside each document of a row."""
    init_from: str | None = _new_trajectory(None)
    """Start from these weights (an octlm run folder or checkpoint file, or a Hugging Face
    LlamaForCausalLM or Qwen3ForCausalLM folder), whose shape the model takes; fresh optimizer,
    step 0."""
    blocks: str | None = _setting(None)  # its blocks' content is part of the data fingerprint
    """Train and validate on in-memory blocks made from this text/JSONL file (the first seed's
    path: a short stream is padded and PAD targets are masked); the tokenizer comes from data."""
    overfit_blocks: int = _trajectory(0)
    """If > 0, train and validate on only the first N blocks of the train stream (seed 1, Day 1)."""
    dtype: str = _trajectory("bf16")
    """fp32, or autocast over fp32 weights with bf16 or fp16 (fp16 adds a GradScaler)."""
    compile: bool = _trajectory(False)
    """Wrap the model with torch.compile."""
    activation_checkpointing: bool = _setting(False)
    """Recompute each block's activations in the backward pass instead of storing them: less
    memory for about one more forward per step, the same bits (a setting, so a resume may
    turn it on or off)."""
    fused: bool | None = _trajectory(None)
    """Use the fused AdamW kernel (one pass over all parameters: 3x faster than the per-tensor
    loop on CPU). Default: on for a new run; a resume keeps what the checkpoint used, so run
    folders written while the default was off resume exactly."""
    deterministic: bool = _trajectory(False)
    """torch.use_deterministic_algorithms(True) plus the CUDA settings it needs."""
    parallel: str = _trajectory("ddp")
    """With several processes (torchrun): ddp (replicated) or fsdp (FSDP2, sharded)."""
    dist_timeout: float = _setting(1800.0)
    """With several processes: seconds a collective waits for a peer before the run ends with
    an error naming the rank and step (a dead, stopped or hung process); torch's default. Must
    exceed the longest step, validation or checkpoint write."""
    device: str = _setting("auto")  # checked through the build record instead
    """cpu, cuda, cuda:N, or auto (cuda when available)."""
    val_every: int = _setting(20)
    """Validate every N steps and at the end; 0 disables periodic validation."""
    val_batches: int = _setting(40)
    """Micro-batches of the validation stream to evaluate (always the same first ones)."""
    eval_tasks: str | None = _setting(None)  # scoring never moves a training bit
    """Multiple-choice task files, FILE[:N],... (their first N questions), scored at every
    validation: acc and acc_norm per task in the log, as lm-eval scores them (docs/
    evaluation.md)."""
    hash_every: int | None = _setting(None)
    """Write the model's weights_sha256 to the log every N steps; default: at every validation;
    0: only at the end."""
    hash_tensors: bool = _setting(False)  # digests only read the tensors
    """With each weights hash, also log a 16-hex digest of every weight and of every gradient
    of the step just done (before clipping), so `octlm diff` names the first tensor that
    differs."""
    ckpt_every: int = _setting(40)
    """Checkpoint every N steps and at the end; 0 = only at the end and on interruption."""
    keep_last: int = _setting(2)
    """Full checkpoints kept (rotated); a damaged newest one falls back to the one before."""
    keep_ckpts: bool = _setting(False)
    """Also keep a weights-only snapshot at every checkpoint."""
    async_checkpoint: bool = _setting(True)  # it writes a private copy
    """Write checkpoints in a background thread from a private copy of the state, so training
    goes on while they are written; every exit waits for the write in flight."""
    stop_at: int | None = _setting(None)
    """Stop cleanly once this many steps are done, with a checkpoint, as an interruption would."""
    resume: bool = _setting(False)
    """Continue from the newest valid checkpoint in `out` (start fresh if it holds none)."""
    allow_config_change: bool = _setting(False)
    """Resume even though trajectory settings changed (e.g. more steps); the log records that
    the run is no longer exact."""
    skip_nonfinite: bool = _setting(False)  # acts only when logged
    """Skip steps with a non-finite loss or gradient norm (counted in the log) instead of
    stopping."""
    peak_tflops: float | None = _setting(None)
    """Device peak for MFU; default: a table for known GPUs, none on CPU."""
    progress: bool | None = _setting(None)
    """Progress bar: on a terminal by default."""
    profile_steps: str | None = _setting(None)  # the profiler only watches
    """A:B: steps A to B (from 1) profiled into OUT/profile/, a Chrome trace and a per-op table."""
    memory_snapshot: bool = _setting(False)
    """On CUDA: PyTorch's memory snapshot of the first steps (up to 3) in OUT/profile/."""
    log_to: str | None = _setting(None)  # trackers only read the log's records
    """Also send the log's records to trackers, comma-separated: tensorboard (OUT/tensorboard),
    wandb (the run id kept in OUT/wandb_id; WANDB_MODE=offline needs no network)."""

    def __post_init__(self) -> None:
        self._check_fields()
        require(self.model in PRESETS, f"model {self.model!r} is unknown", f"use {sorted(PRESETS)}")
        require(
            self.parallel in ("ddp", "fsdp"),
            f"parallel {self.parallel!r} is unknown",
            "use ddp or fsdp",
        )
        require(self.dtype in DTYPES, f"dtype {self.dtype!r} is unknown", f"use one of {DTYPES}")
        require(self.order in ORDERS, f"order {self.order!r} is unknown", f"use one of {ORDERS}")
        check_optimizer(
            self.optimizer,
            muon_lr=self.muon_lr,
            muon_momentum=self.muon_momentum,
            muon_ns_steps=self.muon_ns_steps,
            muon_gram=self.muon_gram,
            muon_ns_dtype=self.muon_ns_dtype,
        )
        check_packing(self.packing, self.doc_mask, self.blocks)
        check_data(self.data, self.blocks, self.overfit_blocks)
        require(
            re.fullmatch(DEVICE_PATTERN, self.device) is not None,
            f"device {self.device!r} is unknown",
            "use cpu, cuda, cuda:N, mps or auto",
        )
        for name in (self.log_to or "").split(","):
            require(
                name.strip() in TRACKERS + ("",),
                f"log_to names an unknown tracker {name.strip()!r}",
                f"use a comma-separated list of {', '.join(TRACKERS)}",
            )
        require(
            self.warmup <= self.steps,
            f"warmup={self.warmup} is longer than steps={self.steps}",
            "use --warmup at most --steps",
        )
        if self.stop_at is not None:
            require(
                self.stop_at <= self.steps,
                f"stop_at={self.stop_at} must be between 1 and steps={self.steps}",
            )
        preset = PRESETS[self.model]
        require(
            self.context <= preset.context,
            f"context {self.context} exceeds the {self.model} model's {preset.context}",
            f"use --context {preset.context} or less",
        )
        shape = self.shape()
        problem = shape_problem(shape)
        if problem is None and self.init_from is None:  # else the source's shape is built
            # The vocabulary is the data's, unknown here: the embedded corpus is tokenized at
            # the preset's, and no tokenizer has fewer than its 256 byte tokens.
            vocab = preset.vocab_size if self.data is None else 256
            sizes = {"micro_batch": self.micro_batch, "context": self.context}
            problem = memory_problem(shape, vocab_size=vocab, parallel=self.parallel, **sizes)
        if problem is not None:
            raise ConfigError(*problem)
        check_schedule(self.schedule, self.decay_steps, self.decay_shape, self.steps, self.warmup)
        bad = self.profile_steps is not None and self.profile_window is None
        require(not bad, f"profile_steps {self.profile_steps!r} is not A:B, 1 <= A <= B <= steps")

    @property
    def profile_window(self) -> tuple[int, int] | None:
        """(A, B) of `profile_steps`, None if unset or not 1 <= A <= B <= steps."""
        found = re.fullmatch(r"(\d+):(\d+)", self.profile_steps or "")
        a, b = (int(found[1]), int(found[2])) if found else (0, 0)
        return (a, b) if 1 <= a <= b <= self.steps else None

    def _check_fields(self) -> None:
        """Each field alone: its type (TOML and Python hand over anything) and its range."""
        for name, rule in FIELD_RULES.items():
            value = getattr(self, name)
            if value is None and name in OPTIONAL_KEYS:
                continue
            problem = checks.problem(name, value, rule)
            if problem is not None:
                raise ConfigError(problem, CHANGE_IT)
            if isinstance(value, float) and value == 0:  # -0.0 is the same run as 0.0
                object.__setattr__(self, name, 0.0)

    def shape(self) -> dict[str, Any]:
        """The model's resolved shape: the preset's values under the ones this config sets."""
        return resolve_shape(PRESETS[self.model].to_dict(), self.to_dict())

    def resolved(self) -> TrainConfig:
        """This config with every shape key written out (what `--print-config` prints)."""
        return self.replace(**self.shape())

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
        preset = PRESETS[self.model].to_dict()
        for key in SHAPE_KEYS:
            if d[key] == preset[key]:  # the preset's own value: the same run as leaving it out
                d[key] = None
        for key, default in OMITTED_AT_DEFAULT.items():
            if d[key] == default:  # absent, as in every run written before the key existed
                d.pop(key)
        if self.optimizer == "muon":  # its settings belong to it, default or not
            d["muon_lr"], d["muon_momentum"] = self.muon_lr, self.muon_momentum
            # ... but the iterations, added later, only when set: Muon runs written before
            # keep their fingerprints (they ran the default five).
        d["accum"] = self.accum * world
        d["fused"] = fused_or_default(d["fused"])
        return d

    @property
    def hash_interval(self) -> int:
        """Steps between weights hashes in the log: hash_every, by default val_every."""
        return self.val_every if self.hash_every is None else self.hash_every

    def fingerprint_for(self, world: int) -> str:
        return sha256_json(self.trajectory(world))

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


# Derived from the fields' own marks: a new field must say whether it is part of the run.
NON_TRAJECTORY_KEYS = tuple(f.name for f in fields(TrainConfig) if not f.metadata["trajectory"])
OMITTED_AT_DEFAULT = {
    f.name: f.default for f in fields(TrainConfig) if f.metadata.get("omit_default")
}
OPTIONAL_KEYS = frozenset(f.name for f in fields(TrainConfig) if "None" in str(f.type))
# The shape keys are checked once resolved (shape.shape_problem).
FIELD_RULES = {f.name: field_rule(f) for f in fields(TrainConfig) if f.name not in SHAPE_KEYS}


def config_keys() -> list[str]:
    return [f.name for f in fields(TrainConfig)]
