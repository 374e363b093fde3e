"""The plain decode's packed weight products (octlm/model/packed.py): equal to `F.linear` to
float rounding where they run packed, bit for bit `F.linear` where they do not."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octlm.config.shape import ModelConfig
from octlm.generation.sampling import generate_batch
from octlm.model.gpt import GPT
from octlm.model.kvcache import KVCache, forward_cached
from octlm.model.packed import MIN_ROWS, MIN_WEIGHT, PackedWeights

VOCAB = MIN_WEIGHT // 64
SHAPE = dict(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)
"""The head (VOCAB x 64) is just big enough to run packed; every layer's weight stays plain."""


def model(**extra: object) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(**SHAPE, context=64, **extra)).eval()  # type: ignore[arg-type]


def test_packed_from_min_rows_and_min_weight_plain_below() -> None:
    torch.manual_seed(1)
    weight = torch.randn(MIN_WEIGHT // 512, 512)
    small = torch.randn(96, 512)  # below MIN_WEIGHT: F.linear at any row count
    packed = PackedWeights()
    for rows in (1, MIN_ROWS - 1):
        x = torch.randn(rows, 512)
        assert torch.equal(packed.linear(x, weight), F.linear(x, weight))
    x = torch.randn(8, 512)
    assert torch.equal(packed.linear(x, small), F.linear(x, small))
    assert not packed.packs  # nothing packed below MIN_ROWS or MIN_WEIGHT
    for shape in ((MIN_ROWS, 512), (8, 1, 512), (3, 5, 512)):
        x = torch.randn(*shape)
        out = packed.linear(x, weight)
        assert out.shape == (*shape[:-1], weight.shape[0])
        torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-4)
    assert list(packed.packs) == [id(weight)]  # packed once, for every row count


def test_bf16_and_autocast_stay_plain() -> None:
    packed = PackedWeights()
    weight = torch.randn(MIN_WEIGHT // 16, 16, dtype=torch.bfloat16)
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    assert torch.equal(packed.linear(x, weight), F.linear(x, weight))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w32, x32 = torch.randn(MIN_WEIGHT // 16, 16), torch.randn(8, 16)
        assert torch.equal(packed.linear(x32, w32), F.linear(x32, w32))
    assert not packed.packs


def test_a_packed_decode_agrees_with_the_plain_one() -> None:
    for extra in ({}, {"qk_norm": True, "value_residual": True, "logit_softcap": 15.0}):
        gpt = model(**extra)
        torch.manual_seed(2)
        prompt = torch.randint(0, VOCAB, (8, 12))
        plain, packed = KVCache(gpt, 8), KVCache(gpt, 8)
        weights = PackedWeights()
        a = forward_cached(gpt, prompt, plain, last_only=False)
        b = forward_cached(gpt, prompt, packed, last_only=False, linear=weights.linear)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        for _ in range(5):
            token = a[:, -1:].argmax(-1)
            a = forward_cached(gpt, token, plain)
            b = forward_cached(gpt, token, packed, linear=weights.linear)
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        assert not weights.broken
        assert list(weights.packs) == [id(gpt.tok_embeddings.weight)]  # the head ran packed


def test_plain_generate_batch_packs_and_agrees_with_exact_greedy() -> None:
    gpt = model()
    torch.manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,)).tolist() for n in (5, 9, 7, 12, 3, 8)]
    plain = generate_batch(gpt, prompts, 6, exact=False)
    exact = generate_batch(gpt, prompts, 6, exact=True)
    assert plain == exact  # greedy: rounding-level differences do not move an argmax here
