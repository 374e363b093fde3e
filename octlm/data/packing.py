"""Prompt/completion examples packed into windows: whole examples, each attending to itself only.
This module is the pure part (the mask's values, `pack`, the padding it leaves), free of torch so
that `octlm prepare` starts fast; `octlm.data.packed` builds a run's windows from it.

A split's token stream holds its examples back to back; its loss-mask stream says, per token,
`START` (an example's first token), `CONTEXT` (a prompt token: read, never a target) or `TARGET`
(a completion token or the closing EOS). An example of L tokens fills L - 1 positions of a
window (inputs e[:-1], targets e[1:]). Windows of `context` positions are filled by best-fit
decreasing (`pack`), a pure function of the example lengths; the positions left over are
padding, a segment of their own. A window's `segments` row numbers its examples 1, 2, ... (the
padding gets the next number): the model lets a position attend only within its segment and
restarts RoPE positions there, so a packed example is scored as it would be alone.

Why packed, not one example per window: on the length mixes in `bench/packing_waste.py` padding
per example wastes most of every window (docs/finetune.md has the numbers), packing a few %.
"""

from __future__ import annotations

import numpy as np

CONTEXT, TARGET, START = 0, 1, 2
"""Loss-mask values (uint8), version 1 of the stream."""
LOSS_MASK_VERSION = 1
PACKING = "best-fit-decreasing/v1"
"""Names `pack`'s algorithm in sampler states: another packing would draw other windows."""


def pack(sizes: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing of items of `sizes` positions into windows of `capacity`.

    Returns (members, bounds): window k holds the items members[bounds[k]:bounds[k + 1]], in
    ascending item order. Items larger than `capacity` are left out (the caller counts them).
    Items are taken longest first (ties: the lower index first), each into the open window it
    fills most tightly (ties: the window opened last), else a new window: deterministic, and
    within a few % of the fewest windows on realistic mixes.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if capacity < 1:
        raise ValueError(f"window capacity {capacity} is not positive")
    order = np.lexsort((np.arange(len(sizes)), -sizes))
    order = order[(sizes[order] <= capacity) & (sizes[order] > 0)]
    # A segment tree over the remaining room r in [0, capacity]: leaf r counts the open windows
    # with exactly r positions left; each window with room r sits on stacks[r].
    leaves = 1 << capacity.bit_length()  # a power of two above capacity
    tree = np.zeros(2 * leaves, dtype=np.int64).tolist()
    stacks: list[list[int]] = [[] for _ in range(capacity + 1)]
    window_of = np.empty(len(sizes), dtype=np.int64)
    window_of[:] = -1
    n_windows = 0

    def change(room: int, delta: int) -> None:
        node = room + leaves
        while node:
            tree[node] += delta
            node //= 2

    def tightest(need: int) -> int:
        """The smallest room >= need with an open window, or -1."""
        return _leftmost(tree, 1, 0, leaves - 1, need)

    for item in order.tolist():
        size = int(sizes[item])
        room = tightest(size)
        if room < 0:
            window, room = n_windows, capacity
            n_windows += 1
        else:
            window = stacks[room].pop()
            change(room, -1)
        window_of[item] = window
        left = room - size
        if left:  # a full window takes no more items
            stacks[left].append(window)
            change(left, 1)
    placed = np.flatnonzero(window_of >= 0)
    # Members grouped by window, each window's items in ascending order (a stable sort).
    members = placed[np.argsort(window_of[placed], kind="stable")]
    counts = np.bincount(window_of[placed], minlength=n_windows)
    bounds = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    return members.astype(np.int64), bounds


def _leftmost(tree: list[int], node: int, lo: int, hi: int, need: int) -> int:
    """Leftmost leaf >= need under `node` (covering [lo, hi]) whose count is positive."""
    if hi < need or tree[node] == 0:
        return -1
    if lo == hi:
        return lo
    mid = (lo + hi) // 2
    found = _leftmost(tree, 2 * node, lo, mid, need)
    return found if found >= 0 else _leftmost(tree, 2 * node + 1, mid + 1, hi, need)


def waste_shares(sizes: np.ndarray, capacity: int) -> dict[str, float]:
    """Padding's share of the positions computed, packed (`pack`) against one item per window,
    over the items that fit; the examples' own prompt positions are not counted as waste."""
    sizes = np.asarray(sizes, dtype=np.int64)
    fits = sizes[(sizes <= capacity) & (sizes > 0)]
    used = int(fits.sum())
    if not used:
        return {"packed": 0.0, "padded": 0.0, "windows": 0, "examples": 0}
    _, bounds = pack(fits, capacity)
    windows = len(bounds) - 1
    return {
        "packed": 1 - used / (windows * capacity),
        "padded": 1 - used / (len(fits) * capacity),
        "windows": windows,
        "examples": len(fits),
    }
