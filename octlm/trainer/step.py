"""One optimizer step: accumulate over micro-batches, clip, update.

The gradient is the mean over the step's real (non-PAD) targets: every micro-batch's loss SUM
is divided by the token count of the whole step, counted before any backward pass. A mean of
micro-batch means would weight a sparsely-targeted micro-batch too heavily.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from octlm.device import autocast
from octlm.hashing import tensor_digests
from octlm.model.gpt import IGNORE_INDEX
from octlm.trainer.noise import MicroGradTracker, simple_noise_scale
from octlm.trainer.optim import clip_grad_norm, set_lr
from octlm.trainer.reduction import TreeReducer

Batch = tuple[torch.Tensor, ...]
"""(inputs, targets) or, for packed examples, (inputs, targets, segments): CPU tensors (B, T)."""


@dataclass(frozen=True)
class StepSetup:
    """What every step of a run uses and none changes: built once, by `build_run`."""

    forward: nn.Module
    """The module called on a micro-batch (compiled and/or DDP-wrapped)."""
    device: torch.device
    grad_clip: float = 0.0
    """Clip the global norm to this; 0: no clipping (the norm is still computed)."""
    dtype: str = "fp32"
    scaler: torch.amp.GradScaler | None = None
    clip_model: nn.Module | None = None
    """The module whose parameters are clipped (the raw model under a compile or DDP wrapper);
    None: `forward` itself."""
    before_backward: Callable[[int], contextlib.AbstractContextManager] | None = None
    """`before_backward(micro)` may return a context around the backward (DDP's no_sync)."""
    skip_nonfinite: bool = False
    world: int = 1
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None
    """With `world` > 1: the sum across ranks (of the target count and the loss)."""
    z_loss: float = 0.0
    """Weight of the z-loss term added to the objective (0: off, and not computed)."""
    tree: TreeReducer | None = None
    """--reduction tree: the fixed-tree fold of the micro-batches' gradients and losses (then
    `world` is 1: nothing averages); None: autograd accumulates, DDP/FSDP2 sum."""
    seed_micro: Callable[[int, int], None] | None = None
    """--reduction tree: `seed_micro(step, micro)` seeds the generators before a micro-batch's
    forward, from (seed, step, its index in the step), so dropout is the same on any layout."""


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
    lr: float = 0.0
    """The learning rate the step used (set by `advance`)."""
    dt: float = 0.0
    """Seconds from drawing the micro-batches to the end of the update (set by `advance`)."""
    epoch: int | dict[str, int] | None = None
    """With --order epoch, the epoch of the step's first sample (per dataset of a mixture)."""
    grad_digests: dict[str, str] | None = None
    """With `digest_grads`: each parameter's gradient digest, before clipping (parameter order)."""
    z_loss: float | None = None
    """With a z-loss: its weighted term, the mean over the step's targets (not in `loss`)."""


class NonFiniteError(Exception):
    """A step produced a non-finite loss or gradient norm; the weights were not updated."""

    def __init__(self, loss: float, grad_norm: float) -> None:
        super().__init__(f"loss {loss}, grad_norm {grad_norm}")
        self.loss, self.grad_norm = loss, grad_norm


def train_step(
    setup: StepSetup,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[Batch],
    *,
    lr: float,
    step: int = 0,
    measure_noise: bool = False,
    digest_grads: bool = False,
) -> StepResult:
    """Run one step over `micro_batches` (CPU tensors, moved here) and return its numbers.

    A non-finite loss or norm raises NonFiniteError before the update, unless
    `setup.skip_nonfinite`. `measure_noise` also estimates the gradient noise scale from the
    micro-batch gradients (one extra copy of the grads; the grads themselves are left as they
    are). With several ranks the target count is summed before any backward, so the gradient
    is the mean over the global step's real targets. `digest_grads` (--hash-tensors) also
    digests every gradient after unscaling and before clipping: only read, never changed.
    """
    device, scaler, reduce_sum = setup.device, setup.scaler, setup.reduce_sum
    clip_model = setup.clip_model or setup.forward
    set_lr(optimizer, lr)
    micro_targets = [int((batch[1] != IGNORE_INDEX).sum()) for batch in micro_batches]
    n_targets = sum(micro_targets)
    if reduce_sum is not None:
        n_targets = int(reduce_sum(torch.tensor([n_targets], device=device)).item())
    params = clip_model.parameters()
    tracker = MicroGradTracker(params, n_targets) if measure_noise and n_targets else None
    denom = max(1, n_targets)
    loss_total, z_total = _backward(setup, micro_batches, denom, micro_targets, tracker, step)
    # Read before unscaling and clipping; a constant scale cancels in B_simple anyway.
    noise = simple_noise_scale(*tracker.result()) if tracker is not None else None
    if scaler is not None:
        scaler.unscale_(optimizer)
    digests = grad_digests(clip_model) if digest_grads else None  # zeroed after the update
    # The host sync happens here, before the update, so a non-finite step never reaches the
    # weights. With an fp16 scaler, inf gradients are routine (the scaler skips and backs off),
    # so only the loss is checked there.
    norm_value, loss_total, z_total = _norm_and_totals(setup, clip_model, loss_total, z_total)
    loss_value = float(loss_total.item())
    z_value = float(z_total.item()) if z_total is not None else None
    if not (math.isfinite(loss_value) and (scaler is not None or math.isfinite(norm_value))):
        optimizer.zero_grad(set_to_none=True)
        if not setup.skip_nonfinite:
            raise NonFiniteError(loss_value, norm_value)
        return StepResult(loss_value, norm_value, n_targets, True, True, noise)
    skipped = _update(optimizer, scaler)
    done = StepResult(loss_value, norm_value, n_targets, skipped, False, noise)
    return replace(done, grad_digests=digests, z_loss=z_value)


def _norm_and_totals(
    setup: StepSetup, clip_model: nn.Module, loss: torch.Tensor, z: torch.Tensor | None
) -> tuple[float, torch.Tensor, torch.Tensor | None]:
    """The gradient norm before clipping (the gradients clipped), and the step's loss and
    z-loss summed over every rank."""
    if setup.tree is not None:  # the losses are already folded over every rank
        return setup.tree.clip(setup.grad_clip), loss, z
    norm = _clip(clip_model, setup.grad_clip)
    if setup.reduce_sum is not None:
        loss = setup.reduce_sum(loss)
        z = setup.reduce_sum(z) if z is not None else None
    return norm, loss, z


def _clip(model: nn.Module, max_norm: float) -> float:
    norm = clip_grad_norm(model, max_norm)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor holding the global norm
        norm = norm.full_tensor()
    return float(norm.item())


def _update(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> bool:
    """Apply the step's gradients; True when the fp16 scaler skipped it (inf/nan found)."""
    skipped = False
    if scaler is not None:
        scale_before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped = scaler.get_scale() < scale_before  # the scaler backs off only on inf/nan
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return skipped


def grad_digests(model: nn.Module) -> dict[str, str]:
    """Every gradient's digest, in parameter order. Under FSDP each is gathered whole first: a
    collective, so every rank calls this at the same steps (all of them digest, rank 0 logs)."""
    grads = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    return tensor_digests(
        (n, g.full_tensor() if hasattr(g, "full_tensor") else g) for n, g in grads
    )


def _backward(
    setup: StepSetup,
    micro_batches: Sequence[Batch],
    denom: int,
    micro_targets: list[int],
    tracker: MicroGradTracker | None,
    step: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward and backward of every micro-batch, gradients summed; returns the step's loss
    and, with a z-loss, its weighted term. `denom` is the step's real-target count (at least
    1: an all-PAD step adds zero, not NaN)."""
    device, world, scaler, tree = setup.device, setup.world, setup.scaler, setup.tree
    loss_total = torch.zeros((), device=device, dtype=torch.float32)
    z_total = torch.zeros((), device=device, dtype=torch.float32) if setup.z_loss else None
    losses, zs = [], []  # --reduction tree: per micro-batch, folded at the end
    if tree is not None:
        tree.start()
    for micro, batch in enumerate(micro_batches):
        if setup.seed_micro is not None:
            setup.seed_micro(step, micro)
        # (inputs, targets), or (inputs, targets, segments) for packed examples
        x, y, *segments = (t.to(device, non_blocking=True) for t in batch)
        hook = setup.before_backward
        with hook(micro) if hook else contextlib.nullcontext():
            with autocast(device, setup.dtype):
                if z_total is None:
                    loss_sum, _ = setup.forward(x, y, *segments)
                else:
                    loss_sum, _, z_sum = setup.forward(x, y, *segments, z_loss=True)
            loss = loss_sum / denom  # summed over micro-batches this is the true masked mean
            objective = loss
            if z_total is not None:
                z_term = setup.z_loss * z_sum / denom
                objective = loss + z_term
                zs.append(z_term.detach())
                z_total += z_term.detach()
            # DDP and FSDP average gradients over ranks; scaling by the world makes it a sum.
            scaled = objective * world if world > 1 else objective
            (scaler.scale(scaled) if scaler else scaled).backward()
        losses.append(loss.detach())
        loss_total += loss.detach()
        if tracker is not None:  # under the tree each micro-batch's gradient is alone
            tracker.after_micro(micro_targets[micro], alone=tree is not None)
        if tree is not None:
            tree.after_micro()
    if tree is None:
        return loss_total, z_total
    tree.finish()
    return tree.fold_values(losses), tree.fold_values(zs) if zs else None
