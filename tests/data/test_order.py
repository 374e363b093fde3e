"""Tests for octlm.data.order: the data order is a pure function of (seed, step), its slices tile
the step's draw for any world size, and validation windows are fixed."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from octlm.data.order import Sampler, micro_batch_starts, step_starts
from octlm.data.shards import ShardDataset, TokenStream
from octlm.data.windows import StreamWindows, first_windows

CONTEXT = 32


def every_offset(stream: TokenStream, context: int = CONTEXT) -> StreamWindows:
    """The random order's windows: one at every offset."""
    return StreamWindows(stream, context, 1, "")


def aligned_blocks(stream: TokenStream, context: int = CONTEXT) -> StreamWindows:
    """The epoch order's (and --overfit-blocks') windows: whole blocks of context + 1 tokens."""
    return StreamWindows(stream, context, context + 1, "")


def validation_starts(n_tokens: int, context: int, n_windows: int) -> np.ndarray:
    """The validation set's first `n_windows` windows of a stream of `n_tokens`, as starts."""
    windows = StreamWindows(TokenStream([np.zeros(n_tokens, np.uint16)]), context, context, "")
    return first_windows(windows, n_windows) * windows.stride


@pytest.fixture(scope="module")
def train_stream(tiny_dataset) -> TokenStream:
    stream = ShardDataset.open(tiny_dataset).train
    assert len(stream.shards) > 1  # windows can cross shard boundaries
    return stream


def test_step_starts_is_a_pure_function_of_seed_and_step() -> None:
    a = step_starts(7, 3, 64, 10_000)
    step_starts(7, 4, 64, 10_000)  # no hidden state carried between calls
    b = step_starts(7, 3, 64, 10_000)
    assert a.dtype == np.int64 and a.shape == (64,)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, step_starts(7, 4, 64, 10_000))
    assert not np.array_equal(a, step_starts(8, 3, 64, 10_000))
    assert a.min() >= 0 and a.max() < 10_000


def test_step_starts_stay_in_range_for_a_single_position() -> None:
    assert np.array_equal(step_starts(1, 0, 5, 1), np.zeros(5, dtype=np.int64))


@pytest.mark.parametrize(("world", "accum"), [(1, 1), (1, 4), (2, 1), (2, 3), (4, 2)])
def test_micro_batches_of_all_ranks_tile_the_step_draw(world: int, accum: int) -> None:
    seed, micro_batch, n = 11, 3, 50_000
    for step in (0, 1, 17):
        whole = step_starts(seed, step, micro_batch * accum * world, n)
        pieces = [
            micro_batch_starts(
                seed,
                step,
                m,
                micro_batch=micro_batch,
                accum=accum,
                n_positions=n,
                rank=r,
                world=world,
            )
            for m in range(accum)
            for r in range(world)
        ]
        assert all(len(p) == micro_batch for p in pieces)
        assert np.array_equal(np.concatenate(pieces), whole)


def test_world_two_sees_the_same_windows_as_accumulating_two() -> None:
    seed, micro_batch, n = 5, 4, 80_000
    for step in range(6):
        two_ranks = [
            micro_batch_starts(
                seed, step, 0, micro_batch=micro_batch, accum=1, n_positions=n, rank=r, world=2
            )
            for r in range(2)
        ]
        two_micros = [
            micro_batch_starts(seed, step, m, micro_batch=micro_batch, accum=2, n_positions=n)
            for m in range(2)
        ]
        multiset = lambda parts: Counter(np.concatenate(parts).tolist())  # noqa: E731
        assert multiset(two_ranks) == multiset(two_micros)
    # ...and different steps see different windows.
    assert not np.array_equal(
        micro_batch_starts(seed, 0, 0, micro_batch=4, accum=1, n_positions=n),
        micro_batch_starts(seed, 1, 0, micro_batch=4, accum=1, n_positions=n),
    )


def test_batch_is_int64_inputs_and_targets_shifted_by_one(train_stream) -> None:
    sampler = Sampler(every_offset(train_stream), seed=3, context=CONTEXT, micro_batch=4, accum=2)
    for step, micro in [(0, 0), (0, 1), (9, 1)]:
        x, y = sampler.batch(step, micro)
        assert x.dtype == y.dtype == torch.int64
        assert x.shape == y.shape == (4, CONTEXT)
        assert torch.equal(x[:, 1:], y[:, :-1])
        starts = micro_batch_starts(
            3, step, micro, micro_batch=4, accum=2, n_positions=len(train_stream) - CONTEXT
        )
        for row, start in enumerate(starts):
            expected = train_stream.window(int(start), CONTEXT + 1)
            assert np.array_equal(x[row].numpy(), expected[:-1])
            assert np.array_equal(y[row].numpy(), expected[1:])


def test_batch_is_repeatable_and_varies_with_micro_and_step(train_stream) -> None:
    sampler = Sampler(every_offset(train_stream), seed=3, context=CONTEXT, micro_batch=4, accum=2)
    again = Sampler(every_offset(train_stream), seed=3, context=CONTEXT, micro_batch=4, accum=2)
    again.step = 50  # the counter does not change what a (step, micro) reads
    assert torch.equal(sampler.batch(2, 1)[0], again.batch(2, 1)[0])
    assert not torch.equal(sampler.batch(2, 0)[0], sampler.batch(2, 1)[0])
    assert not torch.equal(sampler.batch(2, 0)[0], sampler.batch(3, 0)[0])


def test_windows_reach_the_last_token_of_the_stream() -> None:
    stream = TokenStream([np.arange(10, dtype=np.uint16), np.arange(10, 15, dtype=np.uint16)])
    sampler = Sampler(every_offset(stream, 4), seed=0, context=4, micro_batch=64, accum=1)
    assert sampler.n_positions == len(stream) - 4
    x, y = sampler.batch(0, 0)
    assert int(y.max()) == 14  # a start of n_positions - 1 reads up to the last token
    x, y = every_offset(stream, 4).batch(np.array([8, 10]))
    block = torch.cat([x, y[:, -1:]], dim=1)
    assert block.tolist() == [[8, 9, 10, 11, 12], [10, 11, 12, 13, 14]]


def test_overfit_blocks_draw_only_the_first_aligned_blocks(train_stream) -> None:
    sampler = Sampler(
        aligned_blocks(train_stream), seed=1, context=CONTEXT, micro_batch=8, accum=1,
        overfit_blocks=3,
    )  # fmt: skip
    blocks = {tuple(train_stream.window(b * (CONTEXT + 1), CONTEXT + 1).tolist()) for b in range(3)}
    seen = set()
    for step in range(10):
        x, y = sampler.batch(step, 0)
        for row in range(len(x)):
            window = tuple(torch.cat([x[row], y[row, -1:]]).tolist())
            assert window in blocks
            seen.add(window)
    assert seen == blocks


def test_overfit_blocks_may_use_a_stream_of_exactly_that_many_blocks() -> None:
    width = CONTEXT + 1
    exact = TokenStream([np.arange(3 * width, dtype=np.uint16)])
    sampler = Sampler(
        aligned_blocks(exact), seed=0, context=CONTEXT, micro_batch=16, accum=1, overfit_blocks=3
    )
    x, y = sampler.batch(0, 0)
    assert set(x[:, 0].tolist()) == {0, width, 2 * width}
    assert int(y.max()) == 3 * width - 1  # the last block ends on the stream's last token
    # One token short: two blocks fit, not the three --overfit-blocks asks for
    # (tests/trainer/test_inputs.py: a run refuses it as too short).
    short = TokenStream([np.arange(3 * width - 1, dtype=np.uint16)])
    assert len(aligned_blocks(short)) == 2


def test_too_short_stream_is_rejected() -> None:
    stream = TokenStream([np.arange(CONTEXT, dtype=np.uint16)])
    with pytest.raises(ValueError, match="too short"):
        Sampler(every_offset(stream), seed=0, context=CONTEXT, micro_batch=1, accum=1)


def test_sampler_state_round_trips_through_json(train_stream) -> None:
    sampler = Sampler(every_offset(train_stream), seed=3, context=CONTEXT, micro_batch=4, accum=2)
    state = json.loads(json.dumps(sampler.state_dict(123)))
    other = Sampler(every_offset(train_stream), seed=3, context=CONTEXT, micro_batch=4, accum=2)
    other.load_state_dict(state, 123)
    assert other.state_dict(123) == state
    assert not hasattr(other, "step")  # the run's TrainState.step is the only counter
    with pytest.raises(ValueError, match="at step 123, the run at 124"):
        other.load_state_dict(state, 124)


def test_loading_a_state_from_another_seed_or_dataset_raises(train_stream) -> None:
    def sampler(seed: int = 3, context: int = CONTEXT) -> Sampler:
        windows = every_offset(train_stream, context)
        return Sampler(windows, seed=seed, context=context, micro_batch=4, accum=2)

    state = sampler().state_dict(0)
    with pytest.raises(ValueError, match="another seed"):
        sampler(seed=4).load_state_dict(state, 0)
    with pytest.raises(ValueError, match="another seed or dataset"):
        sampler(context=16).load_state_dict(state, 0)
    tampered = {**state, "generator": {**state["generator"], "state": {"state": 1, "inc": 3}}}
    with pytest.raises(ValueError, match="generator changed"):
        sampler().load_state_dict(tampered, 0)


@pytest.mark.parametrize(("n_tokens", "n_windows"), [(10_000, 20), (33 * 7 + 1, 100), (1000, 0)])
def test_validation_windows_are_fixed_disjoint_and_inside_the_stream(
    n_tokens: int, n_windows: int
) -> None:
    starts = validation_starts(n_tokens, CONTEXT, n_windows)
    assert np.array_equal(starts, validation_starts(n_tokens, CONTEXT, n_windows))
    assert starts.dtype == np.int64
    assert len(starts) == min(n_windows, (n_tokens - 1) // CONTEXT)
    if len(starts):
        assert starts[0] == 0
        assert starts[-1] + CONTEXT + 1 <= n_tokens
    # Target positions start+1 .. start+T never overlap between windows.
    targets = [set(range(s + 1, s + CONTEXT + 1)) for s in starts.tolist()]
    assert sum(len(t) for t in targets) == len(set().union(*targets))


def test_validation_uses_the_whole_stream_when_it_fits_exactly() -> None:
    n = 5 * CONTEXT + 1
    starts = validation_starts(n, CONTEXT, 1000)
    assert starts.tolist() == [0, 32, 64, 96, 128]
    assert starts[-1] + CONTEXT + 1 == n
    assert len(validation_starts(n - 1, CONTEXT, 1000)) == 4
