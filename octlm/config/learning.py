"""How the model learns: the optimizer's settings (`OptimSettings`) and the learning-rate
schedule's (`ScheduleSettings`), each a section of `TrainConfig` handed whole to its builder
(`trainer/optim.build_optimizer`, `trainer/schedule.learning_rate`). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from octlm.config import checks
from octlm.config.rules import (
    check_section,
    declared_rules,
    new_trajectory,
    require,
    trajectory,
)

OPTIMIZERS = ("adamw", "muon")  # octlm.trainer.optim
NS_DTYPES = ("auto", "fast", "fp32", "bf16")  # Muon's Newton-Schulz products (trainer.muon)
MUON_DEFAULTS = {
    "muon_lr": 0.02,
    "muon_momentum": 0.95,
    "muon_ns_steps": 5,
    "muon_gram": False,
    "muon_ns_dtype": "auto",
}
"""The defaults of the Muon keys (their fields take them from here)."""
SCHEDULES = ("cosine", "wsd")  # learning-rate shapes after warmup (octlm.trainer.schedule)
DECAY_SHAPES = ("linear", "1-sqrt")
FUSED_DEFAULT = True
"""`fused` of a new run that leaves it unset (False before octlm used fused AdamW by default)."""


def fused_or_default(fused: bool | None) -> bool:
    """`fused` as a new run uses it (a resume takes its checkpoint's: trainer/resume.py)."""
    return FUSED_DEFAULT if fused is None else fused


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


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimSettings:
    """The optimizer: AdamW's settings for every tensor it updates, Muon's for the blocks'
    matrices when it is chosen, and what every step does to the gradient (clipping, z-loss)."""

    optimizer: str = new_trajectory("adamw")
    """adamw, or muon: Muon (momentum, then Newton-Schulz orthogonalisation) for the blocks'
    2-D weight matrices, AdamW with the settings below for the embedding and the norm gains."""
    beta1: float = trajectory(0.9, checks.Number(0, 1, hi_open=True))
    """AdamW decay rate of the gradient mean (first moment)."""
    beta2: float = trajectory(0.95, checks.Number(0, 1, hi_open=True))
    """AdamW decay rate of the squared-gradient mean (second moment)."""
    eps: float = trajectory(1e-8, checks.Number(0, lo_open=True))
    """AdamW epsilon added to the root of the second moment."""
    weight_decay: float = trajectory(0.1, checks.Number(0))
    """AdamW decoupled weight decay, applied to tensors with 2+ dimensions only."""
    fused: bool | None = trajectory(None)
    """Use the fused AdamW kernel (one pass over all parameters: 3x faster than the per-tensor
    loop on CPU). Default: on for a new run; a resume keeps what the checkpoint used, so run
    folders written while the default was off resume exactly."""
    grad_clip: float = trajectory(1.0, checks.Number(0))
    """Clip the global gradient norm to this; 0 disables clipping (the norm is still logged)."""
    z_loss: float = new_trajectory(0.0, checks.Number(0, 1))
    """Weight of the z-loss, the mean of log(Z)^2 over targets (Z: the softmax's normaliser),
    added to the objective against drifting logits; logged beside the loss. 0: off."""
    muon_lr: float = new_trajectory(MUON_DEFAULTS["muon_lr"], checks.Number(0, 10, lo_open=True))
    """--optimizer muon: peak learning rate of the Muon matrices (the schedule scales it as it
    scales --lr); each matrix's update is scaled up by sqrt(max(1, rows / cols))."""
    muon_momentum: float = new_trajectory(
        MUON_DEFAULTS["muon_momentum"], checks.Number(0, 1, hi_open=True)
    )
    """--optimizer muon: Nesterov momentum of the Muon matrices."""
    muon_ns_steps: int = new_trajectory(MUON_DEFAULTS["muon_ns_steps"], checks.Int(1, 20))
    """--optimizer muon: Newton-Schulz iterations per update (fewer: a cheaper step, a rougher
    orthogonalisation)."""
    muon_gram: bool = new_trajectory(MUON_DEFAULTS["muon_gram"], checks.Bool())
    """--optimizer muon: iterate a rectangular matrix's Newton-Schulz on its small Gram matrix
    (the same polynomial, rounded differently: about a quarter fewer flops on a 384x1024)."""
    muon_ns_dtype: str = new_trajectory(MUON_DEFAULTS["muon_ns_dtype"])
    """--optimizer muon: the Newton-Schulz products' dtype: auto (bf16 on a GPU, as in the
    reference, except through the Gram matrix; fp32 elsewhere), fast (bf16 where the device
    multiplies bf16 fast: a GPU, or a CPU with AMX, where it is about three times fp32's speed;
    fp32 elsewhere, where bf16 is many times slower; settled when the run starts), fp32, or
    bf16 (on any device)."""

    def __post_init__(self) -> None:
        check_section(self)
        check_optimizer(self.optimizer, **self.muon_settings())

    def muon_settings(self) -> dict[str, float | int | bool | str]:
        """The muon_* keys by name: they apply only under `optimizer = "muon"`."""
        return {key: getattr(self, key) for key in MUON_DEFAULTS}


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


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleSettings:
    """The learning rate over the run: its peak, warmup, length, floor and shape after warmup;
    `trainer/schedule.learning_rate` is a pure function of the step and this section."""

    lr: float = trajectory(1.5e-3, checks.Number(0, lo_open=True))
    """Peak learning rate."""
    warmup: int = trajectory(20, checks.Int(0))
    """Linear warmup steps."""
    steps: int = trajectory(440, checks.Int(1))
    """Optimizer steps in the whole run (the cosine ends here)."""
    min_lr_ratio: float = trajectory(0.1, checks.Number(0, 1))
    """Floor of the schedule as a fraction of the peak."""
    schedule: str = new_trajectory("cosine")
    """After warmup: cosine (half a cosine to the floor at `steps`) or wsd (warmup-stable-decay:
    the peak held, then a decay to the floor over the last `decay_steps`)."""
    decay_steps: int | None = new_trajectory(None, checks.Int(1))
    """wsd only: length of the final decay, at most steps - warmup."""
    decay_shape: str = new_trajectory("linear")
    """wsd only: linear, or 1-sqrt (floor + (peak - floor) * (1 - sqrt(progress)))."""

    def __post_init__(self) -> None:
        check_section(self)
        require(
            self.warmup <= self.steps,
            f"warmup={self.warmup} is longer than steps={self.steps}",
            "use --warmup at most --steps",
        )
        check_schedule(self.schedule, self.decay_steps, self.decay_shape, self.steps, self.warmup)


RULES = {**declared_rules(OptimSettings), **declared_rules(ScheduleSettings)}
