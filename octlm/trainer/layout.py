"""How the model is laid out over the processes and how a step sums: the wrapper (DDP, FSDP2,
or none) and the `StepSetup` every step uses, for either reduction (`octlm.trainer.reduction`).
"""

from __future__ import annotations

import torch
from torch import nn

from octlm.config.train import TrainConfig
from octlm.errors import OctlmError
from octlm.trainer.distributed import DistInfo, all_reduce_sum, sync_context, wrap_model
from octlm.trainer.fold import block_ok, worlds_for
from octlm.trainer.reduction import TreeReducer, broadcast_model, seeder, shard_for_tree
from octlm.trainer.step import StepSetup


def tree(cfg: TrainConfig) -> bool:
    return cfg.hardware.reduction == "tree"


def check_layout(cfg: TrainConfig, world: int) -> None:
    """Under the tree, `world` processes must each hold whole subtrees of the step's fold."""
    total = cfg.inputs.accum * world
    if not tree(cfg) or block_ok(total, world):
        return
    can = ", ".join(str(w) for w in worlds_for(total))
    raise OctlmError(
        f"{world} processes cannot share the step's {total} micro-batches in the fixed tree of "
        f"--reduction tree (each would hold a part of a subtree)",
        f"use {can} process(es) for this global batch, or --reduction collective (its bits "
        "follow the process count)",
    )


def place_model(model: nn.Module, cfg: TrainConfig, info: DistInfo, device: torch.device):
    """The module a step calls: under the tree, the model itself replicated (DDP layout) or
    FSDP2 with the fold as its reduce-scatter; else DDP's or FSDP2's own wrapper."""
    if not (tree(cfg) and info.enabled):
        return wrap_model(model, info, cfg.hardware.parallel, device)
    if cfg.hardware.parallel == "fsdp":
        shard_for_tree(model)
    else:
        broadcast_model(model, info)
    return model


def step_setup(
    cfg: TrainConfig,
    model: nn.Module,
    wrapped: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    info: DistInfo,
    device: torch.device,
) -> StepSetup:
    folding = tree(cfg)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    fsdp = cfg.hardware.parallel == "fsdp"
    return StepSetup(
        forward=torch.compile(wrapped) if cfg.hardware.compile else wrapped,
        device=device,
        grad_clip=cfg.optim.grad_clip,
        dtype=cfg.hardware.dtype,
        scaler=scaler,
        clip_model=model,
        before_backward=None
        if folding
        else sync_context(wrapped, info, cfg.hardware.parallel, cfg.inputs.accum),
        skip_nonfinite=cfg.run.skip_nonfinite,
        world=1 if folding else info.world,
        reduce_sum=(lambda t: all_reduce_sum(t, info)) if info.enabled else None,
        z_loss=cfg.optim.z_loss,
        tree=TreeReducer(params, info, fsdp and info.enabled) if folding else None,
        seed_micro=seeder(cfg.inputs.seed, info.world, info.rank) if folding else None,
    )
