"""Data order as a pure function of (seed, step): a resume seeks in O(1), with no replay.

Optimizer step `s` reads `micro_batch * accum * world` windows of T + 1 tokens whose starts are
drawn by a PCG64 generator seeded with (seed, s). Rank r's micro-batch m is a fixed slice of
that global draw, so the set of windows a step sees does not depend on the world size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from octlm.data.blocks import TokenBlocks
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

    `overfit_blocks > 0` restricts the draw to the first N aligned blocks (the first seed's
    memorisation experiment); otherwise any offset can start a window.
    """

    def __init__(
        self,
        stream: TokenStream | TokenBlocks,
        *,
        seed: int,
        context: int,
        micro_batch: int,
        accum: int,
        overfit_blocks: int = 0,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.stream, self.seed, self.context = stream, seed, context
        self.micro_batch, self.accum, self.rank, self.world = micro_batch, accum, rank, world
        if isinstance(stream, TokenBlocks):  # the in-memory path: draw whole (PAD-masked) blocks
            if stream.inputs.shape[1] != context:
                raise ValueError(f"blocks of {stream.inputs.shape[1]} tokens, not {context}")
            self.block_stride = 1
            self.n_positions = min(overfit_blocks or len(stream), len(stream))
            return
        self.block_stride = context + 1 if overfit_blocks else 1
        self.n_positions = overfit_blocks or len(stream) - context  # a window needs T+1 tokens
        # The last window starts at (n_positions - 1) * block_stride and reads context + 1 tokens.
        last_end = (self.n_positions - 1) * self.block_stride + context + 1
        if self.n_positions < 1 or last_end > len(stream):
            raise ValueError(f"stream of {len(stream)} tokens is too short for context {context}")

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (micro_batch, context) int64, of micro-batch `micro`."""
        starts = (
            micro_batch_starts(
                self.seed,
                step,
                micro,
                micro_batch=self.micro_batch,
                accum=self.accum,
                n_positions=self.n_positions,
                rank=self.rank,
                world=self.world,
            )
            * self.block_stride
        )
        if isinstance(self.stream, TokenBlocks):
            index = torch.from_numpy(starts)
            return self.stream.inputs[index], self.stream.targets[index]
        block = windows(self.stream, starts, self.context + 1)
        return block[:, :-1], block[:, 1:]

    def state_dict(self, step: int) -> dict[str, Any]:
        """The data order at `step` (the sampler keeps no counter: the run's step is the only
        one). Counters, not buffers; the generator state is stored so a load can prove the
        order function still gives the same draws."""
        return {
            "seed": self.seed,
            "step": step,
            "n_positions": self.n_positions,
            "generator": step_generator(self.seed, step).bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Check that `state` describes this data order at `step`; nothing else to restore."""
        if state["seed"] != self.seed or state["n_positions"] != self.n_positions:
            raise ValueError("sampler state belongs to another seed or dataset")
        if state["step"] != step:
            raise ValueError(f"sampler state is at step {state['step']}, the run at {step}")
        if step_generator(self.seed, step).bit_generator.state != state["generator"]:
            raise ValueError("the data-order generator changed since the checkpoint was written")


def validation_starts(n_tokens: int, context: int, n_windows: int) -> np.ndarray:
    """Fixed, non-overlapping targets: window j starts at j * context (targets j*T+1..(j+1)*T)."""
    available = (n_tokens - 1) // context
    return np.arange(min(n_windows, available), dtype=np.int64) * context
