"""Tests for octlm.data.bos: BOS-aligned rows deal every token of a block into exactly one full
row (carried, never cropped or padded), start rows at documents wherever the block has one left,
are a pure function of the stream and the row index, and give a doc-mask's segments."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from octlm.data.bos import BosRows, fill_rows
from octlm.data.order import Sampler
from octlm.data.shards import TokenStream
from octlm.model.gpt import GPT
from tests.unit_model import unit_config

EOS = 1


def check_rows(lengths: list[int], heads: list[bool], capacity: int) -> list[list[tuple]]:
    rows = fill_rows(lengths, heads, capacity)
    spans: dict[int, list[tuple[int, int]]] = {}
    for parts in rows:
        assert sum(n for _, _, n in parts) == capacity  # full: no padding
        for piece, offset, n in parts:
            assert n > 0
            spans.setdefault(piece, []).append((offset, n))
    for piece, length in enumerate(lengths):  # each token exactly once, nothing cropped
        at = 0
        for offset, n in sorted(spans.get(piece, [])):
            assert offset == at
            at += n
        assert at == length
    return rows


def test_fill_rows_places_every_token_once_in_full_rows() -> None:
    rng = random.Random(0)
    for _ in range(300):
        capacity, n_rows = rng.randint(1, 40), rng.randint(1, 16)
        total = capacity * n_rows
        cuts = sorted(rng.sample(range(1, total), min(total - 1, rng.randint(0, 30))))
        lengths = np.diff([0, *cuts, total]).tolist()
        heads = [rng.random() < 0.5] + [True] * (len(lengths) - 1)
        check_rows(lengths, heads, capacity)


def test_fill_rows_starts_rows_at_documents_and_fits_best() -> None:
    # Documents of 6, 5, 3, 2: rows of 8 take the 6 (+ the 2) and the 5 (+ the 3), each whole.
    assert fill_rows([5, 3, 2, 6], [True] * 4, 8) == [
        [(3, 0, 6), (2, 0, 2)],
        [(0, 0, 5), (1, 0, 3)],
    ]
    # A tail (mid-document) of 4 and documents of 7 and 5: both rows start at a document,
    # the tail fills where it fits, and the one cut is the tail's (documents stay whole).
    rows = check_rows([4, 7, 5], [False, True, True], 8)
    assert [parts[0][:2] for parts in rows] == [(1, 0), (2, 0)]
    # No more documents than rows: each starts one, the longest first, cut to the row, and
    # its remainder is carried to the end of the next.
    assert fill_rows([10, 6], [True, True], 8) == [[(0, 0, 8)], [(1, 0, 6), (0, 8, 2)]]


def test_fill_rows_refuses_tokens_that_do_not_fill_whole_rows() -> None:
    with pytest.raises(ValueError, match="do not fill rows of 8"):
        fill_rows([5, 4], [True, True], 8)


def documents_stream(lengths: list[int], seed: int = 0) -> TokenStream:
    """A stream of documents of `lengths` tokens, each BOS (2) ... EOS (1), text ids >= 3."""
    rng = np.random.default_rng(seed)
    docs = [np.concatenate(([2], rng.integers(3, 50, n - 2), [EOS])) for n in lengths]
    return TokenStream([np.concatenate(docs).astype(np.uint16)])


def all_rows(rows: BosRows) -> np.ndarray:
    return np.stack([rows.row(k)[0] for k in range(len(rows))])


def test_rows_read_every_token_of_the_stream_but_its_last_partial_row() -> None:
    rng = np.random.default_rng(1)
    stream = documents_stream(rng.integers(3, 90, 400).tolist())
    rows = BosRows(stream, context=31, eos_id=EOS, fingerprint="fp", rows_per_block=8)
    tokens = np.asarray(stream.window(0, len(stream)))
    assert len(rows) == len(stream) // 32
    read = all_rows(rows)
    # The same multiset of tokens, block by block: carried, not cropped, not padded.
    for b in range(-(-len(rows) // 8)):
        got = read[b * 8 : (b + 1) * 8].ravel()
        want = tokens[b * 8 * 32 : b * 8 * 32 + got.size]
        assert np.array_equal(np.sort(got), np.sort(want))
    summary = rows.summary()
    assert summary["cropped"] == summary["padded"] == 0
    assert summary["unread_tokens"] == len(stream) - len(rows) * 32


def test_short_documents_start_nearly_every_row_and_long_ones_cannot() -> None:
    rng = np.random.default_rng(2)
    short = BosRows(documents_stream(rng.integers(3, 60, 3000).tolist()), 63, EOS, "fp")
    starts = [row[0] for row in all_rows(short)]
    assert np.mean(np.array(starts) == 2) > 0.95  # each row's first token a document's BOS
    assert short.summary()["rows_at_document_start"] > 0.95
    long = BosRows(documents_stream([5000] * 8), 63, EOS, "fp")
    assert long.summary()["rows_at_document_start"] < 0.05


def test_a_row_is_a_pure_function_of_the_stream_and_its_index() -> None:
    stream = documents_stream(np.random.default_rng(3).integers(3, 70, 500).tolist())
    warm = BosRows(stream, 31, EOS, "fp", rows_per_block=4)
    order = np.random.default_rng(4).permutation(len(warm))
    seen = {int(k): warm.row(int(k))[0].copy() for k in order}  # the cache evicts on the way
    cold = BosRows(stream, 31, EOS, "fp", rows_per_block=4)
    for k in range(len(cold)):
        assert np.array_equal(cold.row(k)[0], seen[k])


def test_doc_mask_segments_number_the_pieces_of_a_row() -> None:
    stream = documents_stream([10, 7, 20, 12, 15])  # 64 tokens: two rows of 32
    rows = BosRows(stream, 31, EOS, "fp", doc_mask=True)
    x, y, segments = rows.batch(np.array([0, 1]))
    assert x.shape == y.shape == segments.shape == (2, 31)
    for r in range(2):
        tokens, seg = rows.row(r)
        assert np.array_equal(x[r].numpy(), tokens[:-1]) and np.array_equal(
            y[r].numpy(), tokens[1:]
        )
        firsts = np.flatnonzero(np.diff(seg, prepend=0))
        assert seg[0] == 1 and list(seg[firsts]) == list(range(1, len(firsts) + 1))
        assert all(tokens[i] == 2 for i in firsts)  # every piece here is a whole document
    assert len(BosRows(stream, 31, EOS, "fp").batch(np.array([0]))) == 2  # no mask: no segments


def test_the_sampler_records_the_layout_and_refuses_another() -> None:
    stream = documents_stream(np.random.default_rng(5).integers(3, 70, 300).tolist())
    rows = BosRows(stream, 15, EOS, "fp", rows_per_block=8)
    sampler = Sampler(rows, seed=1, context=15, micro_batch=4, accum=2)
    state = json.loads(json.dumps(sampler.state_dict(3)))
    assert state["packing"] == rows.layout and state["packing"]["algorithm"].startswith("bos")
    sampler.load_state_dict(state, 3)
    other = Sampler(
        BosRows(stream, 15, EOS, "fp", rows_per_block=4), seed=1, context=15, micro_batch=4, accum=2
    )
    with pytest.raises(ValueError, match="packed"):
        other.load_state_dict(state, 3)


def test_flex_attention_block_mask_agrees_with_the_dense_mask() -> None:
    """The CUDA path of --doc-mask (FlexAttention with a block mask) against the CPU one (SDPA
    with a dense boolean mask), both run here on the CPU: flex in eager form and forward only
    (flex has no backward on a CPU). The compiled CUDA kernel and its gradients are checked
    only where a GPU is (bench/gpu_check.py)."""
    torch.manual_seed(0)
    model = GPT(unit_config(64)).eval()
    x = torch.randint(3, 512, (2, 64))
    segments = torch.tensor([[1] * 20 + [2] * 30 + [3] * 14, [1] * 5 + [2] * 59])
    with torch.no_grad():
        dense = model(x, segments=segments)
        model.flex_segments = True
        flex = model(x, segments=segments)
        loss_dense = model(x, x, segments)  # flex, with targets
        model.flex_segments = False
        loss_flex = model(x, x, segments)
        changed = x.clone()
        changed[0, :20] = 7  # the first document only
        model.flex_segments = True
        later = model(changed, segments=segments)
    assert float((dense - flex).abs().max()) < 1e-4
    assert abs(float(loss_dense[0] - loss_flex[0])) < 1e-3 and loss_dense[1] == loss_flex[1]
    # The mask acts: the documents after the first cannot see it.
    assert float((later[0, 20:] - flex[0, 20:]).abs().max()) < 1e-5
    assert float((later[0, :20] - flex[0, :20]).abs().max()) > 1e-3
