"""The plain decode's weight products with the weights packed once: oneDNN's float32 CPU matrix
product over a weight reordered ahead of time (the layout its kernel reads), for the batched
steps of `octlm serve`'s plain batch and `generate_batch(exact=False)`.

Why. A decoding step of a small model streams every weight once per step, and what a batch of B
rows should cost is about that stream. PyTorch's CPU `F.linear` (MKL) runs 1 row as a
matrix-vector product, which streams well, but for 2..32 rows it copies each weight into its
own panel layout on every call: measured on `small`'s products in a decode's order (every
layer's, then the 32768 x 384 head), 1 thread, the chain costs 6.3 ms at 1 row and 16-17 ms
at 8 rows, against 10.5-10.8 ms at 8 rows from weights packed once (docs/performance.md,
"Packed weights for the plain batch"). From 4 rows on, for a weight of `MIN_WEIGHT` elements
or more, the packed product is the faster one; elsewhere `F.linear` stays (oneDNN's call costs
more, which a small weight never wins back).

The results equal `F.linear`'s to float rounding (another kernel, another summation order),
not bit for bit: this is for the plain path only, which promises no particular bits. The exact
path (`octlm/model/exact.py`) keeps its own fixed tiles. A packed copy of every weight lives as
long as its `PackedWeights` (a server's life, one `generate_batch` call): the model's weights
must not change meanwhile, and the copy costs as much memory as the weights it packs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

MIN_ROWS = 4
"""Fewest rows a product runs packed (below, `F.linear` is as fast or faster: the module's
docstring)."""
MIN_WEIGHT = 1 << 19
"""Fewest elements a weight runs packed: oneDNN's call costs 10-15 us more than MKL's, which a
small weight (one that MKL's per-call copy keeps in cache) never wins back. Measured at 8 rows,
1 thread: 384 x 384 1.58x F.linear's time, 384 x 1024 1.25x, 2048 x 384 0.75x, 4096 x 192 0.64x,
32768 x 384 0.46x (docs/performance.md, "Packed weights for the plain batch")."""
PACKED_FOR = 8
"""The row count oneDNN is told to pack for; any row count runs on the packing."""


def onednn_pack(weight: Tensor, rows: int = PACKED_FOR) -> Tensor:
    """`weight` (out, in) reordered into the blocked layout oneDNN's product reads, told to
    expect `rows` rows (any count runs on it)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)


def onednn_linear(x: Tensor, packed: Tensor) -> Tensor:
    """x (M, in) @ weight.T from `onednn_pack(weight)`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], "")


def float32_cpu(weight: Tensor) -> bool:
    """A float32 CPU weight outside autocast: what the packed products (oneDNN's, MKL's) take."""
    return (
        weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
    )


def packable(weight: Tensor) -> bool:
    """oneDNN's packed product serves float32 CPU weights outside autocast."""
    return float32_cpu(weight) and torch.backends.mkldnn.is_available()


class PackedWeights:
    """`linear(x, weight)` = `F.linear(x, weight)`, from a packed copy of `weight` (made at its
    first use) when x holds `MIN_ROWS` rows or more and the weight is `packable` with
    `MIN_WEIGHT` elements or more."""

    def __init__(self) -> None:
        self.packs: dict[int, Tensor] = {}
        self.broken = False
        """Set when this build's oneDNN ops refused a weight: every product then runs plain."""

    def linear(self, x: Tensor, weight: Tensor) -> Tensor:
        rows = x.numel() // x.shape[-1]
        if self.broken or rows < MIN_ROWS or weight.numel() < MIN_WEIGHT or not packable(weight):
            return F.linear(x, weight)
        packed = self.packs.get(id(weight))
        try:
            if packed is None:
                packed = self.packs[id(weight)] = onednn_pack(weight)
            out = onednn_linear(x.reshape(rows, x.shape[-1]), packed)
        except (RuntimeError, AttributeError):  # an op this build lacks: plain from here on
            self.broken = True
            return F.linear(x, weight)
        return out.view(*x.shape[:-1], weight.shape[0])
