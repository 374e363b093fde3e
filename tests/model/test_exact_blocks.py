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
from octlm.model.exact_blocks import blocks, per_position, rows_agree
from octlm.model.gpt import GPT

CONTEXT = 200
LENGTHS = [10, 63, 64, 130]
"""Prompts whose decode steps sit in three widths (64, 128, 192 keys) and cross into the next."""


def model_of(seed: int = 0, **options) -> GPT:
    torch.manual_seed(seed)
    return GPT(preset("tiny", context=CONTEXT, **options)).eval()


def ids_of(n: int, seed: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 4096, (batch, n), generator=torch.Generator().manual_seed(seed))


def test_queries_are_grouped_by_width_and_run() -> None:
    one = blocks(torch.tensor([[5], [63]]))  # one width: the cache read in place
    assert len(one) == 1 and one[0].rows is None and one[0].width == 64
    assert one[0].bias.shape == (2, 1, 1, 1, 64)
    assert torch.isinf(one[0].bias[0, 0, 0, 0, 6:]).all() and (one[0].bias[0, ..., :6] == 0).all()
    full = blocks(torch.arange(130).expand(2, 130))  # a full forward: a block per width
    assert [(b.width, b.rows, b.lo, b.hi) for b in full] == [
        (64, None, 0, 64),
        (128, None, 64, 128),
        (192, None, 128, 130),
    ]
    mixed = blocks(torch.tensor([[62, 63, 64], [0, 1, 2]]))  # rows whose runs differ
    assert [(b.width, b.rows.tolist(), b.lo, b.hi) for b in mixed] == [
        (64, [0], 0, 2),
        (64, [1], 0, 3),
        (128, [0], 2, 3),
    ]


@pytest.mark.parametrize("group, depth", [(3, 32), (3, 64), (1, 32), (2, 128)])
def test_the_rows_check_tells_where_one_product_gives_each_tiles_bits(group, depth) -> None:
    """The check that lets a prefill run a row's positions in one product says what fresh inputs
    show, both ways: where it holds, one product and a tile per position agree; where it fails
    (on this machine a 1-row tile, MKL's matrix-vector kernel, and wider heads), they differ."""
    for steps, width in ((64, 64), (64, 128), (7, 192), (2, 256)):
        agree = rows_agree(steps, group, depth, width, torch.get_num_threads())
        g = torch.Generator().manual_seed(steps + width)
        left = torch.randn(4, steps * group, depth, generator=g)
        keys = torch.randn(4, width, depth, generator=g)
        same = torch.equal(torch.bmm(left, keys.transpose(1, 2)), per_position(left, keys, steps))
        weights, values = torch.rand(4, steps * group, width, generator=g), keys
        one = torch.bmm(weights, values)
        same &= torch.equal(one, per_position(weights, values, steps, transpose=False))
        assert same == agree, (steps, width)


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
