"""Tests for octlm.model.gpt: parameter accounting, tying, causality, loss contract, init, RoPE,
GQA."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from octlm.config.shape import PRESETS, ModelConfig, preset
from octlm.model.gpt import GPT, IGNORE_INDEX, Attention, FeedForward, RMSNorm
from octlm.model.positions import SERIAL_ELEMENTS, apply_rope, on_this_thread, rope_tables

# A few-layer model small enough that every test runs in well under a second.
MICRO = ModelConfig(
    vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, context=16
)


def make(config: ModelConfig = MICRO, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


def batch(config: ModelConfig = MICRO, b: int = 2, t: int = 12, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (b, t), generator=g)


# --- parameter accounting -------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_model() -> GPT:
    return make(preset("small"))


def test_small_preset_counts(small_model: GPT) -> None:
    assert small_model.num_params(non_embedding=True) == 9_442_176
    assert small_model.num_params() == 22_025_088
    assert small_model.num_linear_layers() == 42
    assert len(list(small_model.parameters())) == 56
    assert small_model.flops_per_token() == 160_462_080
    assert small_model.flops_per_token(1024) == 160_462_080
    assert round(small_model.flops_per_token() / 1e6, 1) == 160.5
    # Shorter sequences only shrink the attention term.
    assert small_model.flops_per_token(512) == 160_462_080 - 12 * 6 * 384 * 512


def test_main_preset_size() -> None:
    # The meta device skips allocation, so counting 88M parameters is instant.
    with torch.device("meta"):
        model = GPT(preset("main"))
    assert 87e6 < model.num_params() < 89e6
    assert model.num_params() == 88_096_512


def test_tiny_preset_and_overrides() -> None:
    cfg = preset("tiny", dropout=0.1)
    assert cfg.d_model == 192 and cfg.dropout == 0.1
    assert PRESETS["tiny"].dropout == 0.0  # presets themselves are never mutated
    assert cfg.head_dim == 32


# --- weight tying ---------------------------------------------------------------------------


def test_output_layer_is_tied_embedding(small_model: GPT) -> None:
    keys = list(small_model.state_dict())
    assert len(keys) == len(list(small_model.named_parameters())) == 56
    assert not any(k.startswith(("output", "lm_head")) for k in keys)
    assert "tok_embeddings.weight" in keys and "norm.weight" in keys
    assert "layers.5.attention.wk.weight" in keys and "layers.5.feed_forward.w3.weight" in keys
    assert not any("rope" in k for k in keys)  # RoPE tables are non-persistent


def test_logits_use_embedding_matrix() -> None:
    model = make().eval()
    inputs = batch()
    captured: list[torch.Tensor] = []
    model.norm.register_forward_hook(lambda _m, _i, out: captured.append(out))
    logits = model(inputs)
    torch.testing.assert_close(logits, captured[0] @ model.tok_embeddings.weight.T)

    # Zeroing the embedding row of a token absent from the input zeroes that token's logits.
    absent = next(v for v in range(MICRO.vocab_size) if v not in inputs)
    with torch.no_grad():
        model.tok_embeddings.weight[absent] = 0.0
    assert torch.all(model(inputs)[..., absent] == 0)


# --- causality ------------------------------------------------------------------------------


def test_no_gradient_from_future_positions() -> None:
    model = make().eval()
    inputs = batch(t=10)
    embedded: list[torch.Tensor] = []

    def keep_grad(_m: torch.nn.Module, _i: object, out: torch.Tensor) -> None:
        out.retain_grad()
        embedded.append(out)

    model.tok_embeddings.register_forward_hook(keep_grad)
    t = 4
    model(inputs)[:, t].sum().backward()
    grad = embedded[0].grad
    assert grad is not None
    assert torch.all(grad[:, t + 1 :] == 0)
    assert torch.all(grad[:, : t + 1].abs().sum(-1) > 0)


def test_future_token_does_not_change_past_logits() -> None:
    model = make().eval()
    inputs = batch(t=10)
    changed = inputs.clone()
    changed[:, 7] = (changed[:, 7] + 1) % MICRO.vocab_size
    a, b = model(inputs), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


# --- loss contract --------------------------------------------------------------------------


def test_loss_sum_and_count_with_ignored_targets() -> None:
    model = make().eval()
    inputs, targets = batch(seed=1), batch(seed=2)
    targets[0, :5] = IGNORE_INDEX
    targets[1, -3:] = IGNORE_INDEX
    loss_sum, n = model(inputs, targets)
    assert loss_sum.dtype == torch.float32 and loss_sum.ndim == 0
    assert n.dtype == torch.int64 and n.item() == 24 - 8

    # Independent reference: log-softmax and gather over the unmasked positions only.
    logp = model(inputs).float().log_softmax(-1)
    mask = targets != IGNORE_INDEX
    expected = -logp[mask].gather(-1, targets[mask].unsqueeze(-1)).sum()
    torch.testing.assert_close(loss_sum, expected)
    torch.testing.assert_close(
        loss_sum,
        F.cross_entropy(logp.flatten(0, 1), targets.flatten(), reduction="sum", ignore_index=-100),
    )


def test_accumulated_sums_give_true_masked_mean() -> None:
    model = make().eval()
    inputs, targets = batch(b=4, seed=3), batch(b=4, seed=4)
    targets[0, 2:] = IGNORE_INDEX  # micro-batches with very different target counts
    whole_sum, whole_n = model(inputs, targets)
    s1, n1 = model(inputs[:2], targets[:2])
    s2, n2 = model(inputs[2:], targets[2:])
    torch.testing.assert_close((s1 + s2) / (n1 + n2), whole_sum / whole_n)


def test_all_ignored_targets() -> None:
    model = make()
    inputs = batch()
    loss_sum, n = model(inputs, torch.full_like(inputs, IGNORE_INDEX))
    assert loss_sum.item() == 0.0 and n.item() == 0
    loss_sum.backward()  # must not produce NaN gradients
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# --- init -----------------------------------------------------------------------------------


def test_init_statistics() -> None:
    cfg = preset("tiny")
    model = make(cfg)
    resid_std = 0.02 / math.sqrt(2 * cfg.n_layers)
    for name, p in model.named_parameters():
        if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
            assert p.std().item() == pytest.approx(resid_std, rel=0.05), name
        elif name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
            assert abs(p.mean().item()) < 1e-3, name


def test_init_is_seeded() -> None:
    a, b, c = make(seed=5), make(seed=5), make(seed=6)
    triples = zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True)
    for (name, pa), pb, pc in triples:
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name


def test_init_weights_with_generator_leaves_global_rng_alone() -> None:
    a, b = make(seed=0), make(seed=1)
    state = torch.get_rng_state()
    a.init_weights(torch.Generator().manual_seed(9))
    b.init_weights(torch.Generator().manual_seed(9))
    assert torch.equal(state, torch.get_rng_state())
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


# --- attention ------------------------------------------------------------------------------


def test_gqa_matches_repeated_kv_reference() -> None:
    cfg = MICRO  # 4 query heads share 2 kv heads
    torch.manual_seed(0)
    attn = Attention(cfg).eval()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.3)  # larger than init so the softmax is not ~uniform
    x = torch.randn(2, 9, cfg.d_model)
    cos, sin = rope_tables(cfg.head_dim, 9, cfg.rope_base)

    B, T, H, D = 2, 9, cfg.n_heads, cfg.head_dim
    q = apply_rope(attn.wq(x).view(B, T, H, D).transpose(1, 2), cos, sin)
    k = apply_rope(attn.wk(x).view(B, T, cfg.n_kv_heads, D).transpose(1, 2), cos, sin)
    v = attn.wv(x).view(B, T, cfg.n_kv_heads, D).transpose(1, 2)
    group = H // cfg.n_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
    torch.testing.assert_close(attn(x, cos, sin)[0], attn.wo(y))


def test_rope_relative_position_and_norm() -> None:
    D = 16
    cos, sin = rope_tables(D, 64, 10000.0)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(D, generator=g), torch.randn(D, generator=g)

    def rot(x: torch.Tensor, pos: int) -> torch.Tensor:
        return apply_rope(x, cos[pos], sin[pos])

    base = rot(q, 10) @ rot(k, 3)
    for shift in (1, 7, 40):
        torch.testing.assert_close(rot(q, 10 + shift) @ rot(k, 3 + shift), base)
    assert not torch.allclose(rot(q, 10) @ rot(k, 4), base)  # but it does depend on m - n
    for pos in (0, 5, 63):
        torch.testing.assert_close(rot(q, pos).norm(), q.norm())


def test_on_this_thread_is_the_single_threaded_result_in_slices_below_the_grain() -> None:
    x = torch.linspace(-300.0, 300.0, 13 * 800).view(-1, 13)  # slices that cut rows
    assert x.numel() > 2 * SERIAL_ELEMENTS
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = x.cos(), x.sin()
    finally:
        torch.set_num_threads(threads)
    got = on_this_thread(torch.cos, x), on_this_thread(torch.sin, x)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert got[0].shape == x.shape


ROPE_HASH = (
    "import hashlib, octlm; from octlm.model.positions import rope_tables; "
    "c, s = rope_tables(64, 256, 10000.0); "
    "print(hashlib.sha256(c.numpy().tobytes() + s.numpy().tobytes()).hexdigest())"
)


@pytest.mark.slow
def test_fresh_processes_at_two_threads_build_the_tables_one_thread_builds() -> None:
    """On a 2-core AVX-512 machine, before the tables were built on one thread, about one
    fresh process in six computed the second thread's half of a parallel `cos` up to 1.5e-4
    off (a race on first use); the tables feed every step, so that process's run parted from
    every other. Fresh processes at two threads, one after another (side by side they rarely
    race), must all build the one-thread tables."""
    cos, sin = rope_tables(64, 256, 10000.0)
    expected = hashlib.sha256(cos.numpy().tobytes() + sin.numpy().tobytes()).hexdigest()
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    for _ in range(6):
        out = subprocess.run(
            [sys.executable, "-c", ROPE_HASH], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.stdout.strip() == expected, out.stderr


def test_rope_uses_rotate_half_layout() -> None:
    # HF Llama pairs dim i with dim i + D/2; an interleaved layout would pair i with i + 1.
    D, pos = 8, 3
    cos, sin = rope_tables(D, 8, 10000.0)
    e0 = torch.zeros(D)
    e0[0] = 1.0
    out = apply_rope(e0, cos[pos], sin[pos])
    expected = torch.zeros(D)
    expected[0], expected[D // 2] = math.cos(pos), math.sin(pos)  # inv_freq[0] == 1
    torch.testing.assert_close(out, expected)
    # Frequency i is base ** (-2i / D): check i = 1 against the table directly.
    angle = pos * 10000.0 ** (-2 / D)
    torch.testing.assert_close(cos[pos, [1, 1 + D // 2]], torch.tensor([math.cos(angle)] * 2))
    torch.testing.assert_close(sin[pos, [1, 1 + D // 2]], torch.tensor([math.sin(angle)] * 2))
    assert cos.dtype == sin.dtype == torch.float32


def test_rms_norm_matches_formula_and_keeps_dtype() -> None:
    norm = RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 8))
    x = 1e-3 * torch.randn(3, 8, generator=torch.Generator().manual_seed(0))  # eps matters here
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    out = norm(x.bfloat16())
    assert out.dtype == torch.bfloat16
    # Computed in float32 from the bf16 input, then rounded once.
    ref = x.bfloat16().float()
    ref = ref / torch.sqrt(ref.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    assert torch.equal(out, ref.bfloat16())


# --- dropout --------------------------------------------------------------------------------


def test_no_dropout_train_mode_is_deterministic() -> None:
    model = make().train()
    inputs = batch()
    torch.testing.assert_close(model(inputs), model(inputs), rtol=0, atol=0)


def test_dropout_consumes_rng_in_training_only() -> None:
    model = make(ModelConfig.from_dict({**MICRO.to_dict(), "dropout": 0.2})).train()
    inputs = batch()
    assert not torch.equal(model(inputs), model(inputs))
    torch.manual_seed(3)
    first = model(inputs)
    torch.manual_seed(3)
    assert torch.equal(first, model(inputs))  # randomness comes from the torch RNG
    model.eval()
    assert torch.equal(model(inputs), model(inputs))


def test_residual_dropout_after_output_projections() -> None:
    cfg = ModelConfig.from_dict({**MICRO.to_dict(), "dropout": 0.5})
    x = torch.randn(2, 8, cfg.d_model)
    cos, sin = rope_tables(cfg.head_dim, 8, cfg.rope_base)
    torch.manual_seed(0)
    # Attention dropout alone would never zero whole output features; residual dropout does.
    for out in (Attention(cfg).train()(x, cos, sin)[0], FeedForward(cfg).train()(x)):
        assert 0.3 < (out == 0).float().mean().item() < 0.7
    assert not (Attention(cfg).eval()(x, cos, sin)[0] == 0).any()

    # With residual dropout switched off, sdpa's attention dropout still randomises training.
    attn = Attention(cfg).train()
    attn.resid_dropout = torch.nn.Identity()
    assert not torch.equal(attn(x, cos, sin)[0], attn(x, cos, sin)[0])


# --- validation -----------------------------------------------------------------------------


def test_too_long_sequence_raises() -> None:
    model = make()
    model(batch(t=MICRO.context))  # exactly the context is fine
    with pytest.raises(ValueError, match="context"):
        model(batch(t=MICRO.context + 1))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"n_heads": 5}, "d_model"),
        ({"n_kv_heads": 3}, "n_heads"),
        ({"d_model": 36, "n_heads": 4, "n_kv_heads": 4}, "head_dim"),
        ({"d_ff": 0}, "d_ff"),
        ({"dropout": 1.0}, "dropout"),
        ({"norm_eps": -1.0}, "norm_eps"),
    ],
)
def test_bad_config_raises(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{**MICRO.to_dict(), **overrides})


def test_preset_errors() -> None:
    with pytest.raises(ValueError, match="tiny"):
        preset("nope")
    with pytest.raises(ValueError, match="widht"):
        preset("tiny", widht=3)


def test_config_dict_round_trip() -> None:
    for cfg in PRESETS.values():
        d = cfg.to_dict()
        assert all(type(v) in (int, float, bool) for v in d.values())  # JSON-safe
        assert ModelConfig.from_dict(d) == cfg
    with pytest.raises(ValueError, match="bogus"):
        ModelConfig.from_dict({**MICRO.to_dict(), "bogus": 1})


# --- mixed precision ------------------------------------------------------------------------


def test_bf16_autocast_forward() -> None:
    model = make()
    inputs, targets = batch(seed=1), batch(seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(inputs)
        loss_sum, n = model(inputs, targets)
    assert logits.dtype == torch.bfloat16
    assert loss_sum.dtype == torch.float32 and torch.isfinite(loss_sum)
    loss_sum.backward()
    # fp32 master weights get gradients and the bf16 loss stays close to the fp32 one.
    assert model.tok_embeddings.weight.grad is not None
    fp32_sum, _ = model(inputs, targets)
    assert (loss_sum / n).item() == pytest.approx((fp32_sum / n).item(), rel=0.02)


# --- the recipe options: off by default, each doing what it says -----------------------------


def with_options(**options: object) -> ModelConfig:
    return ModelConfig(**{**MICRO.to_dict(), **options})


def test_options_off_build_the_same_model_and_draw_the_same_init() -> None:
    off = with_options(
        qk_norm=False, logit_softcap=0.0, value_residual=False, zero_init_residual=False
    )
    plain, off = make(), make(off)
    a, b = plain.state_dict(), off.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_qk_norm_adds_one_gain_per_head_dim_for_q_and_k_and_changes_the_logits() -> None:
    plain, normed = make(), make(with_options(qk_norm=True))
    extra = set(normed.state_dict()) - set(plain.state_dict())
    want = {f"layers.{i}.attention.{n}_norm.weight" for i in range(2) for n in "qk"}
    assert extra == want
    assert all(normed.state_dict()[k].shape == (MICRO.head_dim,) for k in extra)
    shared = {k: v for k, v in plain.state_dict().items()}
    normed.load_state_dict({**normed.state_dict(), **shared})  # same weights, gains of one
    x = batch()
    assert not torch.allclose(plain(x), normed(x))


def test_qk_norm_normalises_each_heads_query_before_rope() -> None:
    cfg = with_options(qk_norm=True)
    attn = make(cfg).layers[0].attention
    x = torch.randn(1, 5, cfg.d_model)
    q = attn.wq(x).view(1, 5, cfg.n_heads, cfg.head_dim).transpose(1, 2)
    normed = attn.q_norm(q)
    rms = normed.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-3, rtol=0)


def test_softcap_bounds_the_logits_and_is_c_tanh_of_the_plain_ones() -> None:
    cap = 0.05  # below the init's largest logit, so the cap binds (a run refuses caps < 1)
    plain, capped = make(), make(with_options(logit_softcap=cap))
    capped.load_state_dict(plain.state_dict())
    x = batch()
    raw, out = plain(x), capped(x)
    assert raw.abs().max() > cap >= out.abs().max()
    torch.testing.assert_close(out, cap * torch.tanh(raw / cap))


def test_z_loss_sum_is_the_squared_log_normaliser_over_real_targets() -> None:
    model = make()
    x = batch()
    y = x.roll(-1, dims=1)
    y[0, :4] = IGNORE_INDEX
    loss_sum, n, z_sum = model(x, y, z_loss=True)
    plain_sum, plain_n = model(x, y)
    assert torch.equal(loss_sum, plain_sum) and torch.equal(n, plain_n)  # the loss is the CE
    log_z = torch.logsumexp(model(x).float(), dim=-1)
    want = log_z.square()[y != IGNORE_INDEX].sum()
    torch.testing.assert_close(z_sum, want)


def test_zero_init_residual_starts_every_block_as_the_identity() -> None:
    """wo and w2 start at zero, so each block adds nothing: the logits at init are the output
    layer of the embedding alone. The other weights draw the plain model's init."""
    plain, zeroed = make(), make(with_options(zero_init_residual=True))
    projections = {
        f"layers.{i}.{n}.weight" for i in range(2) for n in ("attention.wo", "feed_forward.w2")
    }
    for name, weight in zeroed.state_dict().items():
        if name in projections:
            assert not weight.any()
        else:
            assert torch.equal(weight, plain.state_dict()[name])
    x = batch()
    torch.testing.assert_close(zeroed(x), zeroed.output(zeroed.tok_embeddings(x)))


def test_value_residual_averages_each_later_blocks_values_with_the_first_blocks() -> None:
    """Block 0 attends with its own values; every later block with the mean of its own and
    block 0's (the same weights, so the plain model's logits differ only through that)."""
    plain, mixed = make(), make(with_options(value_residual=True))
    assert mixed.state_dict().keys() == plain.state_dict().keys()
    mixed.load_state_dict(plain.state_dict())
    x = batch()
    assert not torch.allclose(plain(x), mixed(x))
    h = mixed.tok_embeddings(x)
    cos, sin = mixed.rope(x.shape[1])
    first = None
    for layer in mixed.layers:
        attn = layer.attention
        values = attn.wv(layer.attention_norm(h))
        values = values.view(*x.shape, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
        want = values if first is None else 0.5 * (values + first)
        h, got = layer(h, cos, sin, None, first)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        first = want if first is None else first
    torch.testing.assert_close(mixed.output(h), mixed(x))


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"qk_norm": 1}, "qk_norm"),
        ({"zero_init_residual": "yes"}, "zero_init_residual"),
        ({"value_residual": 1}, "value_residual"),
        ({"logit_softcap": -1.0}, "logit_softcap"),
        ({"logit_softcap": math.inf}, "logit_softcap"),
        ({"logit_softcap": True}, "logit_softcap"),
    ],
)
def test_bad_option_values_raise(options: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        with_options(**options)


def test_a_config_written_before_the_options_reads_with_them_off() -> None:
    new = ("qk_norm", "logit_softcap", "value_residual", "zero_init_residual")
    old = {k: v for k, v in MICRO.to_dict().items() if k not in new}
    assert ModelConfig.from_dict(old) == MICRO
