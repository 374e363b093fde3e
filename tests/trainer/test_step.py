"""Tests for octlm.trainer.step: exact gradient accumulation, the masked mean, mixed precision.

Gradients are captured with a real optimizer's step pre-hook, i.e. exactly what `train_step`
hands to `optimizer.step()` (after unscaling and clipping).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from octlm.config.shape import preset
from octlm.model.gpt import GPT, IGNORE_INDEX
from octlm.trainer.step import StepSetup, train_step

TINY = preset(
    "tiny", vocab_size=512, context=32, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128
)
CPU = torch.device("cpu")


def make_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(TINY)


def make_batch(n: int = 8, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(3, TINY.vocab_size, (n, TINY.context), generator=g)
    y = torch.randint(3, TINY.vocab_size, (n, TINY.context), generator=g)
    return x, y


def masked_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """8 sequences where 3/4 of the first 2-sequence micro-batch's targets are IGNORE."""
    x, y = make_batch()
    y = y.clone()
    y[:2, : TINY.context * 3 // 4] = IGNORE_INDEX
    return x, y


def split(x: torch.Tensor, y: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(zip(x.split(size), y.split(size), strict=True))


def flat(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1).double() for g in grads])


def rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    fa, fb = flat(a), flat(b)
    return float((fa - fb).norm() / fb.norm())


def run_step(micro_batches, *, seed: int = 0, weight_decay: float = 0.0, **kwargs):
    """(result, gradients handed to optimizer.step, model) of one train_step."""
    model = make_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=weight_decay)
    captured: list[list[torch.Tensor]] = []

    def grab(optimizer, args, kw) -> None:
        captured.append([p.grad.detach().clone() for p in model.parameters()])

    opt.register_step_pre_hook(grab)
    kwargs.setdefault("grad_clip", 0.0)
    measure = kwargs.pop("measure_noise", False)
    setup = StepSetup(forward=model, device=CPU, **kwargs)
    result = train_step(setup, opt, micro_batches, lr=1e-3, measure_noise=measure)
    return result, (captured[0] if captured else None), model


def manual_grads(micro_batches, *, naive: bool) -> list[torch.Tensor]:
    """The true masked mean (sum of loss sums / total count), or the naive mean of means."""
    model = make_model()
    if naive:
        means = []
        for x, y in micro_batches:
            loss_sum, n = model(x, y)
            means.append(loss_sum / n)
        loss = torch.stack(means).mean()
    else:
        x = torch.cat([x for x, _ in micro_batches])
        y = torch.cat([y for _, y in micro_batches])
        loss_sum, n = model(x, y)
        loss = loss_sum / n
    loss.backward()
    return [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("batch", [make_batch, masked_batch], ids=["unmasked", "masked"])
def test_accumulation_gives_the_same_gradient_as_one_big_batch(batch) -> None:
    x, y = batch()
    _, one, _ = run_step([(x, y)])
    _, four, _ = run_step(split(x, y, 2))
    assert rel_diff(four, one) <= 1e-6
    # Both equal the true masked mean computed by hand in a single forward pass.
    assert rel_diff(one, manual_grads([(x, y)], naive=False)) <= 1e-6


def test_mean_of_micro_batch_means_differs_when_masked() -> None:
    x, y = masked_batch()
    micro = split(x, y, 2)
    _, exact, _ = run_step(micro)
    naive = manual_grads(micro, naive=True)
    assert rel_diff(naive, exact) > 1e-2


def test_mean_of_means_agrees_without_a_mask() -> None:
    # The control for the test above: with equal counts the two definitions coincide.
    x, y = make_batch()
    micro = split(x, y, 2)
    _, exact, _ = run_step(micro)
    assert rel_diff(manual_grads(micro, naive=True), exact) <= 1e-6


@pytest.mark.parametrize("batch", [make_batch, masked_batch], ids=["unmasked", "masked"])
def test_reported_loss_is_the_true_masked_mean(batch) -> None:
    x, y = batch()
    with torch.no_grad():
        loss_sum, n = make_model()(x, y)
    expected = float(loss_sum / n)
    result, _, _ = run_step(split(x, y, 2))
    assert result.n_targets == int((y != IGNORE_INDEX).sum()) == int(n)
    assert result.loss == pytest.approx(expected, rel=1e-6)


def test_all_ignore_step_reports_zero_loss_and_moves_nothing() -> None:
    x, _ = make_batch()
    y = torch.full_like(x, IGNORE_INDEX)
    result, grads, model = run_step(split(x, y, 2))
    assert result.loss == 0.0
    assert result.n_targets == 0
    assert result.grad_norm == 0.0
    assert all(torch.isfinite(g).all() and not g.any() for g in grads)
    # Zero gradients and no weight decay: AdamW's update is 0, every weight is unchanged.
    fresh = make_model()
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.isfinite(p).all()
        assert torch.equal(p, q)


def test_step_sets_the_learning_rate_and_clears_gradients() -> None:
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=5.0)
    train_step(StepSetup(model, CPU, grad_clip=1.0), opt, [make_batch(2)], lr=2.5e-4)
    assert [g["lr"] for g in opt.param_groups] == [2.5e-4]
    assert all(p.grad is None for p in model.parameters())


def test_reported_grad_norm_is_before_clipping_and_update_uses_the_clipped_one() -> None:
    x, y = make_batch()
    free, raw, _ = run_step([(x, y)], grad_clip=0.0)
    limit = free.grad_norm / 4
    clipped, grads, _ = run_step([(x, y)], grad_clip=limit)
    assert clipped.grad_norm == pytest.approx(free.grad_norm, rel=1e-6)
    assert float(flat(grads).norm()) == pytest.approx(limit, rel=1e-5)
    assert rel_diff([g * 4 for g in grads], raw) <= 1e-5


def test_before_backward_context_wraps_each_micro_batch() -> None:
    seen: list[int] = []

    def ctx(micro: int) -> contextlib.AbstractContextManager:
        seen.append(micro)
        return contextlib.nullcontext()

    x, y = make_batch()
    run_step(split(x, y, 2), before_backward=ctx)
    assert seen == [0, 1, 2, 3]


def test_bf16_autocast_runs_on_cpu_and_keeps_fp32_weights() -> None:
    x, y = make_batch()
    ref, ref_grads, _ = run_step(split(x, y, 4))
    result, grads, model = run_step(split(x, y, 4), dtype="bf16")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(g.dtype == torch.float32 for g in grads)
    assert result.loss == pytest.approx(ref.loss, rel=1e-2)
    assert rel_diff(grads, ref_grads) < 0.05  # bf16 rounding, not a different gradient
    assert not result.skipped


def test_fp16_with_a_cpu_grad_scaler_unscales_before_clipping() -> None:
    x, y = make_batch()
    ref, ref_grads, _ = run_step(split(x, y, 4))
    scaler = torch.amp.GradScaler("cpu")
    assert scaler.is_enabled()  # this torch supports the CPU scaler
    result, grads, model = run_step(split(x, y, 4), dtype="fp16", scaler=scaler)
    assert not result.skipped
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert result.loss == pytest.approx(ref.loss, rel=1e-2)
    # The norm and the gradients are the unscaled ones (the scale is 65536).
    assert result.grad_norm == pytest.approx(ref.grad_norm, rel=1e-2)
    assert rel_diff(grads, ref_grads) < 0.02


def test_fp16_overflow_is_reported_as_a_skipped_step_and_leaves_weights_alone() -> None:
    x, y = make_batch()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100)  # any gradient overflows fp16
    result, grads, model = run_step(split(x, y, 4), dtype="fp16", scaler=scaler)
    assert grads is None  # the scaler never called optimizer.step()
    assert result.skipped
    assert scaler.get_scale() < 2.0**100
    fresh = make_model()
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(p, q)
