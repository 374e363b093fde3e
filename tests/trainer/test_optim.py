"""Tests for octlm.trainer.optim: decay groups, the fused kernel, and global-norm clipping."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from octlm.config.files import make_config
from octlm.config.learning import FUSED_DEFAULT
from octlm.config.shape import preset
from octlm.config.train import TrainConfig
from octlm.device import fast_bf16_products
from octlm.model.gpt import GPT
from octlm.trainer.checkpoint import CheckpointInfo, parse_info
from octlm.trainer.optim import clip_grad_norm, param_groups, set_lr
from octlm.trainer.resume import settled_defaults, settled_ns_dtype
from tests.unit_model import optimizer_for

TINY = preset(
    "tiny", vocab_size=512, context=32, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128
)


def make_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(TINY)


def backward(model: GPT, scale: float = 1.0, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, TINY.vocab_size, (4, TINY.context), generator=g)
    y = torch.randint(0, TINY.vocab_size, (4, TINY.context), generator=g)
    loss_sum, n = model(x, y)
    (scale * loss_sum / n).backward()


def global_norm(model: GPT) -> float:
    grads = [p.grad.double() for p in model.parameters() if p.grad is not None]
    return float(torch.sqrt(sum((g * g).sum() for g in grads)))


def test_matrices_decay_and_norm_gains_do_not() -> None:
    model = make_model()
    cfg = TrainConfig(model="tiny", context=32, weight_decay=0.07)
    opt = optimizer_for(model, cfg)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.07
    assert no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() == 1 for p in no_decay["params"])
    ids = lambda ps: {id(p) for p in ps}  # noqa: E731
    named = dict(model.named_parameters())
    matrices = {n for n, p in named.items() if p.dim() >= 2}
    gains = {n for n, p in named.items() if p.dim() == 1}
    assert ids(decay["params"]) == ids(named[n] for n in matrices)
    assert ids(no_decay["params"]) == ids(named[n] for n in gains)
    assert "tok_embeddings.weight" in matrices
    assert all(n.endswith("norm.weight") for n in gains)
    # Every parameter is in exactly one group.
    assert ids(decay["params"]) | ids(no_decay["params"]) == ids(model.parameters())
    assert not ids(decay["params"]) & ids(no_decay["params"])


def test_group_counts_for_the_tiny_model() -> None:
    model = make_model()
    decay, no_decay = param_groups(model, 0.1)
    # Embedding + 7 linears per layer (wq wk wv wo w1 w2 w3); 2 RMSNorm gains per layer + final.
    assert len(decay["params"]) == 1 + 7 * TINY.n_layers == 15
    assert len(no_decay["params"]) == 2 * TINY.n_layers + 1 == 5
    assert sum(p.numel() for p in decay["params"] + no_decay["params"]) == model.num_params()


def test_optimizer_settings_come_from_the_config() -> None:
    cfg = TrainConfig(model="tiny", context=32, lr=2e-3, beta1=0.8, beta2=0.9, eps=1e-6)
    opt = optimizer_for(make_model(), cfg)
    for group in opt.param_groups:
        assert group["betas"] == (0.8, 0.9)
        assert group["eps"] == 1e-6
        assert group["fused"]  # unset: FUSED_DEFAULT
    unfused = optimizer_for(make_model(), cfg.replace(fused=False))
    assert not any(g["fused"] for g in unfused.param_groups)
    set_lr(opt, 3e-4)
    assert [g["lr"] for g in opt.param_groups] == [3e-4, 3e-4]


def test_fused_adamw_builds_and_steps_on_cpu() -> None:
    model = make_model()
    opt = optimizer_for(model, TrainConfig(model="tiny", context=32, fused=True))
    assert all(g["fused"] for g in opt.param_groups)
    before = model.tok_embeddings.weight.detach().clone()
    backward(model)
    opt.step()
    assert not torch.equal(before, model.tok_embeddings.weight)
    assert torch.isfinite(model.tok_embeddings.weight).all()


def test_clip_returns_the_pre_clip_global_norm() -> None:
    model = make_model()
    backward(model, scale=100.0)
    expected = global_norm(model)
    assert expected > 1.0
    norm = clip_grad_norm(model, 1.0)
    assert float(norm) == pytest.approx(expected, rel=1e-5)
    assert global_norm(model) <= 1.0 + 1e-6
    assert global_norm(model) == pytest.approx(1.0, rel=1e-5)


def test_clip_leaves_a_small_norm_alone() -> None:
    model = make_model()
    backward(model)
    grads = [p.grad.clone() for p in model.parameters()]
    norm = float(clip_grad_norm(model, 1e6))
    assert norm == pytest.approx(global_norm(model), rel=1e-5)
    # The coefficient is clamped at 1, so an unclipped gradient stays within rounding.
    for g, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-6, atol=0)


def test_zero_grad_clip_leaves_gradients_bitwise_unchanged_and_returns_the_norm() -> None:
    model = make_model()
    backward(model, scale=100.0)
    grads = [p.grad.clone() for p in model.parameters()]
    expected = global_norm(model)
    norm = clip_grad_norm(model, 0.0)
    assert float(norm) == pytest.approx(expected, rel=1e-5)
    assert expected > 1.0  # clipping would have changed them
    for g, p in zip(grads, model.parameters(), strict=True):
        assert torch.equal(p.grad, g)


def saved(fused: bool) -> CheckpointInfo:
    return parse_info(Path("step_000004.safetensors"), {"trajectory": {"fused": fused}})


def test_fused_left_unset_is_on_for_a_new_run_and_the_checkpoints_on_resume() -> None:
    cfg = make_config(None, model="micro", context=64)
    assert cfg.fused is None and cfg.trajectory()["fused"] is FUSED_DEFAULT is True
    assert settled_defaults(cfg, None).fused is True
    assert settled_defaults(cfg, saved(False)).fused is False
    assert settled_defaults(cfg, saved(True)).fused is True
    explicit = make_config(None, model="micro", context=64, fused=False)
    assert settled_defaults(explicit, saved(True)).fused is False


def test_muon_ns_dtype_fast_settles_to_the_devices_dtype_and_a_resume_keeps_its_own() -> None:
    fast = make_config(None, model="micro", context=64, optimizer="muon", muon_ns_dtype="fast")
    assert settled_ns_dtype(fast, None, True).muon_ns_dtype == "bf16"
    assert settled_ns_dtype(fast, None, False).muon_ns_dtype == "fp32"

    def saved_dtype(dtype: str) -> CheckpointInfo:
        return parse_info(Path("s.safetensors"), {"trajectory": {"muon_ns_dtype": dtype}})

    # a run started on an AMX machine continues in bf16 on one without, and the other way
    assert settled_ns_dtype(fast, saved_dtype("bf16"), False).muon_ns_dtype == "bf16"
    assert settled_ns_dtype(fast, saved_dtype("fp32"), True).muon_ns_dtype == "fp32"
    no_key = parse_info(Path("s.safetensors"), {"trajectory": {}})  # an "auto" run
    assert settled_ns_dtype(fast, no_key, True).muon_ns_dtype == "bf16"  # then refused
    explicit = fast.replace(muon_ns_dtype="fp32")
    assert settled_ns_dtype(explicit, saved_dtype("bf16"), True) is explicit


def test_fast_bf16_products_follow_the_cpus_amx() -> None:
    assert fast_bf16_products(torch.device("cpu")) is torch.cpu._is_amx_tile_supported()
    assert fast_bf16_products(torch.device("meta")) is False


def test_fused_and_unfused_adamw_differ_in_the_last_bits() -> None:
    """Why the default may not silently apply to an older run: the kernels round differently."""
    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = GPT(preset("micro"))
        opt = optimizer_for(model, make_config(None, model="micro", context=64, fused=fused))
        for _ in range(3):
            x = torch.randint(0, 300, (2, 16))
            loss_sum, n = model(x, x)
            (loss_sum / n).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(results[0], results[1], atol=1e-5)
    assert not torch.equal(results[0], results[1])
