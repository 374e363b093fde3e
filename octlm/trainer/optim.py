"""AdamW with decay on matrices only, and clipping by global norm."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from octlm.config import fused_or_default


class OptimSettings(Protocol):
    """The settings AdamW is built from (a TrainConfig provides them)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    fused: bool | None
    """None: `config.FUSED_DEFAULT`."""


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Tensors with 2+ dims (every linear and the tied embedding) decay; 1-D norm gains don't,
    since pulling a gain toward 0 shrinks the signal instead of regularising."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def param_names(model: nn.Module) -> list[str]:
    """Parameter names in the optimizer's index order (decay group first, as param_groups)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [n for n, p in named if p.dim() >= 2] + [n for n, p in named if p.dim() < 2]


def build_optimizer(model: nn.Module, cfg: OptimSettings) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,  # overwritten every step by the schedule
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=True if fused_or_default(cfg.fused) else None,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip to `max_norm` (0 = no clipping) and return the global norm *before* clipping."""
    limit = max_norm if max_norm > 0 else float("inf")  # inf still computes the norm
    return torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
