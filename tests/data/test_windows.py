"""Tests for octlm.data.windows: every source of windows meets the one `Windows` protocol,
`StreamWindows.batch` returns exactly the stream slices it replaced, and a new implementation
(here a toy mixture composed of two others) needs no change to the sampler or the validation set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from octlm.data.blocks import TokenBlocks, make_blocks
from octlm.data.order import Sampler
from octlm.data.packed import PackedWindows
from octlm.data.shards import ShardDataset, TokenStream
from octlm.data.windows import Batch, StreamWindows, Windows, first_windows
from octlm.evaluate.loss import ValidationSet
from octlm.model.gpt import IGNORE_INDEX
from octlm.prepare.pairs import Example, encode_examples
from octlm.tokenizer.core import Tokenizer

T = 16
MEMBERS = {"__len__", "width", "fingerprint", "layout", "summary", "batch"}


@pytest.fixture(scope="module")
def stream(tiny_dataset) -> TokenStream:
    return ShardDataset.open(tiny_dataset).train


def packed(tok: Tokenizer) -> PackedWindows:
    examples = [Example(str(i), f"Question {i}?", " answer" * (i % 5 + 1)) for i in range(12)]
    ids, marks, _ = encode_examples(tok, examples)
    return PackedWindows.build(TokenStream([ids]), TokenStream([marks]), T, "fp-packed")


def implementations(stream: TokenStream, tok: Tokenizer) -> dict[str, Windows]:
    return {
        "stream, every offset": StreamWindows(stream, T, 1, "fp-stream"),
        "stream, aligned blocks": StreamWindows(stream, T, T + 1, "fp-stream"),
        "stream, disjoint targets": StreamWindows(stream, T, T, "fp-stream"),
        "in-memory blocks": make_blocks("Some text to cut into blocks. " * 20, tok, T),
        "packed examples": packed(tok),
    }


def test_the_protocol_names_what_the_sampler_and_the_run_use() -> None:
    declared = {n for n in vars(Windows) if not n.startswith("_")} | {"__len__"}
    assert declared == MEMBERS


def test_each_implementation_meets_the_protocol(stream, tiny_tokenizer) -> None:
    for name, windows in implementations(stream, tiny_tokenizer).items():
        assert all(hasattr(windows, member) for member in MEMBERS), name
        n = len(windows)
        assert isinstance(n, int) and n > 1, name
        assert windows.width == T, name
        assert isinstance(windows.fingerprint, str) and windows.fingerprint, name
        for extra in (windows.layout, windows.summary()):
            assert extra is None or json.loads(json.dumps(extra)) == extra, name
        indices = np.array([n - 1, 0, 1, 0], dtype=np.int64)
        batch = windows.batch(indices)
        assert isinstance(batch, tuple) and len(batch) in (2, 3), name
        assert all(t.dtype == torch.int64 and t.shape == (4, T) for t in batch), name
        # Row i is window indices[i]: the same index gives the same tensors, in any company.
        for row, k in enumerate(indices.tolist()):
            alone = windows.batch(np.array([k], dtype=np.int64))
            assert all(torch.equal(t[row], a[0]) for t, a in zip(batch, alone, strict=True))
        assert all(torch.equal(t[1], t[3]) for t in batch), name


def test_only_packed_windows_add_a_layout_and_a_summary(stream, tiny_tokenizer) -> None:
    for name, windows in implementations(stream, tiny_tokenizer).items():
        if name == "packed examples":
            assert set(windows.layout or {}) == {"algorithm", "context", "windows"}
            assert set(windows.summary() or {}) == {"examples", "windows", "too_long", "padding"}
        else:
            assert windows.layout is None and windows.summary() is None, name


def test_stream_windows_batch_equals_the_slices_it_replaces(stream) -> None:
    for stride in (1, T, T + 1, 7):
        windows = StreamWindows(stream, T, stride, "")
        indices = np.array([0, 3, len(windows) - 1, 3], dtype=np.int64)
        x, y = windows.batch(indices)
        # What the sampler and the validation set did before: stack stream.window(start, T + 1)
        # for start = index * stride, inputs the first T, targets the last T.
        block = torch.from_numpy(np.stack([stream.window(int(k) * stride, T + 1) for k in indices]))
        assert torch.equal(x, block[:, :-1]) and torch.equal(y, block[:, 1:])
        assert x.stride() == block[:, :-1].stride()  # the same views of one stacked block


@pytest.mark.parametrize("n_tokens", [0, 1, T, T + 1, T + 2, 3 * (T + 1), 3 * (T + 1) + T])
def test_stream_windows_count_every_window_that_fits_and_no_more(n_tokens: int) -> None:
    tokens = TokenStream([np.arange(n_tokens, dtype=np.uint16)])
    for stride in (1, T, T + 1):
        windows = StreamWindows(tokens, T, stride, "")
        fits = [s for s in range(0, n_tokens, stride) if s + T + 1 <= n_tokens]
        assert len(windows) == len(fits), (n_tokens, stride)
        if fits:  # the last window ends on or before the stream's last token
            x, y = windows.batch(np.array([len(windows) - 1]))
            assert int(x[0, 0]) == fits[-1] and int(y[0, -1]) == fits[-1] + T


def test_stream_windows_refuse_a_non_positive_context_or_stride(stream) -> None:
    for context, stride in [(0, 1), (T, 0)]:
        with pytest.raises(ValueError, match="stride"):
            StreamWindows(stream, context, stride, "")


def test_first_windows_are_the_first_n_or_all() -> None:
    blocks = TokenBlocks(*(torch.zeros(5, T, dtype=torch.int64) for _ in range(3)), "")
    assert first_windows(blocks, 3).tolist() == [0, 1, 2]
    assert first_windows(blocks, 50).tolist() == [0, 1, 2, 3, 4]
    assert first_windows(blocks, 0).dtype == np.int64


@dataclass(frozen=True)
class Mixture:
    """A toy new source: the windows of `a`, then those of `b` (a mixture without weights)."""

    a: Windows
    b: Windows

    def __len__(self) -> int:
        return len(self.a) + len(self.b)

    @property
    def width(self) -> int:
        return self.a.width

    @property
    def fingerprint(self) -> str:
        return self.a.fingerprint + "+" + self.b.fingerprint

    @property
    def layout(self) -> dict[str, Any] | None:
        return {"mixture": [len(self.a), len(self.b)]}

    def summary(self) -> dict[str, Any] | None:
        return None

    def batch(self, indices: np.ndarray) -> Batch:
        n_a = len(self.a)
        rows = [
            self.a.batch(np.array([k])) if k < n_a else self.b.batch(np.array([k - n_a]))
            for k in indices.tolist()
        ]
        return tuple(torch.cat(parts) for parts in zip(*rows, strict=True))


def test_a_new_implementation_works_with_the_sampler_and_validation_unchanged(
    stream, tiny_tokenizer
) -> None:
    blocks = make_blocks("Some text to cut into blocks. " * 20, tiny_tokenizer, T)
    mixture = Mixture(StreamWindows(stream, T, T + 1, "fp-stream"), blocks)
    for order in ("random", "epoch"):
        sampler = Sampler(mixture, seed=1, context=T, micro_batch=4, accum=2, order=order)
        x, y = sampler.batch(3, 1)
        assert x.shape == y.shape == (4, T)
        state = json.loads(json.dumps(sampler.state_dict(3)))
        assert state["packing"] == mixture.layout and state["step"] == 3
        sampler.load_state_dict(state, 3)
    val = ValidationSet(mixture, first_windows(mixture, 6), 4, tiny_tokenizer.token_bytes_table)
    assert [len(b[0]) for b in val.batches()] == [4, 2]
    assert [len(b[0]) for b in val.batches(1, 2)] == [3]
    assert int((torch.cat([b[1] for b in val.batches()]) == IGNORE_INDEX).sum()) == 0
