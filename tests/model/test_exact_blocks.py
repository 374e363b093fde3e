"""Kernel 3's attention (octlm/model/exact_blocks.py): each query over its own key blocks in one
softmax. What tests/model/test_exact.py does not reach with its rows of one length: a decode step
whose rows sit at other widths (the path that groups queries by width), the same logits with
autograd as without (what the on-policy update needs), and other bits than kernel 2's (so an RL
run's recorded kernel decides its draws) that agree to rounding."""

from __future__ import annotations

import pytest
import torch

from octlm.config.shape import preset
from octlm.model.exact import ExactCache, forward_exact
from octlm.model.exact_blocks import blocks
from octlm.model.gpt import GPT

CONTEXT = 200
LENGTHS = [10, 63, 64, 130]
"""Prompts whose decode steps sit in three widths (64, 128, 192 keys) and cross into the next."""


def model_of(seed: int = 0, **options) -> GPT:
    torch.manual_seed(seed)
    return GPT(preset("tiny", context=CONTEXT, **options)).eval()


def ids_of(n: int, seed: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 4096, (batch, n), generator=torch.Generator().manual_seed(seed))


def test_queries_are_grouped_by_width() -> None:
    one = blocks(torch.tensor([[5], [63]]), kv=2, group=3)  # one width: the cache read in place
    assert len(one) == 1 and one[0].rows is None and one[0].width == 64
    assert one[0].bias.shape == (2, 2, 3, 64)
    assert torch.isinf(one[0].bias[0, 0, 0, 6:]).all() and (one[0].bias[0, :, :, :6] == 0).all()
    mixed = blocks(torch.tensor([[62, 63, 64], [0, 1, 2]]), kv=2, group=3)
    assert [b.width for b in mixed] == [64, 128]
    assert mixed[1].rows.tolist() == [0] and mixed[1].steps.tolist() == [2]


@pytest.mark.parametrize("autocast", [False, True])
@torch.no_grad()
def test_a_decode_step_of_rows_at_other_widths_is_each_rows_full_forward(autocast) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        decode_at_other_widths(model_of(qk_norm=True))


def decode_at_other_widths(model: GPT) -> None:
    longest = max(LENGTHS) + 6
    ids = ids_of(longest, seed=11, batch=len(LENGTHS))
    cache = ExactCache(model, len(LENGTHS))
    forward_exact(model, ids[:, : max(LENGTHS)], cache)  # rows past their length: overwritten
    lengths = torch.tensor(LENGTHS)
    steps = []
    for s in range(6):
        step = ids.gather(1, (lengths + s).view(-1, 1))
        steps.append(forward_exact(model, step, cache, lengths + s))
    for row, n in enumerate(LENGTHS):
        alone = forward_exact(model, ids[row : row + 1, : n + 6])[0, n:]
        got = torch.cat([s[row] for s in steps])
        assert torch.equal(got, alone), (row, n)
    # The control: kernel 2 asked the same gives other bits (its attention adds in other orders).
    full2 = forward_exact(model, ids[:1, : LENGTHS[0] + 6], kernel=2)[0, LENGTHS[0] :]
    assert not torch.equal(full2, torch.cat([s[0] for s in steps]))
    near = 1e-4 if full2.dtype == torch.float32 else 5e-2  # bf16 logits under autocast
    assert torch.allclose(full2, torch.cat([s[0] for s in steps]), atol=near)


@pytest.mark.parametrize("autocast", [False, True])
def test_with_autograd_the_logits_are_the_no_grad_bits_and_gradients_reach_every_weight(
    autocast,
) -> None:
    model = model_of(value_residual=True)
    ids = ids_of(90, seed=12, batch=2)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        with torch.no_grad():
            sampled = forward_exact(model, ids)
        trained = forward_exact(model, ids)
    assert torch.equal(trained.detach(), sampled)
    trained.float().logsumexp(-1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
