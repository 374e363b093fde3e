"""Tests for octlm.data.mixture and the --data mixture spec: the realised shares keep to the
weights (within ±1% over 1,000 steps, and exactly per stratum), each draw is a pure function of
(seed, sample) that no world size changes, epochs are counted per source, the state refuses
another mixture, and bad specs are one-line config errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from octlm.config.inputs import parse_mixture
from octlm.config.rules import ConfigError
from octlm.config.train import TrainConfig
from octlm.data.mixture import STRATUM, MixtureSampler, mixture_fingerprint, quotas
from octlm.data.shards import TokenStream
from octlm.data.windows import StreamWindows

T = 8


def source(offset: int, n_tokens: int) -> StreamWindows:
    """Windows whose tokens tell the source (ids offset + position)."""
    tokens = (offset + np.arange(n_tokens) % 1000).astype(np.uint16)
    return StreamWindows(TokenStream([tokens]), T, T + 1, f"fp{offset}")


def sampler(weights: list[float], order: str = "random", **kw) -> MixtureSampler:
    sources = [source(10_000 * (i + 1), 5_000 + 3_000 * i) for i in range(len(weights))]
    names = [f"s{i}" for i in range(len(weights))]
    args = {"seed": 7, "micro_batch": 4, "accum": 2, "order": order, **kw}
    return MixtureSampler(sources, names, weights, **args)


def source_of(batch: tuple[torch.Tensor, ...]) -> list[int]:
    return (batch[0][:, 0] // 10_000 - 1).tolist()


def test_parse_mixture_reads_paths_and_weights() -> None:
    assert parse_mixture("data/stories") is None
    assert parse_mixture("a:0.7,b/c:0.3") == (("a", 0.7), ("b/c", 0.3))
    assert parse_mixture("runs/x:1") == (("runs/x", 1.0),)
    assert parse_mixture("C:/data/set") is None  # a colon in a path is not a weight
    for bad, why in (
        ("a:0.7,b", "'b' is not PATH:WEIGHT"),
        ("a:0.7,b:-1", "not a positive number"),
        ("a:nan,b:1", "not a positive number"),
        ("a:1,a:2", "named twice"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_mixture(bad)


def test_bad_mixtures_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="write datasets and weights as PATH:WEIGHT"):
        TrainConfig(data="a:0.7,b:zero")
    with pytest.raises(ConfigError, match="--overfit-blocks memorises blocks of one dataset"):
        TrainConfig(data="a:1,b:1", overfit_blocks=2)


def test_quotas_round_by_largest_remainder() -> None:
    assert quotas([0.7, 0.3]).tolist() == [700, 300]
    assert quotas([1, 1, 1]).tolist() == [334, 333, 333]
    assert quotas([7, 3]).tolist() == quotas([0.7, 0.3]).tolist()


@pytest.mark.parametrize("weights", [[0.7, 0.3], [0.5, 0.3, 0.2], [0.95, 0.05]])
def test_realised_shares_keep_to_the_weights(weights) -> None:
    mix = sampler(weights)
    steps = 1000
    counts = mix.source_counts(steps)
    shares = counts / counts.sum()
    assert np.all(np.abs(shares - np.array(weights) / sum(weights)) <= 0.01)
    # Per whole stratum, exactly the quotas (8 samples a step: 125 steps a stratum).
    assert STRATUM % mix.global_batch == 0
    five = mix.source_counts(STRATUM // mix.global_batch * 5)
    assert five.tolist() == (5 * quotas(weights)).tolist()
    drawn = np.concatenate([mix.draws(mix.samples(s, m))[0] for s in range(50) for m in range(2)])
    assert np.array_equal(np.bincount(drawn, minlength=len(weights)), mix.source_counts(50))


def test_batches_read_their_source_and_are_pure_functions_of_the_step() -> None:
    a, b = sampler([0.6, 0.4]), sampler([0.6, 0.4])
    for step in (0, 5, 333, 10_000):
        x = a.batch(step, 1)
        assert all(torch.equal(p, q) for p, q in zip(x, b.batch(step, 1), strict=True))
        sources, _ = a.draws(a.samples(step, 1))
        assert source_of(x) == sources.tolist()
    assert not torch.equal(a.batch(3, 0)[0], sampler([0.6, 0.4], seed=8).batch(3, 0)[0])


@pytest.mark.parametrize("order", ["random", "epoch"])
def test_two_ranks_draw_what_one_process_draws(order) -> None:
    one = sampler([0.7, 0.3], order, accum=4)
    ranks = [sampler([0.7, 0.3], order, accum=2, rank=r, world=2) for r in range(2)]
    for step in (0, 7, 400):
        whole = torch.cat([one.batch(step, m)[0] for m in range(4)])
        split = torch.cat([ranks[r].batch(step, m)[0] for m in range(2) for r in range(2)])
        assert torch.equal(whole, split)


def test_the_epoch_order_reads_each_window_of_a_source_once_per_its_epoch() -> None:
    mix = sampler([0.5, 0.5], "epoch", micro_batch=8, accum=1)
    sizes = mix.sizes
    seen: dict[int, list[int]] = {0: [], 1: []}
    step = 0
    while len(seen[0]) < sizes[0]:
        sources, counts = mix.draws(mix.samples(step, 0))
        for s in (0, 1):
            seen[s].extend(mix.window_indices(s, counts[sources == s]).tolist())
        step += 1
    assert sorted(seen[0][: sizes[0]]) == list(range(sizes[0]))
    assert mix.epoch(step)["s0"] >= 1 and mix.epoch(0) == {"s0": 0, "s1": 0}
    assert mix.epoch(step)["s1"] == int(mix.source_counts(step)[1]) // sizes[1]
    assert sampler([0.5, 0.5]).epoch(5) is None


def test_state_round_trips_and_refuses_other_weights() -> None:
    mix = sampler([0.7, 0.3])
    state = json.loads(json.dumps(mix.state_dict(12)))
    mix.load_state_dict(state, 12)
    assert state["source_samples"] == mix.source_counts(12).tolist()
    with pytest.raises(ValueError, match="other weights"):
        sampler([0.6, 0.4]).load_state_dict(state, 12)
    fps = ["a" * 64, "b" * 64]
    assert mixture_fingerprint(fps, [0.7, 0.3]) == mixture_fingerprint(fps, [7, 3])
    assert mixture_fingerprint(fps, [0.7, 0.3]) != mixture_fingerprint(fps, [0.6, 0.4])


def test_the_toml_table_form_is_the_flag_form(tmp_path) -> None:
    from octlm.config.files import make_config

    path = tmp_path / "mix.toml"
    path.write_text('steps = 100\n\n[data]\n"data/stories" = 0.7\n"data/code" = 0.3\n')
    assert make_config(path).data == "data/stories:0.7,data/code:0.3"
    path.write_text('[data]\n"data/stories" = "lots"\n')
    with pytest.raises(ConfigError, match="is not a number"):
        make_config(path)
