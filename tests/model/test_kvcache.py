"""Decoding with a key/value cache (octlm/model/kvcache.py) against the full forward pass.

The cached path computes the same functions with other matrix shapes, so its logits agree to
float rounding; the tokens must be the uncached path's. A model fresh from its init has
near-uniform logits, where rounding can swap two nearly tied tokens; the token tests below use
a model trained here for a few seconds, and check that its margins dwarf the rounding, so that
equal tokens follow on any machine rather than by luck.
"""

from __future__ import annotations

import pytest
import torch

from octlm.generation.sampling import generate, generate_batch
from octlm.model.gpt import GPT
from octlm.model.kvcache import KVCache, forward_cached
from tests.unit_model import unit_config

CONTEXT = 320
NEW = 256


def small_model(seed: int = 0, **options) -> GPT:
    torch.manual_seed(seed)
    return GPT(unit_config(CONTEXT, **options))


@pytest.fixture(scope="module")
def stream(corpus_docs, tiny_tokenizer) -> torch.Tensor:
    text = "\n".join(d.text for d in sorted(corpus_docs, key=lambda d: d.id)[:2])
    return torch.tensor(tiny_tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="module")
def trained(stream) -> GPT:
    """200 AdamW steps on two plays: confident enough that top-1 margins dwarf rounding."""
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        starts = torch.randint(0, len(stream) - 129, (8,), generator=gen)
        rows = torch.stack([stream[s : s + 129] for s in starts.tolist()])
        loss_sum, n = model(rows[:, :-1], rows[:, 1:])
        opt.zero_grad()
        (loss_sum / n).backward()
        opt.step()
    return model.eval()


def full_logits(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).float()


@pytest.mark.parametrize(
    "options",
    [{}, {"qk_norm": True}, {"logit_softcap": 15.0}, {"value_residual": True}],
    ids=["plain", "qk", "cap", "vres"],
)
def test_prefill_chunks_and_single_tokens_give_the_full_forward_logits(options) -> None:
    model = small_model(**options).eval()
    ids = torch.randint(0, 512, (3, 40), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model, batch=3)
    parts = [
        forward_cached(model, ids[:, :17], cache, last_only=False),  # the prompt
        forward_cached(model, ids[:, 17:18], cache, last_only=False),  # one token
        forward_cached(model, ids[:, 18:40], cache, last_only=False),  # a later chunk
    ]
    assert cache.length == 40
    torch.testing.assert_close(torch.cat(parts, dim=1).float(), full_logits(model, ids))


def test_a_cache_refuses_what_does_not_fit() -> None:
    model = small_model().eval()
    cache = KVCache(model, batch=1)
    forward_cached(model, torch.zeros(1, CONTEXT - 1, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="room for 1"):
        forward_cached(model, torch.zeros(1, 2, dtype=torch.long), cache)


@pytest.mark.slow  # trains a model for a few seconds
def test_greedy_tokens_equal_the_uncached_path_for_256_tokens(trained: GPT, stream) -> None:
    prompt = stream[:40].tolist()
    cached = generate(trained, prompt, NEW)
    uncached = generate(trained, prompt, NEW, cache=False)
    assert cached == uncached
    assert len(set(cached)) > 20  # a text, not one token repeated
    # Why equal tokens hold beyond this machine: along the path, the smallest top-1 margin
    # is far wider than the largest difference the cache makes to a logit.
    ids = torch.tensor([prompt + uncached[:-1]])
    full = full_logits(trained, ids)[0, len(prompt) - 1 :]
    cache = KVCache(trained, batch=1)
    steps = [forward_cached(trained, ids[:, : len(prompt)], cache)[0]]
    steps += [
        forward_cached(trained, ids[:, i : i + 1], cache)[0]
        for i in range(len(prompt), ids.shape[1])
    ]
    drift = (torch.cat(steps).float() - full).abs().max().item()
    top2 = full.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).min().item()
    assert margin > 20 * drift  # here about 750x: 5.4e-3 against 7e-6


@pytest.mark.slow  # trains a model for a few seconds
def test_seeded_samples_equal_the_uncached_path(trained: GPT, stream) -> None:
    prompt = stream[:40].tolist()
    for seed in (0, 1, 2):
        kw = {"temperature": 0.8, "top_k": 40, "seed": seed}
        assert generate(trained, prompt, 64, **kw) == generate(
            trained, prompt, 64, cache=False, **kw
        )


@pytest.mark.slow  # trains a model for a few seconds
def test_past_the_context_the_window_slides_as_uncached(trained: GPT, stream) -> None:
    """Prompt 200 + 256 new > context 320: the last 136 tokens come from the sliding window."""
    prompt = stream[:200].tolist()
    assert generate(trained, prompt, NEW) == generate(trained, prompt, NEW, cache=False)


def test_left_padded_rows_give_each_prompts_own_logits() -> None:
    model = small_model(qk_norm=True).eval()
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (n,), generator=gen) for n in (9, 30, 1)]
    pad = torch.tensor([30 - len(p) for p in prompts])
    rows = torch.stack(
        [torch.cat([torch.zeros(30 - len(p), dtype=torch.long), p]) for p in prompts]
    )
    cache = KVCache(model, batch=3)
    batched = forward_cached(model, rows, cache, last_only=False, pad=pad)
    follow = torch.tensor([[5], [6], [7]])
    after = forward_cached(model, follow, cache, pad=pad)
    for b, prompt in enumerate(prompts):
        alone = full_logits(model, torch.cat([prompt, follow[b]]).unsqueeze(0))[0]
        torch.testing.assert_close(batched[b, pad[b] :].float(), alone[:-1])
        torch.testing.assert_close(after[b, 0].float(), alone[-1])


@pytest.mark.slow  # trains a model for a few seconds
def test_a_batch_of_prompts_gets_each_prompts_own_tokens(trained: GPT, stream) -> None:
    prompts = [stream[i : i + n].tolist() for i, n in ((0, 40), (500, 7), (900, 23))]
    stop = generate(trained, prompts[1], 12)[5]  # the second prompt stops early
    greedy = generate_batch(trained, prompts, 96, stop_id=stop)
    assert greedy == [generate(trained, p, 96, stop_id=stop) for p in prompts]
    assert greedy[1][-1] == stop and len(greedy[1]) <= 6
    assert len({len(row) for row in greedy}) > 1  # each row stops on its own
    for seed in (3, 4):
        kw = {"temperature": 0.8, "top_k": 40, "seed": seed}
        batched = generate_batch(trained, prompts, 96, **kw)
        assert batched == [generate(trained, p, 96, **kw) for p in prompts]
    # Past the context the rows go one at a time, each sliding its own window.
    batched = generate_batch(trained, prompts, CONTEXT)
    assert batched == [generate(trained, p, CONTEXT) for p in prompts]
