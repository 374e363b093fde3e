"""One optimizer step: accumulate over micro-batches, clip, update.

The gradient is the mean over the step's real (non-PAD) targets: every micro-batch's loss SUM
is divided by the token count of the whole step, counted before any backward pass. A mean of
micro-batch means would weight a sparsely-targeted micro-batch too heavily.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from octlm.model import IGNORE_INDEX
from octlm.noise import MicroGradTracker, simple_noise_scale
from octlm.train.optim import clip_grad_norm, set_lr

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """Mixed precision over FP32 weights; a no-op context for fp32."""
    low = AUTOCAST_DTYPES[dtype]
    if low is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=low)


@dataclass(frozen=True)
class StepResult:
    loss: float
    """Mean loss over the step's real targets."""
    grad_norm: float
    """Global gradient norm before clipping (inf/nan if the fp16 scaler skipped the step)."""
    n_targets: int
    skipped: bool = False
    """No update was applied (fp16 overflow, or a non-finite step with skip_nonfinite)."""
    nonfinite: bool = False
    noise_scale: float | None = None
    """Simple gradient noise scale B_simple in tokens (McCandlish et al. 2018), when measured."""


class NonFiniteError(Exception):
    """A step produced a non-finite loss or gradient norm; the weights were not updated."""

    def __init__(self, loss: float, grad_norm: float) -> None:
        super().__init__(f"loss {loss}, grad_norm {grad_norm}")
        self.loss, self.grad_norm = loss, grad_norm


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    lr: float,
    grad_clip: float,
    device: torch.device,
    dtype: str = "fp32",
    scaler: torch.amp.GradScaler | None = None,
    clip_model: nn.Module | None = None,
    before_backward: Callable[[int], contextlib.AbstractContextManager] | None = None,
    skip_nonfinite: bool = False,
    measure_noise: bool = False,
    world: int = 1,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> StepResult:
    """Run one step over `micro_batches` (CPU tensors, moved here) and return its numbers.

    `clip_model` is the module whose parameters are clipped (the raw model under a compile or
    DDP wrapper); `before_backward(micro)` may return a context (DDP's no_sync). A non-finite
    loss or norm raises NonFiniteError before the update, unless `skip_nonfinite`.
    `measure_noise` also estimates the gradient noise scale from the micro-batch gradients
    (one extra copy of the grads; the grads themselves are left untouched).
    With `world` > 1 processes, `reduce_sum` sums across ranks: the target count before any
    backward (so the gradient is the mean over the global step's real targets) and the loss.
    """
    set_lr(optimizer, lr)
    micro_targets = [int((y != IGNORE_INDEX).sum()) for _, y in micro_batches]
    n_targets = sum(micro_targets)
    if reduce_sum is not None:
        n_targets = int(reduce_sum(torch.tensor([n_targets], device=device)).item())
    denom = max(1, n_targets)  # an all-PAD step contributes zero gradient, not NaN
    loss_total = torch.zeros((), device=device, dtype=torch.float32)
    params = (clip_model or model).parameters()
    tracker = MicroGradTracker(params, n_targets) if measure_noise and n_targets else None
    for micro, (x, y) in enumerate(micro_batches):
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        ctx = before_backward(micro) if before_backward else contextlib.nullcontext()
        with ctx:
            with autocast(device, dtype):
                loss_sum, _ = model(x, y)
            loss = loss_sum / denom  # summed over micro-batches this is the true masked mean
            # DDP and FSDP average gradients over ranks; scaling by the world makes it a sum.
            scaled = loss * world if world > 1 else loss
            (scaler.scale(scaled) if scaler else scaled).backward()
        loss_total += loss.detach()
        if tracker is not None:
            tracker.after_micro(micro_targets[micro])
    # Read before unscaling and clipping; a constant scale cancels in B_simple anyway.
    noise = simple_noise_scale(*tracker.result()) if tracker is not None else None
    if scaler is not None:
        scaler.unscale_(optimizer)
    norm = clip_grad_norm(clip_model or model, grad_clip)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor holding the global norm
        norm = norm.full_tensor()
    # The host sync happens here, before the update, so a non-finite step never reaches the
    # weights. With an fp16 scaler, inf gradients are routine (the scaler skips and backs off),
    # so only the loss is checked there.
    if reduce_sum is not None:
        loss_total = reduce_sum(loss_total)
    loss_value, norm_value = float(loss_total.item()), float(norm.item())
    if not (math.isfinite(loss_value) and (scaler is not None or math.isfinite(norm_value))):
        optimizer.zero_grad(set_to_none=True)
        if not skip_nonfinite:
            raise NonFiniteError(loss_value, norm_value)
        return StepResult(loss_value, norm_value, n_targets, True, True, noise)
    skipped = False
    if scaler is not None:
        scale_before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped = scaler.get_scale() < scale_before  # the scaler backs off only on inf/nan
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_value, norm_value, n_targets, skipped, False, noise)
