"""What a run reads, as one interface: a numbered set of windows (`Windows`), and the windows of
a memmapped token stream (`StreamWindows`).

A `Windows` maps an index k in [0, len) to one window of `width` positions, always to the same
tensors: the data order (`octlm.data.order`) draws indices, the windows turn them into tokens,
and neither needs to know how the other works. Three implementations exist: `StreamWindows`
(here), `octlm.data.blocks.TokenBlocks` (in-memory blocks) and `octlm.data.packed.PackedWindows`
(packed prompt/completion examples). A new source (a mixture of datasets, another packing)
is one more implementation, possibly composed of others; nothing else branches on the kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from octlm.data.shards import TokenStream

Batch = tuple[torch.Tensor, ...]
"""(inputs, targets[, segments]), each (B, width) int64: what `GPT.forward` takes after the
inputs. Targets are IGNORE_INDEX where no loss is taken; packed windows add their segments."""


class Windows(Protocol):
    """A numbered set of windows: index k -> the same tensors, every time, on every rank."""

    def __len__(self) -> int:
        """How many windows there are (a sampler draws indices in [0, len))."""
        ...

    @property
    def width(self) -> int:
        """Positions per window: the context T (a window reads T + 1 tokens)."""
        ...

    @property
    def fingerprint(self) -> str:
        """The identity of the data the windows are cut from (a run folder records it as its
        data fingerprint, and a resume compares it)."""
        ...

    @property
    def layout(self) -> dict[str, Any] | None:
        """What decides window k's tokens besides the data and k (a packing's algorithm and
        layout), or None. A sampler state records it under "packing", so that a resume proves
        it draws the same windows; None adds no entry (the v1 state)."""
        ...

    def summary(self) -> dict[str, Any] | None:
        """What the log header says about these windows under "packing" (examples, windows,
        padding), or None for nothing."""
        ...

    def batch(self, indices: np.ndarray) -> Batch:
        """The windows at `indices` (int64), stacked in that order: row i is window
        indices[i]."""
        ...


@dataclass(frozen=True)
class StreamWindows:
    """The windows of `context` + 1 tokens starting every `stride` tokens of a stream: window k
    is tokens [k * stride, k * stride + context + 1), inputs its first `context`, targets its
    last `context`. Stride 1: every offset (the random order); context + 1: whole aligned
    blocks (the epoch order, --overfit-blocks); context: disjoint targets (validation)."""

    stream: TokenStream
    context: int
    stride: int
    fingerprint: str
    """The prepared dataset's fingerprint (`ShardDataset.fingerprint`)."""

    def __post_init__(self) -> None:
        if self.context < 1 or self.stride < 1:
            raise ValueError(f"windows of context {self.context}, stride {self.stride}")

    def __len__(self) -> int:
        # The last window starts at (len - 1) * stride and reads context + 1 tokens.
        return max(0, (len(self.stream) - self.context - 1) // self.stride + 1)

    @property
    def width(self) -> int:
        return self.context

    @property
    def layout(self) -> dict[str, Any] | None:
        return None

    def summary(self) -> dict[str, Any] | None:
        return None

    def batch(self, indices: np.ndarray) -> Batch:
        # Index k -> start k * stride: the mapping every run folder's bits were made with.
        starts = np.asarray(indices, dtype=np.int64) * self.stride
        block = torch.from_numpy(
            np.stack([self.stream.window(int(s), self.context + 1) for s in starts])
        )
        return block[:, :-1], block[:, 1:]


def first_windows(windows: Windows, n: int) -> np.ndarray:
    """The indices of the first `n` windows (all of them when there are fewer): a validation
    set's fixed choice, the same at every evaluation."""
    return np.arange(min(n, len(windows)), dtype=np.int64)
