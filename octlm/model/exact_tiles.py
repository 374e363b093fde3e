"""The exact path's attention tiles (`octlm/model/exact.py`, `octlm/model/exact_whole.py`): the
fixed shapes whose products give a query row the same bits whatever the other rows, and the
batched product both attentions run them with."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

QUERIES = 4
"""Query rows of an attention tile: the query heads that share a key/value head, at each
position (a decode step of `tiny` or `small`, 3 heads a group, fills 3 of the 4)."""
KEYS = 64
"""Keys of an attention tile (kernels 1 and 2), and the unit a cache's width is rounded to."""
QUERY_TILES = 32
"""Query tiles computed together (bounds the score tensor's memory; changes no bit)."""


def as_float(x: Tensor) -> Tensor:
    return x if x.dtype == torch.float32 else x.float()


def query_positions(positions: Tensor, group: int) -> Tensor:
    """Each query row's position, (B, nq * QUERIES): a key/value head's rows are its `group`
    query heads at each of the positions (B, T), padded to whole tiles with position 0 (a
    padding row reads key 0 only: never NaN, and nothing reads it)."""
    B, T = positions.shape
    rows = group * T
    nq = -(-rows // QUERIES)
    each = positions.unsqueeze(1).expand(B, group, T).reshape(B, rows)  # (cheaper than repeat)
    return F.pad(each, (0, nq * QUERIES - rows))


def tile_product(a: Tensor, b: Tensor) -> Tensor:
    """`torch.matmul(a, b)` of a (N, nq, nk or 1, X, Y) and b (N, 1, nk, Y, Z): the very batched
    product matmul makes of them (each tile its own X x Y by Y x Z product), without its op.
    With autograd it is matmul itself: under autocast matmul casts before it expands, so its
    backward adds the expanded tiles' gradients in bfloat16, which these steps would not."""
    if torch.is_grad_enabled():
        return torch.matmul(a, b)
    N, nq, nk = a.shape[0], a.shape[1], b.shape[2]
    X, Y, Z = a.shape[3], a.shape[4], b.shape[4]
    left = a.expand(N, nq, nk, X, Y).reshape(N * nq * nk, X, Y)
    right = b.expand(N, nq, nk, Y, Z).reshape(N * nq * nk, Y, Z)
    return torch.bmm(left, right).view(N, nq, nk, X, Z)
