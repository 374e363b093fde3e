"""Packing prompt/completion examples: best-fit decreasing pinned and checked against its
invariants, the loss-mask layout of an encoded example, and the oracle that matters: a packed
window scores each of its examples as the model scores that example alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from octlm.config.shape import preset
from octlm.data.packed import PackedWindows, example_bounds
from octlm.data.packing import CONTEXT, START, TARGET, pack, waste_shares
from octlm.data.shards import TokenStream
from octlm.model.gpt import GPT, IGNORE_INDEX, segment_attention
from octlm.prepare.pairs import Example, encode_examples
from octlm.tokenizer.core import Tokenizer

TOKENIZER = Path(__file__).parents[1] / "golden" / "v1-micro" / "data" / "tokenizer.json"


def test_pack_is_pinned_on_a_small_case() -> None:
    # Longest first: 5 opens w0 (room 3); 4 opens w1 (room 4); 3 fits w0 exactly; the next 3
    # goes to w1 (room 1); 2 opens w2; 1 fills w1. 9 never fits.
    members, bounds = pack(np.array([5, 3, 3, 2, 9, 1, 4]), 8)
    assert members.tolist() == [0, 1, 2, 5, 6, 3]
    assert bounds.tolist() == [0, 2, 5, 6]


def test_pack_places_each_fitting_item_once_within_capacity_near_the_minimum() -> None:
    rng = np.random.default_rng(0)
    sizes = np.minimum(rng.lognormal(4.5, 0.9, 5000).astype(np.int64) + 1, 700)
    members, bounds = pack(sizes, 512)
    fits = np.flatnonzero(sizes <= 512)
    assert sorted(members.tolist()) == fits.tolist()
    per_window = np.add.reduceat(sizes[members], bounds[:-1])
    assert (per_window <= 512).all() and (per_window > 0).all()
    lower_bound = -(-int(sizes[fits].sum()) // 512)
    assert len(bounds) - 1 <= lower_bound * 1.02 + 1
    for k in range(len(bounds) - 1):  # each window's items ascend
        window = members[bounds[k] : bounds[k + 1]]
        assert (np.diff(window) > 0).all()
    again = pack(sizes, 512)
    assert np.array_equal(again[0], members) and np.array_equal(again[1], bounds)


def test_waste_shares_compare_packing_with_one_example_per_window() -> None:
    shares = waste_shares(np.array([100, 100, 50, 300]), 256)
    # one per window: 4 windows of 256 for 250 used positions (300 does not fit)
    assert shares["padded"] == pytest.approx(1 - 250 / (3 * 256))
    assert shares["windows"] == 1 and shares["packed"] == pytest.approx(1 - 250 / 256)


def test_an_encoded_example_masks_its_prompt_and_targets_completion_and_eos() -> None:
    tok = Tokenizer.load(TOKENIZER)
    ids, marks, lengths = encode_examples(tok, [Example("a", "Who goes", " there?")])
    prompt = tok.encode("Who goes", add_special_tokens=False)
    completion = tok.encode(" there?", add_special_tokens=False)
    assert ids.tolist() == [tok.bos_id, *prompt, *completion, tok.eos_id]
    assert marks.tolist() == [START] + [CONTEXT] * len(prompt) + [TARGET] * (len(completion) + 1)
    assert lengths == [len(ids)]


def packed_of(tok: Tokenizer, examples: list[Example], context: int) -> PackedWindows:
    ids, marks, _ = encode_examples(tok, examples)
    return PackedWindows.build(TokenStream([ids]), TokenStream([marks]), context, "")


EXAMPLES = [
    Example("0", "First Citizen:\n", "Before we proceed any further, hear me speak."),
    Example("1", "All:\n", "Speak, speak."),
    Example("2", "First Citizen:\n", "You are all resolved rather to die than to famish?"),
    Example("3", "", "Resolved. resolved."),
    Example("4", "A prompt far longer than the context " * 8, "x"),
]


def test_windows_target_only_completions_and_skip_what_does_not_fit() -> None:
    tok = Tokenizer.load(TOKENIZER)
    packed = packed_of(tok, EXAMPLES, 48)
    starts, lengths = example_bounds(packed.mask)
    assert len(starts) == len(EXAMPLES) and packed.skipped == 1
    targets_total = 0
    for k in range(len(packed)):
        inputs, targets, segments = packed.window(k)
        assert inputs.shape == targets.shape == segments.shape == (48,)
        assert (np.diff(segments) >= 0).all()  # contiguous segments, padding last
        targets_total += int((targets != IGNORE_INDEX).sum())
        for item in packed.members[packed.bounds[k] : packed.bounds[k + 1]]:
            start, n = int(starts[item]), int(lengths[item])
            prompt = tok.encode(EXAMPLES[item].prompt, add_special_tokens=False)
            scored = [t for t in targets.tolist() if t != IGNORE_INDEX]
            completion = tok.encode(EXAMPLES[item].completion, add_special_tokens=False)
            assert all(t in scored for t in completion)
            assert n == 1 + len(prompt) + len(completion) + 1 and start >= 0
    fitting = [e for i, e in enumerate(EXAMPLES) if i != 4]
    expected = sum(len(tok.encode(e.completion, add_special_tokens=False)) + 1 for e in fitting)
    assert targets_total == expected


def test_a_packed_window_scores_each_example_as_alone() -> None:
    """The oracle: loss sums and logits of a packed, segment-masked window equal the model's
    on each example by itself (a control without segments differs)."""
    tok = Tokenizer.load(TOKENIZER)
    packed = packed_of(tok, EXAMPLES[:4], 160)  # 48 + 17 + 46 + 18 positions: one window
    assert len(packed) == 1
    torch.manual_seed(0)
    # A wide init: at 0.02 every prediction is near uniform and a leak would hardly show.
    model = GPT(preset("micro", vocab_size=tok.vocab_size, context=160, init_std=0.3)).eval()
    inputs, targets, segments = (torch.from_numpy(a)[None] for a in packed.window(0))
    with torch.no_grad():
        packed_sum, packed_count = model(inputs, targets, segments)
        alone_sum, alone_count = torch.zeros(()), 0
        for item in packed.members.tolist():
            start, n = int(packed.starts[item]), int(packed.lengths[item])
            ids = torch.from_numpy(packed.tokens.window(start, n))[None]
            marks = torch.from_numpy(packed.mask.window(start, n).astype(np.int64))[None]
            y = torch.where(marks[:, 1:] == TARGET, ids[:, 1:], IGNORE_INDEX)
            s, c = model(ids[:, :-1], y)
            alone_sum, alone_count = alone_sum + s, alone_count + int(c)
        unmasked_sum, _ = model(inputs, targets)
    assert int(packed_count) == alone_count
    assert torch.allclose(packed_sum, alone_sum, rtol=1e-5, atol=1e-5)
    assert abs(float(unmasked_sum - alone_sum)) > 100 * abs(float(packed_sum - alone_sum)) + 1e-3


def test_segment_attention_restarts_positions_and_keeps_segments_apart() -> None:
    mask, positions = segment_attention(torch.tensor([[1, 1, 1, 2, 2, 3]]))
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0]]
    allowed = mask[0, 0].int().tolist()
    assert allowed[4] == [0, 0, 0, 1, 1, 0]  # position 4 sees its own segment, causally
    assert allowed[2] == [1, 1, 1, 0, 0, 0]
    assert all(allowed[i][i] for i in range(6))  # every row attends to something: no NaN


def test_every_window_has_finite_gradients_with_padding() -> None:
    tok = Tokenizer.load(TOKENIZER)
    packed = packed_of(tok, EXAMPLES[:2], 64)  # lots of padding
    torch.manual_seed(0)
    model = GPT(preset("micro", vocab_size=tok.vocab_size))
    loss, count = model(*packed.batch(np.arange(len(packed))))
    (loss / count).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
