"""Tests for octlm.generate: greedy decoding, seeded sampling, top-k, and no global RNG use."""

from __future__ import annotations

import pytest
import torch

from octlm.generate import generate
from octlm.model import GPT, preset

CONTEXT = 32
PROMPT = [1, 17, 250, 3, 99]


def make_model(dropout: float = 0.0, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = preset(
        "tiny",
        vocab_size=512,
        context=CONTEXT,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=128,
        dropout=dropout,
    )
    return GPT(config).eval()


@pytest.fixture(scope="module")
def model() -> GPT:
    return make_model()


def manual_greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            window = torch.tensor([ids[-CONTEXT:]])
            ids.append(int(model(window)[0, -1].argmax()))
    return ids[len(prompt) :]


def test_greedy_equals_a_manual_argmax_loop_past_the_context(model: GPT) -> None:
    n = CONTEXT + 8  # longer than the context: the window slides
    out = generate(model, PROMPT, n)
    assert out == manual_greedy(model, PROMPT, n)
    assert len(out) == n
    assert generate(model, PROMPT, n) == out  # deterministic


def test_greedy_ignores_the_seed(model: GPT) -> None:
    assert generate(model, PROMPT, 12, seed=1) == generate(model, PROMPT, 12, seed=2)


def test_sampling_is_reproducible_from_its_seed(model: GPT) -> None:
    a = generate(model, PROMPT, 40, temperature=1.0, seed=123)
    b = generate(model, PROMPT, 40, temperature=1.0, seed=123)
    c = generate(model, PROMPT, 40, temperature=1.0, seed=124)
    assert a == b
    assert a != c
    assert a != generate(model, PROMPT, 40)  # a random-init model samples away from greedy
    assert all(0 <= t < 512 for t in a + c)


def test_top_k_one_equals_greedy(model: GPT) -> None:
    greedy = generate(model, PROMPT, 20)
    for seed in (0, 1, 2):
        assert generate(model, PROMPT, 20, temperature=1.5, top_k=1, seed=seed) == greedy


def test_top_k_samples_only_among_the_k_most_likely(model: GPT) -> None:
    k = 5
    out = generate(model, PROMPT, 30, temperature=2.0, top_k=k, seed=7)
    ids = list(PROMPT)
    with torch.no_grad():
        for token in out:
            logits = model(torch.tensor([ids[-CONTEXT:]]))[0, -1]
            assert token in set(torch.topk(logits, k).indices.tolist())
            ids.append(token)
    assert len(set(out)) > 1  # it did sample, not only take the argmax


def test_generation_does_not_touch_the_global_rng(model: GPT) -> None:
    state = torch.get_rng_state()
    generate(model, PROMPT, 20, temperature=1.0, seed=5)
    generate(model, PROMPT, 20, temperature=0.8, top_k=10, seed=6)
    generate(model, PROMPT, 5)
    assert torch.equal(torch.get_rng_state(), state)


def test_a_model_left_in_train_mode_with_dropout_still_generates_reproducibly() -> None:
    model = make_model(dropout=0.5).train()
    state = torch.get_rng_state()
    a = generate(model, PROMPT, 20, temperature=1.0, seed=5)
    assert torch.equal(torch.get_rng_state(), state)  # dropout would draw from the global RNG
    assert generate(model, PROMPT, 20, temperature=1.0, seed=5) == a
    assert generate(model, PROMPT, 20) == manual_greedy(make_model().eval(), PROMPT, 20)
    assert model.training  # the caller's mode is given back


def test_generation_stops_after_the_stop_token(model: GPT) -> None:
    full = generate(model, PROMPT, 30)
    stop = full[6]
    out = generate(model, PROMPT, 30, stop_id=stop)
    first = full.index(stop)
    assert out == full[: first + 1]


def test_zero_new_tokens_and_empty_prompt(model: GPT) -> None:
    assert generate(model, PROMPT, 0) == []
    with pytest.raises(ValueError, match="prompt"):
        generate(model, [], 5)
