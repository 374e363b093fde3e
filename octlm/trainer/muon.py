"""Muon for the blocks' weight matrices, AdamW for everything else, as one optimizer.

Muon (Keller Jordan, 2024; modded-nanogpt record #3, nanochat's MuonAdamW) keeps a Nesterov
momentum of each matrix's gradient and applies its orthogonalisation: the update U V^T of the
momentum's U S V^T, approximated by five Newton-Schulz iterations, scaled by
sqrt(max(1, rows / cols)) as in Keller's reference (the `adjust_lr_fn="original"` of
`torch.optim.Muon`). The embedding (tied to the output layer) and the 1-D norm gains are not
hidden matrices and take AdamW, through `torch.optim.adamw.adamw`, the function
`torch.optim.AdamW` itself calls.

One optimizer, not two side by side: the loop's `set_lr`, the fp16 GradScaler, the index-keyed
`state_dict()` the checkpoint flattens (`momentum_buffer` beside `exp_avg`, `exp_avg_sq` and
`step`) and FSDP's reshard of every state tensor all work on it unchanged.

Under FSDP a matrix is sharded, and Newton-Schulz needs it whole: each rank gathers the whole
momentum update, orthogonalises it (every rank the same numbers, on every matrix) and keeps its
own shard of the result. The momentum itself is elementwise and stays sharded. So a sharded run
computes what a replicated one does, and resumes on any process count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim.adamw import adamw

from octlm.device import fast_bf16_products

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""Keller Jordan's quintic: the steepest slope at 0 that still keeps singular values near 1."""
NS_STEPS = 5
NS_EPS = 1e-7


def orthogonalize(
    update: Tensor, steps: int = NS_STEPS, *, gram: bool = False, dtype: str = "auto"
) -> Tensor:
    """Newton-Schulz approximation of U V^T for the 2-D `update` = U S V^T (singular values
    land in about [0.7, 1.2], which trains as well as exact ones). `gram`: a rectangular
    matrix iterates through its Gram matrix (`newton_schulz_gram`); a square one has no
    smaller side and takes the plain form. `dtype` of the products: "fp32", "bf16", or "auto"
    (`ns_dtype`)."""
    a, b, c = NS_COEFFICIENTS
    x = update.to(ns_dtype(dtype, update.device, gram=gram))
    tall = x.size(0) > x.size(1)
    if tall:  # iterate on the wide side: the Gram matrix is the smaller one
        x = x.T
    x = x / x.norm().clamp(min=NS_EPS)  # spectral norm <= Frobenius norm <= 1
    if gram and x.size(0) < x.size(1):
        x = newton_schulz_gram(x, steps)
    else:
        for _ in range(steps):
            g = x @ x.T
            poly = torch.addmm(g, g, g, beta=b, alpha=c)  # b*G + c*G^2
            x = torch.addmm(x, poly, x, beta=a)  # a*X + (b*G + c*G^2) X
    return (x.T if tall else x).to(update.dtype)


def ns_dtype(setting: str, device: torch.device, *, gram: bool) -> torch.dtype:
    """The products' dtype. "auto" is the rule every Muon run had before the setting, so it
    keeps their bits: bf16 on a GPU, as in the reference, except through the Gram matrix
    (float32 there); float32 elsewhere. "fast": bf16 where the device multiplies it fast
    (`fast_bf16_products`; a run settles it to fp32 or bf16 when it starts)."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" and not gram else torch.float32
    if setting == "fast":
        setting = "bf16" if fast_bf16_products(device) else "fp32"
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[setting]


def newton_schulz_gram(x: Tensor, steps: int) -> Tensor:
    """The iterations of `orthogonalize` on a wide `x` (rows < cols), the same polynomial in
    exact arithmetic. Each iterate is Q X, with Q a polynomial in G = X X^T (rows x rows), so
    the loop updates Q alone and multiplies X twice in all (G, then Q X), instead of twice an
    iteration: on a 384 x 1024 matrix, three iterations take 2 n^2 m + 9 n^3 multiply-adds
    against 3 (2 n^2 m + n^3), 25% fewer. Q and G commute (both polynomials in G), so the
    iterate's own Gram matrix is Q G Q. The bits differ from the plain form's (another order of
    products), hence a setting of its own."""
    a, b, c = NS_COEFFICIENTS
    g0 = x @ x.T
    q = torch.addmm(g0, g0, g0, beta=b, alpha=c)  # the first iteration: Q = aI + bG + cG^2
    q.diagonal().add_(a)
    for _ in range(steps - 1):
        g = q @ (g0 @ q)
        poly = torch.addmm(g, g, g, beta=b, alpha=c)
        q = torch.addmm(q, poly, q, beta=a)
    return q @ x


class MuonAdamW(torch.optim.Optimizer):
    """Param groups say which rule they take: `kind` "muon" (lr, momentum, weight_decay) or
    "adamw" (lr, betas, eps, weight_decay). Weight decay is decoupled in both."""

    def __init__(self, groups: Iterable[dict[str, Any]], *, fused: bool) -> None:
        defaults = {"lr": 0.0, "weight_decay": 0.0}
        super().__init__(list(groups), defaults)
        self.fused = fused
        for group in self.param_groups:
            if group["kind"] == "muon" and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("MuonAdamW: a muon group holds only 2-D matrices")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        # torch's loader leaves each "step" on the CPU unless the param group says fused or
        # capturable (torch.optim.AdamW's groups do; ours keep `fused` on the optimizer), and
        # the fused AdamW kernel wants it on the parameter's device: a resumed CUDA run
        # failed at its first step. The count is an integer, so the move changes no bit.
        if self.fused:
            for p, state in self.state.items():
                if "step" in state:
                    state["step"] = state["step"].to(p.device)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        if closure is not None:
            raise ValueError("MuonAdamW.step takes no closure")
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["kind"] == "muon":
                self._muon(group, params)
            else:
                self._adamw(group, params)

    def _muon(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr, momentum = group["lr"], group["momentum"]
        for p in params:  # one matrix at a time: under FSDP each gather is a collective
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.mul_(momentum).add_(p.grad)
            nesterov = p.grad.add(buf, alpha=momentum)
            # A group without ns_steps: a checkpoint's param groups from before the setting.
            steps = group.get("ns_steps", NS_STEPS)
            # Groups saved before these settings lack them: their defaults are the old rule.
            gram, dtype = group.get("gram", False), group.get("ns_dtype", "auto")
            whole = orthogonalize(_whole(nesterov), steps, gram=gram, dtype=dtype)
            direction = _sharded_like(whole, p)
            rows, cols = p.shape
            p.mul_(1.0 - lr * group["weight_decay"])
            p.add_(direction, alpha=-lr * math.sqrt(max(1.0, rows / cols)))

    def _adamw(self, group: dict[str, Any], params: list[Tensor]) -> None:
        exp_avgs, exp_avg_sqs, steps = [], [], []
        for p in params:
            state = self.state[p]
            if "step" not in state:  # as torch.optim.AdamW lays its state out
                device = p.device if self.fused else None
                state["step"] = torch.zeros((), dtype=torch.float32, device=device)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        adamw(
            params,
            [p.grad for p in params],
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            fused=True if self.fused else None,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )


def _whole(t: Tensor) -> Tensor:
    """The full tensor of a DTensor shard (a collective), or `t` itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _sharded_like(full: Tensor, like: Tensor) -> Tensor:
    """`full` laid out as `like`: this rank's shard when `like` is a DTensor. Every rank holds
    the same `full`, so each cuts its own piece without communicating (src_data_rank=None)."""
    if not hasattr(like, "device_mesh"):
        return full
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
