"""The exact inference path (octlm/model/exact.py): a token's logits are the same bits alone or in
a batch of any size, at any row, with any padding; from the KV-cache decode, from a prefill in
chunks of any size and from the full forward; and an evaluation's scores at any micro-batch.

Each test has a control: the plain path (SDPA, MKL's products at the batch's own shape) asked
the same question must differ somewhere, so a test that passes is not passing because the
question cannot tell. The model is `tiny`'s shape (the products' shapes decide MKL's kernels),
its context cut to 200 positions: past three key tiles of 64.
"""

from __future__ import annotations

import pytest
import torch

from octlm.config.shape import preset
from octlm.evaluate.likelihood import continuations
from octlm.generation.sampling import Continuation, generate, generate_batch
from octlm.model.exact import ExactCache, forward_exact
from octlm.model.exact_tiles import KEYS
from octlm.model.gpt import GPT
from octlm.model.kvcache import KVCache, forward_cached

CONTEXT = 200
DTYPES = [torch.float32, torch.bfloat16]


def model_of(dtype: torch.dtype, seed: int = 0, **options) -> GPT:
    torch.manual_seed(seed)
    return GPT(preset("tiny", context=CONTEXT, **options)).eval().to(dtype)


def ids_of(n: int, seed: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 4096, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.slow  # 16 batches x positions x paddings: 8-12 s, out of the fast lane
@pytest.mark.parametrize("dtype", DTYPES)
@torch.no_grad()
def test_a_needle_row_has_its_bits_alone_in_every_batch_row_and_padding(dtype) -> None:
    model = model_of(dtype)
    needle = ids_of(37, seed=1)
    alone = forward_exact(model, needle)
    plain_alone = model(needle)
    plain_differs = False
    for batch in (1, 2, 3, 5, 8, 13, 16):
        for row in sorted({0, batch // 2, batch - 1}):
            for width in (37, 41, 70):  # right padding of 0, 4 and 33 positions
                rows = ids_of(width, seed=batch * 100 + row + width, batch=batch)
                rows[row, :37] = needle[0]
                got = forward_exact(model, rows)[row : row + 1, :37]
                assert torch.equal(got, alone), (batch, row, width)
        # The control: the plain batched decode, the needle left-padded among longer rows.
        if batch > 1:
            longest = 45
            rows = ids_of(longest, seed=batch, batch=batch)
            rows[0, : longest - 37] = 0
            rows[0, longest - 37 :] = needle[0]
            pad = torch.zeros(batch, dtype=torch.long)
            pad[0] = longest - 37
            plain = forward_cached(model, rows, KVCache(model, batch), last_only=False, pad=pad)
            plain_differs |= not torch.equal(plain[0, longest - 37 :], plain_alone[0])
    # ... and the plain cached decode of the needle's last token: under a forced
    # ATEN_CPU_CAPABILITY the padded batch above can match by chance; MKL's one-row product
    # (its own dispatch) still differs there.
    cache = KVCache(model, 1)
    forward_cached(model, needle[:, :-1], cache)
    last = forward_cached(model, needle[:, -1:], cache)
    plain_differs |= not torch.equal(last[0, -1], plain_alone[0, -1])
    # Under ATen's AVX2 or scalar kernels (forced by ATEN_CPU_CAPABILITY on a newer CPU, or the
    # CPU's own best, as on an AVX2-only EPYC), bf16's plain kernels here happen to hold a row's
    # bits in every case above: no control can differ there. Float32's products are MKL's, whose
    # own dispatch still differs by row count.
    narrow = torch.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT")
    if dtype == torch.float32 or not narrow:
        assert plain_differs, "the plain path matched the row alone everywhere: a weak control"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", [{}, {"qk_norm": True, "value_residual": True}])
@torch.no_grad()
def test_cached_decode_and_any_prefill_chunks_give_the_full_forwards_bits(dtype, options) -> None:
    model = model_of(dtype, **options)
    ids = ids_of(CONTEXT, seed=3)
    full = forward_exact(model, ids)
    for chunks in ([1] * 20 + [CONTEXT - 20], [5, 59, 1, 64, 1, 70], [CONTEXT]):
        cache, at, parts = ExactCache(model, 1), 0, []
        for n in chunks:
            parts.append(forward_exact(model, ids[:, at : at + n], cache, torch.tensor([at])))
            at += n
        assert torch.equal(torch.cat(parts, dim=1), full), chunks
    # The control: the plain cached decode of the last tokens against the plain forward.
    plain_full, cache = model(ids), KVCache(model, 1)
    forward_cached(model, ids[:, :8], cache)
    decoded = [forward_cached(model, ids[:, i : i + 1], cache) for i in range(8, CONTEXT)]
    assert not torch.equal(torch.cat(decoded, dim=1), plain_full[:, 8:])
    assert CONTEXT > 3 * KEYS


@torch.no_grad()
def test_past_the_context_the_cached_and_uncached_logits_are_the_same_bits() -> None:
    """A chat or a generation longer than the context: the window slides (full forwards of the
    last CONTEXT tokens), and before it the cache; either way the bits of the uncached path."""
    model = model_of(torch.float32)
    ids = ids_of(CONTEXT + 6, seed=4)
    steps = list(range(CONTEXT - 70, CONTEXT + 6, 5))
    cached, uncached = Continuation(model, True, exact=True), Continuation(model, False, True)
    for end in steps:
        assert torch.equal(cached(ids[:, :end]), uncached(ids[:, :end])), end
    plain_cached, plain_uncached = (
        Continuation(model, True, False),
        Continuation(model, False, False),
    )
    assert any(
        not torch.equal(plain_cached(ids[:, :end]), plain_uncached(ids[:, :end])) for end in steps
    )


def test_sampled_rows_of_a_batch_are_each_prompts_own_tokens() -> None:
    model = model_of(torch.float32)
    prompts = [ids_of(n, seed=10 + n)[0].tolist() for n in (3, 17, 9, 30)]
    seeds = [5, 6, 7, 8]
    sampling = {"temperature": 1.0, "top_k": 50}
    batched = generate_batch(model, prompts, 24, seeds=seeds, exact=True, **sampling)
    alone = [
        generate(model, p, 24, seed=s, exact=True, **sampling)
        for p, s in zip(prompts, seeds, strict=True)
    ]
    assert batched == alone


@torch.no_grad()
def test_eval_scores_are_the_same_bits_at_micro_batch_1_and_16() -> None:
    model = model_of(torch.float32)
    pairs = [
        (ids_of(n, seed=n)[0].tolist(), ids_of(1 + n % 5, seed=1000 + n)[0].tolist())
        for n in range(3, 120, 4)
    ]
    device = torch.device("cpu")
    one = continuations(model, pairs, CONTEXT, device, batch=1)
    assert continuations(model, pairs, CONTEXT, device, batch=16) == one
    assert continuations(model, pairs, CONTEXT, device, batch=7) == one
    plain = [continuations(model, pairs, CONTEXT, device, batch=b, exact=False) for b in (1, 16)]
    assert plain[0] != plain[1], "the plain scores matched across micro-batches: a weak control"


@torch.no_grad()
def test_a_weight_changed_in_place_is_packed_again() -> None:
    """The float32 products use each weight packed for MKL, packed anew by each forward (or
    decode's cache): a change through `.data`, which no version counter sees (an RL step
    between two rollouts), must not leave the old packing in use."""
    model, fresh = model_of(torch.float32), model_of(torch.float32, seed=1)
    ids = ids_of(20, seed=6)
    forward_exact(model, ids)  # packs the first weights
    for mine, theirs in zip(model.parameters(), fresh.parameters(), strict=True):
        mine.data.copy_(theirs)
    assert torch.equal(forward_exact(model, ids), forward_exact(fresh, ids))
