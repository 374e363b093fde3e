"""MuonAdamW: which parameters take which rule, each rule's update against its definition, the
AdamW part bit for bit against torch.optim.AdamW, and a state_dict round trip through the
checkpoint's flat layout."""

from __future__ import annotations

import math

import pytest
import torch

from octlm.config.shape import ModelConfig
from octlm.config.train import TrainConfig
from octlm.model.gpt import GPT
from octlm.trainer import checkpoint as ckpt
from octlm.trainer.muon import (
    NS_COEFFICIENTS,
    MuonAdamW,
    newton_schulz_gram,
    ns_dtype,
    orthogonalize,
)
from octlm.trainer.optim import param_names, set_lr
from tests.unit_model import optimizer_for

MICRO = ModelConfig(
    vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, context=16
)


def muon_config(**changes) -> TrainConfig:
    return TrainConfig(model="micro", context=16, optimizer="muon", **changes)


def model_with_grads(seed: int = 0, qk_norm: bool = False) -> GPT:
    torch.manual_seed(seed)
    model = GPT(ModelConfig(**{**MICRO.to_dict(), "qk_norm": qk_norm}))
    x = torch.randint(0, MICRO.vocab_size, (2, 16))
    loss_sum, n = model(x, x.roll(-1, dims=1))
    (loss_sum / n).backward()
    return model


@pytest.mark.parametrize("shape", [(48, 32), (32, 48), (32, 32)])
def test_orthogonalize_approximates_u_v_transpose(shape) -> None:
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    out = orthogonalize(g)
    assert out.shape == g.shape and out.dtype == g.dtype
    singular = torch.linalg.svdvals(out)
    # Keller's quintic trades exactness for speed: singular values land near 1, not on it.
    assert singular.min() > 0.6 and singular.max() < 1.3
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    cosine = (out * (u @ vh)).sum() / (out.norm() * (u @ vh).norm())
    assert cosine > 0.95


def test_the_blocks_matrices_take_muon_and_the_rest_adamw() -> None:
    model = model_with_grads(qk_norm=True)
    opt = optimizer_for(model, muon_config(qk_norm=True))
    kinds = [g["kind"] for g in opt.param_groups]
    assert kinds == ["muon", "adamw", "adamw"]
    names = param_names(model, opt)
    sizes = [len(g["params"]) for g in opt.param_groups]
    muon, adam_2d, adam_1d = names[: sizes[0]], names[sizes[0] : -sizes[2]], names[-sizes[2] :]
    assert all(n.startswith("layers.") and n.endswith(("w1.weight", "w2.weight", "w3.weight",
               "wq.weight", "wk.weight", "wv.weight", "wo.weight")) for n in muon)  # fmt: skip
    assert len(muon) == 7 * MICRO.n_layers
    assert adam_2d == ["tok_embeddings.weight"]
    assert any(n.endswith("q_norm.weight") for n in adam_1d) and "norm.weight" in adam_1d
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())


def test_muon_step_is_its_definition() -> None:
    """momentum -> Nesterov -> Newton-Schulz -> decoupled decay and a shape-scaled step."""
    model = model_with_grads()
    cfg = muon_config(weight_decay=0.1, muon_lr=0.02, muon_momentum=0.9)
    opt = optimizer_for(model, cfg)
    set_lr(opt, cfg.lr)
    group = opt.param_groups[0]
    assert group["lr"] == pytest.approx(0.02) and group["weight_decay"] == pytest.approx(
        0.1 * cfg.lr / 0.02
    )
    p = model.layers[0].feed_forward.w1.weight  # (48, 32): tall, scaled by sqrt(48 / 32)
    before, grad = p.detach().clone(), p.grad.clone()
    opt.step()
    nesterov = grad.add(grad, alpha=0.9)  # the buffer starts at 0: after one step it is grad
    lr = group["lr"]
    want = before.mul(1 - lr * group["weight_decay"])
    want.add_(orthogonalize(nesterov), alpha=-lr * math.sqrt(48 / 32))
    assert torch.equal(p.detach(), want)
    assert torch.equal(opt.state[p]["momentum_buffer"], grad)


@pytest.mark.parametrize("fused", [True, False])
def test_the_adamw_part_is_torch_adamw_bit_for_bit(fused) -> None:
    model_a, model_b = model_with_grads(), model_with_grads()
    emb_a, emb_b = model_a.tok_embeddings.weight, model_b.tok_embeddings.weight
    norm_a, norm_b = model_a.norm.weight, model_b.norm.weight
    settings = {"kind": "adamw", "betas": (0.9, 0.95), "eps": 1e-8, "lr": 1e-3}
    ours = MuonAdamW(
        [
            {**settings, "params": [emb_a], "weight_decay": 0.1},
            {**settings, "params": [norm_a], "weight_decay": 0.0},
        ],
        fused=fused,
    )
    theirs = torch.optim.AdamW(
        [{"params": [emb_b], "weight_decay": 0.1}, {"params": [norm_b], "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=True if fused else None,
    )
    for _ in range(3):
        ours.step()
        theirs.step()
    assert torch.equal(emb_a, emb_b) and torch.equal(norm_a, norm_b)
    assert torch.equal(ours.state[emb_a]["exp_avg_sq"], theirs.state[emb_b]["exp_avg_sq"])


def test_state_round_trips_through_the_checkpoint_layout() -> None:
    """Saved after two steps and loaded into a fresh optimizer, the third step is the same."""
    cfg = muon_config()
    model = model_with_grads()
    opt = optimizer_for(model, cfg)
    opt.step()
    opt.step()
    meta, tensors = ckpt.optimizer_to_flat(opt)
    assert any(k.endswith(".momentum_buffer") for k in tensors)
    assert any(k.endswith(".exp_avg") for k in tensors)
    restored_sd = ckpt.optimizer_from_flat(meta, ckpt.optimizer_tensors(tensors))
    twin = model_with_grads()
    twin.load_state_dict(model.state_dict())
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        q.grad = p.grad.clone()
    twin_opt = optimizer_for(twin, cfg)
    twin_opt.load_state_dict(restored_sd)
    opt.step()
    twin_opt.step()
    assert all(
        torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters(), strict=True)
    )


@pytest.mark.parametrize("fused", [True, False])
def test_a_loaded_step_count_lives_where_its_adamw_kernel_wants_it(fused) -> None:
    """torch's loader keeps "step" on the CPU unless a param group says fused; the fused
    kernel wants it on the parameter's device (a resumed CUDA run of the recipe failed at its
    first step). A parameter on the meta device stands in for a GPU here."""
    saved = MuonAdamW([{"kind": "adamw", "params": [torch.zeros(3)], "betas": (0.9, 0.95),
                        "eps": 1e-8, "lr": 1e-3}], fused=fused)  # fmt: skip
    saved.param_groups[0]["params"][0].grad = torch.ones(3)
    saved.step()
    on_meta = torch.zeros(3, device="meta")
    loaded = MuonAdamW([{"kind": "adamw", "params": [on_meta], "betas": (0.9, 0.95),
                         "eps": 1e-8, "lr": 1e-3}], fused=fused)  # fmt: skip
    loaded.load_state_dict(saved.state_dict())
    state = loaded.state[on_meta]
    assert state["exp_avg"].device.type == "meta"
    assert state["step"].device.type == ("meta" if fused else "cpu")  # the non-fused layout
    assert state["step"].dtype == torch.float32


def test_set_lr_scales_only_the_muon_group() -> None:
    model = model_with_grads()
    opt = optimizer_for(model, muon_config(muon_lr=0.05, lr=1e-3))
    set_lr(opt, 5e-4)  # half the peak: the Muon lr is half its peak too
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
    assert [g["lr"] for g in opt.param_groups[1:]] == [5e-4, 5e-4]
    adam = optimizer_for(model, TrainConfig(model="micro", context=16))
    set_lr(adam, 5e-4)
    assert all(g["lr"] == 5e-4 and "lr_ratio" not in g for g in adam.param_groups)


def test_a_muon_group_refuses_a_vector() -> None:
    with pytest.raises(ValueError, match="only 2-D"):
        MuonAdamW([{"kind": "muon", "params": [torch.nn.Parameter(torch.ones(3))]}], fused=False)


def test_fewer_newton_schulz_steps_take_their_own_update() -> None:
    """--muon-ns-steps 3: the group's iterations, not the default five; a group saved before
    the setting existed (no ns_steps) takes five, as those runs did."""
    updates = {}
    for steps in (3, 5, None):
        model = model_with_grads()
        cfg = muon_config(muon_ns_steps=3 if steps == 3 else 5)
        opt = optimizer_for(model, cfg)
        set_lr(opt, cfg.lr)
        if steps is None:
            del opt.param_groups[0]["ns_steps"]
        p = model.layers[0].feed_forward.w1.weight
        before = p.detach().clone()
        nesterov = p.grad.add(p.grad, alpha=cfg.muon_momentum)
        opt.step()
        group = opt.param_groups[0]
        want = before.mul(1 - group["lr"] * group["weight_decay"])
        want.add_(orthogonalize(nesterov, steps or 5), alpha=-group["lr"] * math.sqrt(48 / 32))
        assert torch.equal(p.detach(), want)
        updates[steps] = p.detach().clone()
    assert torch.equal(updates[None], updates[5]) and not torch.equal(updates[3], updates[5])


def test_ns_steps_join_the_fingerprint_only_when_set() -> None:
    five, three = muon_config(), muon_config(muon_ns_steps=3)
    assert "muon_ns_steps" not in five.trajectory(1)
    assert three.trajectory(1)["muon_ns_steps"] == 3
    assert five.fingerprint_for(1) != three.fingerprint_for(1)


def plain_iterations(x: torch.Tensor, steps: int) -> torch.Tensor:
    """The iteration written out, on an already normalised wide `x`: the definition."""
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        g = x @ x.T
        x = a * x + (b * g + c * g @ g) @ x
    return x


@pytest.mark.parametrize("steps", [1, 3, 5])
def test_the_gram_form_is_the_same_polynomial(steps) -> None:
    """On a 32 x 96 matrix with singular values spread over two decades: computed in float64,
    the Gram iterations equal the plain ones to 1e-12. In float32 the Gram form rounds worse
    (its Q is never corrected by X itself): against the float64 result, 8e-7 after three
    iterations (the plain form 3e-7) and 3e-5 after five (6e-7), on entries up to 0.35; far
    inside the spread of the singular values the iteration leaves (0.7 to 1.2)."""
    gen = torch.Generator().manual_seed(2)
    u, _ = torch.linalg.qr(torch.randn(32, 32, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(96, 32, generator=gen, dtype=torch.float64))
    x = u @ torch.diag(torch.logspace(-2, 0, 32, dtype=torch.float64)) @ v.T
    x = x / x.norm()
    want = plain_iterations(x, steps)
    assert (newton_schulz_gram(x, steps) - want).abs().max() < 1e-12
    got32 = newton_schulz_gram(x.float(), steps).double()
    assert (got32 - want).abs().max() < (1e-5 if steps <= 3 else 2e-4) * want.abs().max()


@pytest.mark.parametrize("shape", [(48, 32), (32, 48)])
def test_gram_orthogonalises_rectangles_like_the_plain_form_and_leaves_squares_alone(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    plain, gram = orthogonalize(g, 3), orthogonalize(g, 3, gram=True)
    assert gram.shape == g.shape
    assert not torch.equal(plain, gram)  # another order of products: its own bits
    assert (plain - gram).abs().max() < 1e-5
    square = torch.randn(32, 32, generator=torch.Generator().manual_seed(4))
    assert torch.equal(orthogonalize(square, 3, gram=True), orthogonalize(square, 3))


def test_muon_gram_reaches_the_groups_and_the_fingerprint_only_when_set() -> None:
    plain, gram = muon_config(), muon_config(muon_gram=True)
    assert "muon_gram" not in plain.trajectory(1) and gram.trajectory(1)["muon_gram"] is True
    assert plain.fingerprint_for(1) != gram.fingerprint_for(1)
    model = model_with_grads()
    opt = optimizer_for(model, gram)
    assert opt.param_groups[0]["gram"] is True
    set_lr(opt, gram.lr)
    p = model.layers[0].feed_forward.w1.weight  # 48 x 32: tall, iterated on its 32 x 32 Gram
    before = p.detach().clone()
    nesterov = p.grad.add(p.grad, alpha=gram.muon_momentum)
    opt.step()
    group = opt.param_groups[0]
    want = before.mul(1 - group["lr"] * group["weight_decay"])
    want.add_(orthogonalize(nesterov, 5, gram=True), alpha=-group["lr"] * math.sqrt(48 / 32))
    assert torch.equal(p.detach(), want)


def test_ns_dtype_auto_keeps_the_old_rule_and_bf16_rounds_at_8_bits() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert ns_dtype("auto", cpu, gram=False) == torch.float32
    assert ns_dtype("auto", cuda, gram=False) == torch.bfloat16
    assert ns_dtype("auto", cuda, gram=True) == torch.float32
    assert ns_dtype("bf16", cpu, gram=True) == torch.bfloat16
    assert ns_dtype("fp32", cuda, gram=False) == torch.float32
    g = torch.randn(48, 32, generator=torch.Generator().manual_seed(5))
    for gram in (False, True):
        fp32 = orthogonalize(g, 3, gram=gram)
        assert torch.equal(orthogonalize(g, 3, gram=gram, dtype="auto"), fp32)
        assert torch.equal(orthogonalize(g, 3, gram=gram, dtype="fp32"), fp32)
        bf16 = orthogonalize(g, 3, gram=gram, dtype="bf16")
        assert bf16.dtype == torch.float32 and not torch.equal(bf16, fp32)
        # bf16 keeps 8 bits of mantissa: about 0.4% per product, a few of them in a row
        assert (bf16 - fp32).norm() < 0.03 * fp32.norm()


def test_muon_ns_dtype_reaches_the_groups_and_the_fingerprint_only_when_set() -> None:
    auto, bf16 = muon_config(), muon_config(muon_ns_dtype="bf16")
    assert "muon_ns_dtype" not in auto.trajectory(1)
    assert bf16.trajectory(1)["muon_ns_dtype"] == "bf16"
    assert auto.fingerprint_for(1) != bf16.fingerprint_for(1)
    assert optimizer_for(model_with_grads(), bf16).param_groups[0]["ns_dtype"] == "bf16"
