"""Data order as a pure function of (seed, step): a resume seeks in O(1), with no replay.

Optimizer step `s` reads G = `micro_batch * accum * world` windows of T + 1 tokens. With order
"random", their starts are drawn by a PCG64 generator seeded with (seed, s); with "epoch", they
are the aligned blocks of global samples s * G .. s * G + G - 1 (`octlm.data.epoch`: every
block once per epoch). Rank r's micro-batch m is a fixed slice of the step's G, so the set of
windows a step sees does not depend on the world size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from octlm.config import ORDERS
from octlm.data.blocks import TokenBlocks
from octlm.data.epoch import sample_blocks
from octlm.data.packed import PackedWindows
from octlm.data.packing import PACKING
from octlm.data.shards import TokenStream


def step_generator(seed: int, step: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed, step]))


def step_starts(seed: int, step: int, n_windows: int, n_positions: int) -> np.ndarray:
    """The `n_windows` start indices (in [0, n_positions)) of optimizer step `step`."""
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
    starts = step_starts(seed, step, micro_batch * accum * world, n_positions)
    first = (micro * world + rank) * micro_batch
    return starts[first : first + micro_batch]


def windows(stream: TokenStream, starts: np.ndarray, length: int) -> torch.Tensor:
    """Stack the windows [start, start + length) as an int64 tensor (B, length)."""
    return torch.from_numpy(np.stack([stream.window(int(s), length) for s in starts]))


class Sampler:
    """Training micro-batches of one run: stateless reads of a memmapped stream.

    Order "random" draws windows at any offset; "epoch" draws each of the stream's aligned
    T + 1 blocks once per epoch (`n_positions` is then the block count). `overfit_blocks > 0`
    restricts either order to the first N aligned blocks (the first seed's memorisation
    experiment); in-memory `TokenBlocks`, and the windows of packed prompt/completion examples
    (`PackedWindows`), are blocks already, for either order.
    """

    def __init__(
        self,
        stream: TokenStream | TokenBlocks | PackedWindows,
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
        self.stream, self.seed, self.context, self.order = stream, seed, context, order
        self.micro_batch, self.accum, self.rank, self.world = micro_batch, accum, rank, world
        if isinstance(stream, (TokenBlocks, PackedWindows)):  # draw whole blocks / windows
            width = stream.inputs.shape[1] if isinstance(stream, TokenBlocks) else stream.context
            if width != context:
                raise ValueError(f"blocks of {width} tokens, not {context}")
            self.block_stride = 1
            self.n_positions = min(overfit_blocks or len(stream), len(stream))
            return
        aligned = bool(overfit_blocks) or order == "epoch"
        self.block_stride = context + 1 if aligned else 1
        # A window needs T + 1 tokens: any offset but the last T, or whole blocks only.
        whole = len(stream) // (context + 1) if order == "epoch" else len(stream) - context
        self.n_positions = overfit_blocks or whole
        # The last window starts at (n_positions - 1) * block_stride and reads context + 1 tokens.
        last_end = (self.n_positions - 1) * self.block_stride + context + 1
        if self.n_positions < 1 or last_end > len(stream):
            raise ValueError(f"stream of {len(stream)} tokens is too short for context {context}")

    @property
    def global_batch(self) -> int:
        """Windows per optimizer step over all ranks (the same for any world size)."""
        return self.micro_batch * self.accum * self.world

    def indices(self, step: int, micro: int) -> np.ndarray:
        """Positions (window starts, or block numbers) of micro-batch `micro` on this rank."""
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

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, ...]:
        """(inputs, targets), each (micro_batch, context) int64, of micro-batch `micro`; packed
        examples add their segments (`octlm.data.packing`)."""
        starts = self.indices(step, micro) * self.block_stride
        if isinstance(self.stream, PackedWindows):
            return self.stream.batch(starts)
        if isinstance(self.stream, TokenBlocks):
            index = torch.from_numpy(starts)
            return self.stream.inputs[index], self.stream.targets[index]
        block = windows(self.stream, starts, self.context + 1)
        return block[:, :-1], block[:, 1:]

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
        if isinstance(self.stream, PackedWindows):  # only then: other runs' states are as before
            state["packing"] = self.packing()
        return state

    def packing(self) -> dict[str, Any] | None:
        """What decides packed windows: the algorithm, the context and the layout's sha256."""
        if not isinstance(self.stream, PackedWindows):
            return None
        return {"algorithm": PACKING, "context": self.context, "windows": self.stream.digest}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Check that `state` describes this data order at `step`; nothing else to restore."""
        order = state.get("order", "random")  # v1 entries (the random order) name none
        if order != self.order:
            raise ValueError(f"the checkpoint's data order is {order}, this run's {self.order}")
        if state["step"] != step:
            raise ValueError(f"sampler state is at step {state['step']}, the run at {step}")
        if state.get("packing") != self.packing():
            raise ValueError(
                "the checkpoint's packed prompt/completion windows are not this run's "
                f"({state.get('packing')} vs {self.packing()})"
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


def validation_starts(n_tokens: int, context: int, n_windows: int) -> np.ndarray:
    """Fixed, non-overlapping targets: window j starts at j * context (targets j*T+1..(j+1)*T)."""
    available = (n_tokens - 1) // context
    return np.arange(min(n_windows, available), dtype=np.int64) * context
