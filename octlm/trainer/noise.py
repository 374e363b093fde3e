"""The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, Appendix A).

Both terms are estimated without bias from quantities an accumulated step already has: each
micro-batch's mean gradient (batch b) and the whole step's mean gradient (batch B). Batch sizes
are in tokens, so B_simple is too. `MicroGradTracker` reads them off `.grad` without changing it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn


def noise_components(
    micro_sqnorms: Sequence[float], micro_sizes: Sequence[int], total_sqnorm: float
) -> tuple[float, float] | None:
    """Unbiased estimates (|G|^2, tr(Sigma)), or None with fewer than 2 micro-batches.

    With per-token gradients i.i.d. around G with covariance Sigma, a mean over n tokens has
    E|g_n|^2 = |G|^2 + tr(Sigma) / n. Averaged over micro-batches of unequal sizes n_i this is
    |G|^2 + tr(Sigma) * mean(1 / n_i), so b is the HARMONIC mean of the sizes (the arithmetic
    mean would bias both estimates); with equal sizes it is just the size. B = sum(n_i).
    Average these components over steps before dividing: a ratio of averages is less biased
    than an average of ratios.
    """
    if len(micro_sqnorms) != len(micro_sizes):
        raise ValueError(f"{len(micro_sqnorms)} squared norms but {len(micro_sizes)} sizes")
    if len(micro_sizes) < 2:
        return None
    if any(n <= 0 for n in micro_sizes):
        raise ValueError(f"micro-batch sizes must be positive, got {list(micro_sizes)}")
    k = len(micro_sizes)
    b = k / sum(1.0 / n for n in micro_sizes)
    big_b = float(sum(micro_sizes))
    g_b = sum(micro_sqnorms) / k  # mean over micro-batches of |g_b|^2
    g2 = (big_b * total_sqnorm - b * g_b) / (big_b - b)
    trace = (g_b - total_sqnorm) / (1.0 / b - 1.0 / big_b)
    return g2, trace


def simple_noise_scale(
    micro_sqnorms: Sequence[float], micro_sizes: Sequence[int], total_sqnorm: float
) -> float | None:
    """B_simple in tokens; None with fewer than 2 micro-batches or a |G|^2 estimate <= 0, and
    also when the tr(Sigma) estimate is negative (noise made it meaningless for this step)."""
    parts = noise_components(micro_sqnorms, micro_sizes, total_sqnorm)
    if parts is None:
        return None
    g2, trace = parts
    if g2 <= 0 or trace < 0:
        return None
    return trace / g2


class MicroGradTracker:
    """Per-micro-batch mean-gradient norms from accumulating `.grad`s, read-only.

    Create it before a step's first backward (it snapshots the current grads, normally none),
    call `after_micro(n_targets)` after each micro-batch's backward, then `result()`. Each
    micro-batch's loss is its sum / `total_targets`, so its contribution (the difference since
    the previous call) times total_targets / n_targets is its own mean gradient. Grads scaled
    by a constant (an fp16 GradScaler within one step) scale both terms alike: B_simple holds.
    Costs one fp32 copy of the grads; meant for occasional (validation) steps.
    """

    def __init__(self, params: Iterable[nn.Parameter], total_targets: int) -> None:
        if total_targets <= 0:
            raise ValueError(f"total_targets={total_targets}: must be positive")
        self.params = [p for p in params if p.requires_grad]
        self.total_targets = total_targets
        # Grads already there (normally none) are not this step's: both snapshots subtract them.
        self.start = [None if p.grad is None else p.grad.detach().clone() for p in self.params]
        self.prev = list(self.start)
        self.micro_sqnorms: list[float] = []
        self.micro_sizes: list[int] = []

    @staticmethod
    def _grad(p: nn.Parameter) -> torch.Tensor:
        return p.grad.detach() if p.grad is not None else torch.zeros_like(p)

    @staticmethod
    def _sub(a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        # float64: the difference of two fp32 tensors is exact there.
        return a.double() if b is None else a.double() - b.double()

    @torch.no_grad()
    def after_micro(self, n_targets: int, alone: bool = False) -> None:
        """Record the micro-batch whose backward just ran; it had `n_targets` real targets.
        `alone`: `.grad` holds this micro-batch's gradient only (the tree reduction)."""
        if n_targets <= 0:
            return  # an all-PAD micro-batch has no mean gradient (and contributed nothing)
        scale = self.total_targets / n_targets
        terms = []
        for i, p in enumerate(self.params):
            cur = self._grad(p)
            terms.append((self._sub(cur, None if alone else self.prev[i]) * scale).square().sum())
            if not alone:
                self.prev[i] = cur.clone()
        self.micro_sqnorms.append(_total(terms))
        self.micro_sizes.append(int(n_targets))

    @torch.no_grad()
    def result(self) -> tuple[list[float], list[int], float]:
        """(micro_sqnorms, micro_sizes, total_sqnorm) for `simple_noise_scale`."""
        terms = [
            self._sub(self._grad(p), s).square().sum()
            for p, s in zip(self.params, self.start, strict=True)
        ]
        return list(self.micro_sqnorms), list(self.micro_sizes), _total(terms)


def _total(terms: list[torch.Tensor]) -> float:
    # One host sync per call, not one per parameter.
    return float(torch.stack(terms).sum().item()) if terms else 0.0
