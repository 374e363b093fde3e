"""Packed weights kept with a model across exact calls (octlm/model/exact_kept.py): the same bits
as packing afresh, made once while the weights stay, made again when they change in place or
are replaced, and only for float32 on CPU outside autocast."""

from __future__ import annotations

import copy

import torch

from octlm.config.shape import preset
from octlm.model.exact import ExactCache, forward_exact
from octlm.model.exact_kept import KEPT, forget_packed, keep_packed, kept_packs
from octlm.model.gpt import GPT


def decode(model: GPT, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Logits of a prefill of ids (B, T) and `steps` greedy decode steps, stacked."""
    B, T = ids.shape
    cache = ExactCache(model, B)
    lengths = torch.full((B,), T)
    out = [forward_exact(model, ids, cache, at=lengths - 1)[:, -1]]
    for s in range(steps):
        token = out[-1].argmax(-1, keepdim=True)
        out.append(forward_exact(model, token, cache, lengths + s)[:, -1])
    return torch.stack(out)


@torch.no_grad()
def test_a_kept_model_gives_fresh_bits_packs_once_and_again_after_a_change() -> None:
    torch.manual_seed(0)
    model = GPT(preset("tiny")).eval()
    fresh = copy.deepcopy(model)  # never kept: every call packs afresh
    ids = torch.randint(0, model.config.vocab_size, (3, 20))
    keep_packed(model)
    try:
        for batch in (ids[:1], ids):
            assert torch.equal(decode(model, batch, 5), decode(fresh, batch, 5))
            assert torch.equal(forward_exact(model, batch), forward_exact(fresh, batch))
        packs = kept_packs(model, ExactCache(model, 1).kernel, check=False)
        assert packs, "nothing was kept"
        held = dict(packs)
        forward_exact(model, ids)
        decode(model, ids[:1], 3)
        assert all(packs[key] is value for key, value in held.items())  # none made again

        before = forward_exact(model, ids)
        for m in (model, fresh):  # an optimizer's step: in place
            for p in m.parameters():
                p.mul_(0.9).add_(0.01)
        after = forward_exact(model, ids)
        assert not torch.equal(after, before)  # the control: the change shows
        assert torch.equal(after, forward_exact(fresh, ids))
        assert torch.equal(decode(model, ids, 4), decode(fresh, ids, 4))

        new = torch.randn_like(model.tok_embeddings.weight)  # a weight replaced
        model.tok_embeddings.weight = torch.nn.Parameter(new.clone())
        fresh.tok_embeddings.weight = torch.nn.Parameter(new.clone())
        assert torch.equal(forward_exact(model, ids), forward_exact(fresh, ids))
    finally:
        forget_packed(model)
    assert model not in KEPT and kept_packs(model, 3, check=False) is None


def kept_and_fresh(seed: int) -> tuple[GPT, GPT, torch.Tensor]:
    """A kept `tiny` model (`forget_packed` it after), a never-kept copy and 2 x 12 ids."""
    torch.manual_seed(seed)
    model = GPT(preset("tiny"))
    fresh = copy.deepcopy(model)
    keep_packed(model)
    return model, fresh, torch.randint(0, model.config.vocab_size, (2, 12))


def test_only_float32_on_cpu_outside_autocast_is_kept_and_training_still_gets_gradients() -> None:
    model, fresh, ids = kept_and_fresh(1)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert kept_packs(model, 3, check=False) is None
            assert torch.equal(forward_exact(model, ids), forward_exact(fresh, ids))
        with torch.no_grad():
            forward_exact(model, ids)  # packs kept without autograd ...
        losses = [forward_exact(m, ids).logsumexp(-1).mean() for m in (model, fresh)]
        assert torch.equal(losses[0], losses[1])  # ... serve the forward with autograd
        for loss in losses:
            loss.backward()
        for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
            assert a.grad is not None and torch.equal(a.grad, b.grad)
    finally:
        forget_packed(model)


def test_a_fused_optimizers_step_which_pytorch_does_not_count_still_repacks() -> None:
    """PyTorch's fused AdamW on CPU writes the weights without counting the write (their
    `_version` stays), so the stamp alone would serve the old packings: the probe catches it
    when the next forward or decode starts."""
    model, fresh, ids = kept_and_fresh(2)
    try:
        counted = []
        for m in (model, fresh):
            optimizer = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)
            with torch.no_grad():
                before = forward_exact(m, ids)  # packs kept for `model`
            m(ids).logsumexp(-1).mean().backward()
            versions = [p._version for p in m.parameters()]
            optimizer.step()
            counted.append(versions != [p._version for p in m.parameters()])
        # The premise (PyTorch 2.13 on CPU): the step was not counted. Where a later release
        # counts it, the stamp alone repacks and the rest still holds.
        if torch.__version__.startswith("2.13"):
            assert counted == [False, False]
        with torch.no_grad():
            after = forward_exact(model, ids)
            assert not torch.equal(after, before)
            assert torch.equal(after, forward_exact(fresh, ids))
            assert torch.equal(decode(model, ids, 3), decode(fresh, ids, 3))
    finally:
        forget_packed(model)
