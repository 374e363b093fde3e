"""A split's prompt/completion examples as packed windows of (inputs, targets, segments): the run
side of `octlm.data.packing`. `PackedWindows` is a `octlm.data.windows.Windows`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from octlm.data.packing import PACKING, START, TARGET, pack
from octlm.data.shards import ShardDataset, TokenStream
from octlm.hashing import sha256_bytes
from octlm.model.gpt import IGNORE_INDEX


def example_bounds(mask: TokenStream) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the examples in a split, from its loss-mask stream."""
    parts = [
        np.flatnonzero(np.asarray(shard) == START) + int(offset)
        for shard, offset in zip(mask.shards, mask.offsets[:-1], strict=True)
    ]
    starts = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    ends = np.append(starts[1:], len(mask))
    return starts.astype(np.int64), (ends - starts).astype(np.int64)


@dataclass(frozen=True)
class PackedWindows:
    """One split's examples packed into windows of `context` positions."""

    tokens: TokenStream
    mask: TokenStream
    context: int
    starts: np.ndarray
    """Each example's first token in the stream."""
    lengths: np.ndarray
    """Each example's tokens (prompt, completion and specials)."""
    members: np.ndarray
    bounds: np.ndarray
    skipped: int
    """Examples longer than context + 1 tokens: in no window."""
    fingerprint: str
    """The prepared dataset's fingerprint (`ShardDataset.fingerprint`)."""

    @classmethod
    def build(
        cls, tokens: TokenStream, mask: TokenStream, context: int, fingerprint: str
    ) -> PackedWindows:
        if len(tokens) != len(mask):
            raise ValueError(f"{len(tokens)} tokens but {len(mask)} loss-mask entries")
        starts, lengths = example_bounds(mask)
        members, bounds = pack(lengths - 1, context)
        skipped = int(np.count_nonzero(lengths - 1 > context))
        return cls(tokens, mask, context, starts, lengths, members, bounds, skipped, fingerprint)

    @classmethod
    def of_split(cls, dataset: ShardDataset, split: str, context: int) -> PackedWindows:
        """`split` ("train" or "val") of a prompt/completion dataset, packed at `context`."""
        tokens, mask = (
            (dataset.train, dataset.train_mask)
            if split == "train"
            else (dataset.val, dataset.val_mask)
        )
        if mask is None:
            raise ValueError(f"{dataset.root} holds no loss mask: plain text is not packed")
        return cls.build(tokens, mask, context, dataset.fingerprint)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @property
    def width(self) -> int:
        return self.context

    @cached_property  # asked at every checkpoint; the layout never changes
    def digest(self) -> str:
        """sha256 of the window layout: a sampler state proves its windows are these."""
        return sha256_bytes(self.members.tobytes() + self.bounds.tobytes())

    @property
    def layout(self) -> dict[str, Any] | None:
        """The packing algorithm, the context and the layout's sha256: another packing would
        draw other windows under the same indices."""
        return {"algorithm": PACKING, "context": self.context, "windows": self.digest}

    def summary(self) -> dict[str, Any] | None:
        """Examples, windows, examples too long for any window, and the padding share."""
        return {
            "examples": len(self.lengths),
            "windows": len(self),
            "too_long": self.skipped,
            "padding": round(self.padding_share(), 6),
        }

    def window(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(inputs, targets, segments) of window k, each (context,) int64."""
        T = self.context
        inputs = np.zeros(T, dtype=np.int64)  # padding inputs: any id, never a target
        targets = np.full(T, IGNORE_INDEX, dtype=np.int64)
        segments = np.zeros(T, dtype=np.int64)
        pos = 0
        items = self.members[self.bounds[k] : self.bounds[k + 1]]
        for seg, item in enumerate(items.tolist(), start=1):
            start, length = int(self.starts[item]), int(self.lengths[item])
            ids = self.tokens.window(start, length)
            marks = self.mask.window(start, length)
            n = length - 1
            inputs[pos : pos + n] = ids[:-1]
            targets[pos : pos + n] = np.where(marks[1:] == TARGET, ids[1:], IGNORE_INDEX)
            segments[pos : pos + n] = seg
            pos += n
        segments[pos:] = len(items) + 1
        return inputs, targets, segments

    def batch(self, ks: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(inputs, targets, segments), each (len(ks), context) int64."""
        rows = [self.window(int(k)) for k in ks]
        inputs, targets, segments = (np.stack([row[i] for row in rows]) for i in range(3))
        return torch.from_numpy(inputs), torch.from_numpy(targets), torch.from_numpy(segments)

    def padding_share(self) -> float:
        """Share of the windows' positions that are padding (of these windows: no re-packing)."""
        used = int((self.lengths[self.members] - 1).sum())
        return 1 - used / max(1, len(self) * self.context)
