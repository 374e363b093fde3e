"""Weighted mixtures of prepared datasets (`--data A:0.7,B:0.3`): which source each training
sample reads, and which of that source's windows, as pure functions of (seed, sample number).

Global sample n (n = step * G + (micro * world + rank) * micro_batch + i, as the epoch order
counts, so no world size changes a draw) reads source `source_of(n)`:

- The samples are cut into strata of STRATUM. In each, source s has exactly `quotas[s]` slots
  (its weight's share of STRATUM, by largest remainder), and the slots are shuffled by the
  epoch order's keyed permutation (`octlm.data.epoch.permute`, under its own key domain, keyed
  by the seed and the stratum). So each sample's source looks random, and the realised shares
  over any run of strata are the weights to within 1/STRATUM (a draw per sample, i.i.d., would
  stray by ±1% over 1,000 steps of 8 samples about once in twenty runs).
- The k-th sample of source s reads that source's window `order(k)`: with --order random a
  keyed hash of (seed, s, k) into [0, windows); with --order epoch the source's own epoch
  order (each window once per epoch of that source, epochs counted per source).

Nothing is replayed: the count of source s's samples before n is (n // STRATUM) * quotas[s]
plus a count inside one stratum, so a resume at any step draws what the straight run drew.
Memory is one stratum's table per stratum asked (a few kept), flat in the number of steps.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from octlm.config.inputs import STRATUM
from octlm.data.epoch import permute, sample_blocks
from octlm.data.windows import Batch, Windows
from octlm.hashing import sha256_json

MIXTURE = "stratified-1000/v1"
"""Names the source choice in sampler states: another would read other sources."""
_DOMAIN = "octlm/mixture/v1"


def quotas(weights: list[float], size: int = STRATUM) -> np.ndarray:
    """Slots per source in a stratum of `size`: the weights' shares, rounded by largest
    remainder (ties: the earlier source), summing to `size`."""
    share = np.asarray(weights, dtype=np.float64) / float(sum(weights)) * size
    out = np.floor(share).astype(np.int64)
    short = size - int(out.sum())
    order = sorted(range(len(weights)), key=lambda s: (-(share[s] - out[s]), s))
    for s in order[:short]:
        out[s] += 1
    return out


def _hash_index(seed: int, source: int, samples: np.ndarray, n: int) -> np.ndarray:
    """--order random within a source: splitmix64 of (seed, source, sample) modulo n, integer
    arithmetic on uint64, so the same on every platform."""
    mix1, mix2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    z = samples.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z ^= np.uint64((seed * 1_000_003 + source) & 0xFFFFFFFFFFFFFFFF)
    for _ in range(2):
        z = (z ^ (z >> np.uint64(30))) * mix1
        z = (z ^ (z >> np.uint64(27))) * mix2
        z ^= z >> np.uint64(31)
    return (z % np.uint64(n)).astype(np.int64)


@dataclass
class MixtureSampler:
    """Training micro-batches drawn from weighted sources: the `octlm.data.order.Sampler`
    interface (batch, epoch, state_dict, load_state_dict) over several `Windows`."""

    sources: list[Windows]
    names: list[str]
    weights: list[float]
    seed: int
    micro_batch: int
    accum: int
    rank: int = 0
    world: int = 1
    order: str = "random"
    _strata: OrderedDict = field(default_factory=OrderedDict, repr=False)

    def __post_init__(self) -> None:
        self.quotas = quotas(self.weights)
        self.sizes = [len(w) for w in self.sources]
        for name, size, quota in zip(self.names, self.sizes, self.quotas, strict=True):
            if size < 1:
                raise ValueError(f"source {name} has no training window")
            if quota < 1:  # --data refuses such weights first (octlm.config.inputs)
                raise ValueError(
                    f"source {name} gets no sample in {STRATUM:,}: its share is too small"
                )

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accum * self.world

    def stratum(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """(source of each slot, slots of each source before it) of stratum j."""
        if j in self._strata:
            return self._strata[j]
        slots = np.repeat(np.arange(len(self.quotas)), self.quotas)
        positions = np.arange(STRATUM, dtype=np.int64)
        source = slots[permute(self.seed, j, positions, STRATUM, domain=f"{_DOMAIN}/strata")]
        onehot = source[:, None] == np.arange(len(self.quotas))[None, :]
        before = np.cumsum(onehot, axis=0) - onehot  # counts before each slot
        found = (source, before[positions, source])
        self._strata[j] = found
        if len(self._strata) > 8:
            self._strata.popitem(last=False)
        return found

    def draws(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, that source's sample number) of each global sample number."""
        sources = np.empty(len(samples), dtype=np.int64)
        counts = np.empty(len(samples), dtype=np.int64)
        for i, n in enumerate(samples.tolist()):
            j, pos = divmod(n, STRATUM)
            source, before = self.stratum(j)
            s = int(source[pos])
            sources[i], counts[i] = s, j * int(self.quotas[s]) + int(before[pos])
        return sources, counts

    def window_indices(self, s: int, counts: np.ndarray) -> np.ndarray:
        """The windows of source s that its samples `counts` read."""
        if self.order == "random":
            return _hash_index(self.seed, s, counts, self.sizes[s])
        domain = f"{_DOMAIN}/source-{s}"
        out = [sample_blocks(self.seed, int(k), 1, self.sizes[s], domain=domain) for k in counts]
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    def samples(self, step: int, micro: int) -> np.ndarray:
        first = step * self.global_batch + (micro * self.world + self.rank) * self.micro_batch
        return np.arange(first, first + self.micro_batch, dtype=np.int64)

    def batch(self, step: int, micro: int) -> Batch:
        """Micro-batch `micro` of `step` on this rank: row i is sample i's window, whichever
        source it came from."""
        sources, counts = self.draws(self.samples(step, micro))
        rows: list[Batch | None] = [None] * len(sources)
        for s in np.unique(sources).tolist():
            at = np.flatnonzero(sources == s)
            got = self.sources[s].batch(self.window_indices(s, counts[at]))
            for k, i in enumerate(at.tolist()):
                rows[i] = tuple(t[k] for t in got)
        return tuple(torch.stack([row[t] for row in rows]) for t in range(len(rows[0])))

    def source_counts(self, step: int) -> np.ndarray:
        """Samples each source gave before step `step` (all ranks)."""
        n = step * self.global_batch
        j, pos = divmod(n, STRATUM)
        source, _ = self.stratum(j)
        inside = np.bincount(source[:pos], minlength=len(self.quotas))
        return j * self.quotas + inside

    def epoch(self, step: int) -> dict[str, int] | None:
        """Per source, the epoch its next sample reads in (--order epoch); None for random."""
        if self.order == "random":
            return None
        counts = self.source_counts(step)
        return {
            n: int(c) // size for n, c, size in zip(self.names, counts, self.sizes, strict=True)
        }

    def layout(self) -> dict[str, Any]:
        return {
            "mixture": MIXTURE,
            "sources": self.names,
            "weights": self.weights,
            "windows": self.sizes,
            "layouts": [w.layout for w in self.sources],
        }

    def state_dict(self, step: int) -> dict[str, Any]:
        """The mixture at `step`: counters (the samples each source gave) and its layout; the
        sampler keeps no counter of its own."""
        return {
            "order": self.order,
            "seed": self.seed,
            "step": step,
            "source_samples": self.source_counts(step).tolist(),
            **self.layout(),
        }

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Check that `state` describes this mixture at `step`; nothing else to restore."""
        if state.get("mixture") != MIXTURE:
            raise ValueError("the checkpoint's data is not this mixture of datasets")
        if state["step"] != step or state["seed"] != self.seed or state["order"] != self.order:
            raise ValueError("the mixture's state belongs to another step, seed or order")
        ours = self.layout()
        # The weights are shares: 7,3 resumes what 0.7,0.3 started (as the data fingerprint,
        # which holds them normalised), and draws the same quotas.
        theirs = {**state, "weights": normalised(state["weights"])}
        ours["weights"] = normalised(ours["weights"])
        for key in ("sources", "weights", "windows", "layouts"):
            if theirs[key] != ours[key]:
                raise ValueError(
                    f"the checkpoint's mixture has other {key} ({theirs[key]} vs {ours[key]})"
                )
        if state["source_samples"] != self.source_counts(step).tolist():
            raise ValueError("the mixture's source choice changed since the checkpoint")


def normalised(weights: list[float]) -> list[float]:
    """Each weight over their sum (as the fingerprint has always held them)."""
    total = sum(weights)
    return [w / total for w in weights]


def mixture_fingerprint(fingerprints: list[str], weights: list[float]) -> str:
    """The data fingerprint of a mixture: its sources' fingerprints in order and their weights
    (normalised), so a resume with other weights is refused as other data (the paths are not
    in it: a dataset moved elsewhere is the same data)."""
    shares = normalised(weights)
    sources = [{"fingerprint": f, "weight": w} for f, w in zip(fingerprints, shares, strict=True)]
    return sha256_json({"mixture": MIXTURE, "sources": sources})
