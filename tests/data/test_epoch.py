"""Tests for octlm.data.epoch and the Sampler's epoch order: the keyed bijection is a permutation
for any n, pinned bit for bit; through `Sampler.batch`, every block is read exactly once per
epoch, across steps that straddle epochs, for any world size; the state proves the order."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from octlm.data.blocks import TokenBlocks
from octlm.data.epoch import permute, round_keys, sample_blocks
from octlm.data.order import Sampler
from octlm.data.shards import TokenStream
from octlm.data.windows import StreamWindows

T = 4  # context: blocks of T + 1 = 5 tokens
N_BLOCKS = 23  # prime: no global batch below divides it


def block_stream(n_blocks: int = N_BLOCKS, tail: int = 3) -> TokenStream:
    """Tokens 0, 1, 2, ... in two shards: block b starts with token b * (T + 1); a short tail
    that fills no block follows."""
    tokens = np.arange(n_blocks * (T + 1) + tail, dtype=np.uint16)
    return TokenStream([tokens[:40], tokens[40:]])


def windows_of(stream: TokenStream, order: str) -> StreamWindows:
    """A stream's windows for `order` (trainer/inputs.py): aligned blocks for the epoch order,
    every offset for the random one."""
    return StreamWindows(stream, T, T + 1 if order == "epoch" else 1, "")


def sampler(stream: TokenStream | TokenBlocks | None = None, **kw) -> Sampler:
    """An epoch-order sampler over `block_stream()` unless told otherwise."""
    opts = {"seed": 9, "context": T, "micro_batch": 2, "accum": 3, "order": "epoch", **kw}
    stream = block_stream() if stream is None else stream
    if isinstance(stream, TokenStream):
        aligned = opts["order"] == "epoch" or opts.get("overfit_blocks")
        stream = windows_of(stream, "epoch" if aligned else "random")
    return Sampler(stream, **opts)


def blocks_read(sampler: Sampler, steps: range) -> list[int]:
    """The block of every sample the sampler yields, in global sample order (one rank)."""
    out = []
    for step in steps:
        for micro in range(sampler.accum):
            x, y = sampler.batch(step, micro)
            assert torch.equal(x[:, 1:], y[:, :-1])
            assert bool((x[:, 0] % (T + 1) == 0).all())  # aligned blocks only
            out += (x[:, 0] // (T + 1)).tolist()
    return out


@pytest.mark.parametrize(
    "n", [1, 2, 3, 4, 5, 7, 8, 16, 17, 31, 32, 33, 97, 127, 128, 1000, 1021, 4096, 65537]
)
def test_permute_is_a_permutation_of_range_n(n: int) -> None:
    for seed, epoch in [(0, 0), (1337, 0), (1337, 5), (2**70 + 3, 1)]:
        p = permute(seed, epoch, np.arange(n), n)
        assert p.dtype == np.int64 and p.shape == (n,)
        assert np.array_equal(np.sort(p), np.arange(n)), (n, seed, epoch)


def test_a_billion_blocks_spot_checked_on_samples() -> None:
    n = 10**9
    rng = np.random.default_rng(0)
    positions = np.unique(rng.integers(0, n, size=200_000))
    p = permute(42, 3, positions, n)
    assert p.min() >= 0 and p.max() < n
    assert len(np.unique(p)) == len(positions)  # injective on the sample
    # A contiguous run of positions too, and each value alone gives the same as in a batch.
    run = permute(42, 3, np.arange(n - 50_000, n), n)
    assert len(np.unique(run)) == 50_000
    assert [int(permute(42, 3, np.array([i]), n)[0]) for i in positions[:5]] == p[:5].tolist()


def test_the_order_is_pinned_bit_for_bit() -> None:
    """Integer arithmetic only: these numbers are the same on every platform and numpy."""
    assert permute(1337, 0, np.arange(10), 10).tolist() == [8, 9, 6, 1, 2, 7, 0, 4, 3, 5]
    assert permute(1337, 1, np.arange(10), 10).tolist() == [0, 5, 7, 9, 8, 2, 3, 4, 6, 1]
    assert permute(0, 0, np.arange(5), 10**9).tolist() == [
        664349346, 912803468, 88273555, 620025954, 930087851,
    ]  # fmt: skip
    assert hex(int(round_keys(1337, 0)[0])) == "0x90d31d74cc854eb6"


def test_the_order_differs_between_epochs_and_seeds() -> None:
    n = 1000
    base = permute(7, 0, np.arange(n), n)
    assert np.array_equal(base, permute(7, 0, np.arange(n), n))  # a pure function
    assert not np.array_equal(base, permute(7, 1, np.arange(n), n))
    assert not np.array_equal(base, permute(8, 0, np.arange(n), n))
    assert not np.array_equal(base, np.arange(n))
    # Not merely shifted: few positions keep their block from one epoch to the next.
    assert int((base == permute(7, 1, np.arange(n), n)).sum()) < 20


def test_out_of_range_positions_and_empty_epochs_are_refused() -> None:
    with pytest.raises(ValueError, match="positions outside"):
        permute(0, 0, np.array([5]), 5)
    with pytest.raises(ValueError, match="epoch of 0 blocks"):
        permute(0, 0, np.array([0]), 0)


def test_sample_blocks_straddle_epochs_with_each_epochs_own_keys() -> None:
    n = 6
    got = sample_blocks(3, 4, 16, n)  # samples 4..19: epochs 0 (2), 1 (6), 2 (6), 3 (2)
    expected = np.concatenate([permute(3, e, np.arange(n), n) for e in range(4)])[4:20]
    assert np.array_equal(got, expected)
    assert sample_blocks(3, 4, 0, n).shape == (0,)


def test_every_block_once_per_epoch_through_batch() -> None:
    """micro_batch 2 x accum 3 = 6 per step against 23 blocks: steps straddle epochs."""
    one = sampler()
    assert one.n_positions == N_BLOCKS and one.global_batch == 6
    read = blocks_read(one, range(16))  # 96 samples: four whole epochs and a part
    epochs = [read[e * N_BLOCKS : (e + 1) * N_BLOCKS] for e in range(4)]
    assert all(sorted(e) == list(range(N_BLOCKS)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 4  # a new shuffle each epoch
    assert len(set(read[4 * N_BLOCKS :])) == len(read) - 4 * N_BLOCKS  # the fifth: no repeat
    assert [one.epoch(s) for s in (0, 3, 4, 7, 8, 15)] == [0, 0, 1, 1, 2, 3]
    assert sampler(order="random").epoch(3) is None


def test_world_two_with_elastic_accum_reads_the_same_step() -> None:
    """2 ranks x accum 2 read what 1 process x accum 4 reads: the same global slices."""
    one = sampler(accum=4)
    ranks = [sampler(accum=2, rank=r, world=2) for r in range(2)]
    for step in range(8):
        whole = np.concatenate([one.indices(step, m) for m in range(4)])
        split = np.concatenate([ranks[r].indices(step, m) for m in range(2) for r in range(2)])
        assert np.array_equal(whole, split)
        x1 = torch.cat([one.batch(step, m)[0] for m in range(4)])
        x2 = torch.cat([ranks[r].batch(step, m)[0] for m in range(2) for r in range(2)])
        assert torch.equal(x1, x2)


def test_overfit_blocks_and_in_memory_blocks_are_epochs_too() -> None:
    read = blocks_read(
        sampler(accum=2, overfit_blocks=5), range(5)
    )  # 20 samples of 5 blocks: four epochs
    assert all(sorted(read[i : i + 5]) == list(range(5)) for i in range(0, 20, 5))
    inputs = torch.arange(7 * T).view(7, T)
    blocks = TokenBlocks(inputs, inputs + 1, torch.ones_like(inputs), "")
    memory = sampler(blocks, micro_batch=3, accum=1)
    rows = [int(memory.batch(s, 0)[0][i, 0]) // T for s in range(7) for i in range(3)]
    assert all(sorted(rows[i : i + 7]) == list(range(7)) for i in range(0, 21, 7))


def test_epoch_order_needs_one_whole_block_and_a_known_name() -> None:
    short = TokenStream([np.arange(T, dtype=np.uint16)])
    with pytest.raises(ValueError, match="too short"):
        sampler(short)
    with pytest.raises(ValueError, match="unknown"):
        sampler(order="sorted")


def test_epoch_state_names_the_order_and_refuses_another() -> None:
    state = json.loads(json.dumps(sampler().state_dict(5)))
    assert state == {
        "order": "epoch", "seed": 9, "step": 5, "n_blocks": N_BLOCKS, "sample": 30, "epoch": 1,
        "block": int(sample_blocks(9, 30, 1, N_BLOCKS)[0]),
    }  # fmt: skip
    sampler().load_state_dict(state, 5)
    with pytest.raises(ValueError, match="data order is epoch, this run's random"):
        sampler(order="random").load_state_dict(state, 5)
    random_state = sampler(order="random").state_dict(5)
    assert "order" not in random_state  # the v1 entry, as before --order existed
    with pytest.raises(ValueError, match="data order is random, this run's epoch"):
        sampler().load_state_dict(random_state, 5)
    with pytest.raises(ValueError, match=f"has {N_BLOCKS} blocks, this run's 22"):
        sampler(block_stream(22)).load_state_dict(state, 5)
    with pytest.raises(ValueError, match="another seed"):
        sampler(seed=10).load_state_dict(state, 5)
    with pytest.raises(ValueError, match="at step 5, the run at 6"):
        sampler().load_state_dict(state, 6)
    tampered = {**state, "block": (state["block"] + 1) % N_BLOCKS}
    with pytest.raises(ValueError, match="permutation changed"):
        sampler().load_state_dict(tampered, 5)


def test_the_random_order_is_the_default_and_unchanged() -> None:
    default = Sampler(
        windows_of(block_stream(), "random"), seed=9, context=T, micro_batch=2, accum=3
    )
    explicit = sampler(order="random")
    assert default.order == "random" and default.n_positions == len(block_stream()) - T
    for step, micro in [(0, 0), (3, 2)]:
        assert torch.equal(default.batch(step, micro)[0], explicit.batch(step, micro)[0])
    assert set(default.state_dict(4)) == {"seed", "step", "n_positions", "generator"}
