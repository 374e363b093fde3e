"""The optimizer a run steps (AdamW with decay on matrices only, or Muon for the blocks'
matrices beside AdamW), its learning rate each step, and clipping by global norm."""

from __future__ import annotations

import torch
from torch import nn

from octlm.config.learning import OptimSettings, fused_or_default
from octlm.trainer.muon import MuonAdamW


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Tensors with 2+ dims (every linear and the tied embedding) decay; 1-D norm gains don't,
    since pulling a gain toward 0 shrinks the signal instead of regularising."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's index order (the order of its groups' parameters),
    which is how a checkpoint's `optim.{index}.*` tensors map back to parameters."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    """Muon's parameters: the blocks' 2-D weights. The embedding is also the output layer
    (tied), a lookup table, not a hidden map: it stays with AdamW, as in every Muon recipe."""
    return param.dim() == 2 and name.startswith("layers.")


def build_optimizer(model: nn.Module, cfg: OptimSettings, lr: float) -> torch.optim.Optimizer:
    """The run's optimizer from its section; `lr` is the schedule's peak (the schedule sets
    every step's rate: `set_lr`)."""
    if cfg.optimizer == "muon":
        return build_muon(model, cfg, lr)
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=lr,  # overwritten every step by the schedule
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=True if fused_or_default(cfg.fused) else None,
    )


def build_muon(model: nn.Module, cfg: OptimSettings, lr: float) -> MuonAdamW:
    """Muon for the hidden matrices at `muon_lr`, AdamW for the rest at `lr`. `lr_ratio`
    carries the schedule over: each step the Muon lr is the schedule's lr times muon_lr / lr.
    Muon's decay is divided by the same ratio, so a matrix shrinks per step by lr x
    weight_decay, as it would under AdamW."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    hidden = [p for n, p in named if is_hidden_matrix(n, p)]
    rest = [(n, p) for n, p in named if not is_hidden_matrix(n, p)]
    ratio = cfg.muon_lr / lr
    adam = {"kind": "adamw", "betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps}
    groups = [
        {
            "kind": "muon",
            "params": hidden,
            "lr_ratio": ratio,
            "momentum": cfg.muon_momentum,
            "ns_steps": cfg.muon_ns_steps,
            "gram": cfg.muon_gram,
            "ns_dtype": cfg.muon_ns_dtype,
            "weight_decay": cfg.weight_decay / ratio,
        },
        {**adam, "params": [p for n, p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {**adam, "params": [p for n, p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    return MuonAdamW(groups, fused=fused_or_default(cfg.fused))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's `lr` into every group (a Muon group takes it times its `lr_ratio`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_ratio"] if "lr_ratio" in group else lr


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip to `max_norm` (0 = no clipping) and return the global norm *before* clipping."""
    limit = max_norm if max_norm > 0 else float("inf")  # inf still computes the norm
    return torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
