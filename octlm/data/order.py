"""Data order as a pure function of (seed, step): a resume seeks in O(1), with no replay.

Optimizer step `s` reads G = `micro_batch * accum * world` windows of T + 1 tokens, named by
their indices into the run's `Windows` (`octlm.data.windows`). With order "random", the indices
are drawn by a PCG64 generator seeded with (seed, s); with "epoch", they are the windows of
global samples s * G .. s * G + G - 1 (`octlm.data.epoch`: every window once per epoch). Rank
r's micro-batch m is a fixed slice of the step's G, so the set of windows a step sees does not
depend on the world size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from octlm.config.inputs import ORDERS
from octlm.data.epoch import sample_blocks
from octlm.data.windows import Batch, Windows


def step_generator(seed: int, step: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed, step]))


def step_starts(seed: int, step: int, n_windows: int, n_positions: int) -> np.ndarray:
    """The `n_windows` start indices (in [0, n_positions)) of optimizer step `step`."""
    # A fresh generator keyed by (seed, step), never carried from step to step: a resume at
    # step s draws what a straight run draws there, with nothing to replay.
    return step_generator(seed, step).integers(0, n_positions, size=n_windows, dtype=np.int64)


def micro_batch_starts(
    seed: int,
    step: int,
    micro: int,
    *,
    micro_batch: int,
    accum: int,
    n_positions: int,
    rank: int = 0,
    world: int = 1,
) -> np.ndarray:
    """Window starts of micro-batch `micro` on `rank`: slice (micro * world + rank) of the step."""
    # One draw of the whole step, sliced: the slices tile the same G indices for any world.
    starts = step_starts(seed, step, micro_batch * accum * world, n_positions)
    first = (micro * world + rank) * micro_batch
    return starts[first : first + micro_batch]


class Sampler:
    """Training micro-batches of one run: which windows each (step, micro-batch, rank) reads.

    The sampler draws indices into its `Windows` (`octlm.data.windows`), which turn them into
    tokens: which windows exist (every offset of a stream, its aligned blocks, in-memory
    blocks, packed examples) is theirs, the order of the draws is the sampler's. Order "random"
    draws indices afresh each step; "epoch" reads each index once per epoch.
    `overfit_blocks > 0` restricts either order to the first N windows (the first seed's
    memorisation experiment).
    """

    def __init__(
        self,
        windows: Windows,
        *,
        seed: int,
        context: int,
        micro_batch: int,
        accum: int,
        overfit_blocks: int = 0,
        rank: int = 0,
        world: int = 1,
        order: str = "random",
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"data order {order!r} is unknown (use one of {ORDERS})")
        if windows.width != context:
            raise ValueError(f"windows of {windows.width} tokens, not {context}")
        self.windows, self.seed, self.context, self.order = windows, seed, context, order
        self.micro_batch, self.accum, self.rank, self.world = micro_batch, accum, rank, world
        # The number of indices the draws range over: a sampler state records it, and a
        # resume refuses another (the same draws would read other windows).
        self.n_positions = min(overfit_blocks or len(windows), len(windows))
        if self.n_positions < 1:
            raise ValueError(f"no window of {context} tokens to draw: the data is too short")

    @property
    def global_batch(self) -> int:
        """Windows per optimizer step over all ranks (the same for any world size)."""
        return self.micro_batch * self.accum * self.world

    def indices(self, step: int, micro: int) -> np.ndarray:
        """The window indices of micro-batch `micro` on this rank (int64, in [0, n_positions))."""
        if self.order == "random":
            return micro_batch_starts(
                self.seed,
                step,
                micro,
                micro_batch=self.micro_batch,
                accum=self.accum,
                n_positions=self.n_positions,
                rank=self.rank,
                world=self.world,
            )
        first = step * self.global_batch + (micro * self.world + self.rank) * self.micro_batch
        return sample_blocks(self.seed, first, self.micro_batch, self.n_positions)

    def batch(self, step: int, micro: int) -> Batch:
        """(inputs, targets), each (micro_batch, context) int64, of micro-batch `micro`; packed
        examples add their segments (`octlm.data.packing`)."""
        # Row i is window indices[i]: the draw's order is the batch's order, and the windows
        # map an index to the same tensors every time, so (seed, step, rank) fixes the bits.
        return self.windows.batch(self.indices(step, micro))

    def epoch(self, step: int) -> int | None:
        """The epoch of step `step`'s first sample with order "epoch" (a step may end in the
        next one); None with order "random", which has no epochs."""
        if self.order == "random":
            return None
        return step * self.global_batch // self.n_positions

    def state_dict(self, step: int) -> dict[str, Any]:
        """The data order at `step` (the sampler keeps no counter: the run's step is the only
        one). Counters, not buffers, plus one draw of the order function, so a load can prove
        it still gives the same draws. The random order's entry is the v1 one, unchanged."""
        if self.order == "random":
            state: dict[str, Any] = {
                "seed": self.seed,
                "step": step,
                "n_positions": self.n_positions,
                "generator": step_generator(self.seed, step).bit_generator.state,
            }
        else:
            sample = step * self.global_batch
            state = {
                "order": self.order,
                "seed": self.seed,
                "step": step,
                "n_blocks": self.n_positions,
                "sample": sample,
                "epoch": sample // self.n_positions,
                "block": int(sample_blocks(self.seed, sample, 1, self.n_positions)[0]),
            }
        layout = self.windows.layout
        if layout is not None:  # only then: other runs' states are as before
            state["packing"] = layout
        return state

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Check that `state` describes this data order at `step`; nothing else to restore."""
        order = state.get("order", "random")  # v1 entries (the random order) name none
        if order != self.order:
            raise ValueError(f"the checkpoint's data order is {order}, this run's {self.order}")
        if state["step"] != step:
            raise ValueError(f"sampler state is at step {state['step']}, the run at {step}")
        if state.get("packing") != self.windows.layout:
            raise ValueError(
                "the checkpoint's packed prompt/completion windows are not this run's "
                f"({state.get('packing')} vs {self.windows.layout})"
            )
        if self.order == "random":
            self._check_random(state, step)
        else:
            self._check_epoch(state)

    def _check_random(self, state: dict[str, Any], step: int) -> None:
        if state["seed"] != self.seed or state["n_positions"] != self.n_positions:
            raise ValueError("sampler state belongs to another seed or dataset")
        if step_generator(self.seed, step).bit_generator.state != state["generator"]:
            raise ValueError("the data-order generator changed since the checkpoint was written")

    def _check_epoch(self, state: dict[str, Any]) -> None:
        if state["seed"] != self.seed:
            raise ValueError("sampler state belongs to another seed")
        if state["n_blocks"] != self.n_positions:
            raise ValueError(
                f"the checkpoint's epoch order has {state['n_blocks']} blocks, this run's "
                f"{self.n_positions}"
            )
        # The stored draw proves the permutation function is the one that wrote the state.
        block = int(sample_blocks(self.seed, state["sample"], 1, self.n_positions)[0])
        if block != state["block"]:
            raise ValueError("the epoch order's permutation changed since the checkpoint")
