"""Gradient noise scale: known answers on a synthetic problem, and the tracker on a real GPT.

Synthetic: per-sample gradients g_i = -x_i with x_i ~ N(mu, sigma^2 I_d) (the gradient of
0.5 |theta - x_i|^2 at theta = 0), so |G|^2 = |mu|^2, tr(Sigma) = d sigma^2 and the true
B_simple = d sigma^2 / |mu|^2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from octlm.config.shape import preset
from octlm.model.gpt import GPT, IGNORE_INDEX
from octlm.trainer.noise import MicroGradTracker, noise_components, simple_noise_scale

D, SIGMA, TRUE_B = 256, 1.5, 48.0
MU = np.full(D, math.sqrt(D * SIGMA**2 / TRUE_B / D))  # |mu|^2 = d sigma^2 / TRUE_B


def synthetic_step(rng: np.random.Generator, sizes: list[int], trials: int):
    """Per trial: each micro-batch's mean gradient's squared norm, and the step mean's."""
    micro_sq = np.empty((trials, len(sizes)))
    total = np.zeros((trials, D))
    for j, n in enumerate(sizes):
        # The mean of n i.i.d. N(mu, sigma^2) samples is exactly N(mu, sigma^2 / n): drawn at once.
        g_micro = -rng.normal(MU, SIGMA / math.sqrt(n), size=(trials, D))
        micro_sq[:, j] = (g_micro**2).sum(axis=1)
        total += g_micro * n
    total /= sum(sizes)
    return micro_sq, (total**2).sum(axis=1)


@pytest.mark.parametrize("sizes", [[16] * 8, [2, 4, 8, 50]])
def test_known_answer(sizes: list[int]) -> None:
    rng = np.random.default_rng(0)
    micro_sq, total_sq = synthetic_step(rng, sizes, trials=3000)
    parts = np.array(
        [noise_components(m, sizes, t) for m, t in zip(micro_sq, total_sq, strict=True)]
    )
    g2, trace = parts.mean(axis=0)
    assert g2 == pytest.approx(float(MU @ MU), rel=0.03)
    assert trace == pytest.approx(D * SIGMA**2, rel=0.03)
    assert trace / g2 == pytest.approx(TRUE_B, rel=0.04)
    per_trial = [simple_noise_scale(m, sizes, t) for m, t in zip(micro_sq, total_sq, strict=True)]
    assert np.median([b for b in per_trial if b is not None]) == pytest.approx(TRUE_B, rel=0.06)


def test_arithmetic_mean_size_would_be_biased() -> None:
    """The control: with unequal sizes, b = the arithmetic mean misses the true value badly."""
    sizes = [2, 4, 8, 50]
    micro_sq, total_sq = synthetic_step(np.random.default_rng(1), sizes, trials=3000)
    b, big_b, g_b = float(np.mean(sizes)), float(sum(sizes)), micro_sq.mean()
    g2 = (big_b * total_sq.mean() - b * g_b) / (big_b - b)
    trace = (g_b - total_sq.mean()) / (1 / b - 1 / big_b)
    assert abs(trace / g2 / TRUE_B - 1) > 0.3


def test_formula_by_hand() -> None:
    # b = 2, B = 4: |G|^2 = (4*1 - 2*3) / 2 < 0 -> None; swap to a positive case.
    assert simple_noise_scale([3.0, 3.0], [2, 2], 1.0) is None
    g2, trace = noise_components([3.0, 5.0], [2, 2], 2.5)
    assert g2 == pytest.approx((4 * 2.5 - 2 * 4.0) / 2)  # 1.0
    assert trace == pytest.approx((4.0 - 2.5) / (1 / 2 - 1 / 4))  # 6.0
    assert simple_noise_scale([3.0, 5.0], [2, 2], 2.5) == pytest.approx(6.0)


def test_none_and_errors() -> None:
    assert simple_noise_scale([1.0], [8], 1.0) is None
    assert simple_noise_scale([], [], 1.0) is None
    assert simple_noise_scale([1.0, 1.0], [4, 4], 2.0) is None  # tr(Sigma) estimate < 0
    with pytest.raises(ValueError):
        simple_noise_scale([1.0, 2.0], [4], 1.0)
    with pytest.raises(ValueError):
        simple_noise_scale([1.0, 2.0], [4, 0], 1.0)


def tiny_gpt_micro_batches() -> tuple[GPT, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=128, context=16, n_layers=2))
    batches = []
    for n_masked in (0, 5, 17):  # unequal target counts
        x = torch.randint(0, 128, (2, 16))
        y = torch.randint(0, 128, (2, 16))
        y.view(-1)[:n_masked] = IGNORE_INDEX
        batches.append((x, y))
    return model, batches


def accumulate(model: GPT, batches, tracker_on: bool):
    model.zero_grad(set_to_none=True)
    total = sum(int((y != IGNORE_INDEX).sum()) for _, y in batches)
    tracker = MicroGradTracker(model.parameters(), total) if tracker_on else None
    for x, y in batches:
        loss_sum, n = model(x, y)
        (loss_sum / total).backward()
        if tracker:
            tracker.after_micro(int(n))
    return tracker


def test_tracker_on_tiny_gpt() -> None:
    model, batches = tiny_gpt_micro_batches()
    accumulate(model, batches, tracker_on=False)
    untracked = [p.grad.clone() for p in model.parameters()]
    tracker = accumulate(model, batches, tracker_on=True)
    for p, g in zip(model.parameters(), untracked, strict=True):
        assert torch.equal(p.grad, g)  # tracking left the gradients bit for bit as they were
    micro_sq, sizes, total_sq = tracker.result()
    assert sizes == [32, 27, 15]
    true_total = sum(float(g.double().square().sum()) for g in untracked)
    assert total_sq == pytest.approx(true_total, rel=1e-12)
    for (x, y), sq in zip(batches, micro_sq, strict=True):  # each micro-batch alone, own mean
        model.zero_grad(set_to_none=True)
        loss_sum, n = model(x, y)
        (loss_sum / n).backward()
        alone = sum(float(p.grad.double().square().sum()) for p in model.parameters())
        assert sq == pytest.approx(alone, rel=1e-4)


def test_tracker_ignores_grads_from_before() -> None:
    model, batches = tiny_gpt_micro_batches()
    fresh = accumulate(model, batches, tracker_on=True).result()
    # Leftover grads from an earlier step are subtracted, not counted as this step's.
    total = sum(int((y != IGNORE_INDEX).sum()) for _, y in batches)
    tracker = MicroGradTracker(model.parameters(), total)
    for x, y in batches:
        loss_sum, n = model(x, y)
        (loss_sum / total).backward()
        tracker.after_micro(int(n))
    stale = tracker.result()
    assert stale[1] == fresh[1]
    assert stale[0] == pytest.approx(fresh[0], rel=1e-4)
    assert stale[2] == pytest.approx(fresh[2], rel=1e-4)
