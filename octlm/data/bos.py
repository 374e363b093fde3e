"""BOS-aligned rows for pretraining (`--packing bos`): each row of T + 1 tokens starts at a
document's first token wherever the data allows, and is filled best-fit from the documents
near it. `BosRows` is a `octlm.data.windows.Windows`.

Why. A window cut at any offset of the stream (`StreamWindows`) mostly starts mid-document: the
model then spends its first positions predicting text whose beginning it never saw.
nanochat's loader and modded-nanogpt's record #26 align rows with document starts instead.

The layout, a pure function of the stream and the row index (no state, no replay, any world
size: the sampler's draws pick rows as they pick windows). The stream is cut into blocks of
R rows' worth of tokens, B = R * (T + 1) (R = `block_rows(T)`: about 16k tokens); row k is row
k % R of block k // R, so finding a row reads one block (memory bounded by the block, not the
corpus). A block's tokens
are cut at document boundaries (position 0 of the stream and every token after an EOS start a
document) into pieces; `fill_rows` deals them into the block's R rows:

- a row's first piece is a document start (a head) as long as the block has one left: while
  the block holds more heads than rows left, the longest head that fits (else the shortest,
  cut); once it holds no more than rows left, the longest head, cut to the row if it is longer
  (so every head starts a row, and the remainder fills the ends of later rows);
- the rest of the row takes, best fit, the longest piece that fits in the room left (ties: a
  head), except that while the block has no more document starts left than rows, a tail that
  fits goes before any head (the heads are kept to start rows); when none fits, the shortest
  piece that does not (a tail before a head, so document starts stay whole for later rows) is
  cut to fill the row exactly.

What does not fit is carried, not cropped: a cut piece's remainder becomes a tail (it starts
mid-document) that later rows of the block take. Every token of a block lands in exactly one row:
nothing is cropped and nothing padded, and the only tokens no row reads are the last
(fewer than T + 1) of the stream. Why carry: cropping (nanochat drops what does not fit) throws
away most of a long document; on the embedded corpus (plays of tens of thousands of tokens) and
on long-document corpora that is most of the data (`bench/packing_waste.py --bos` measures both
ways; docs/data.md has the numbers). Rows whose block holds fewer document starts than rows (long
documents) start mid-document, as unavoidably as the documents' continuations must be read.

With `doc_mask` (--doc-mask) a row also has its segments, 1, 2, ... per piece: the model then
lets a position attend only within its piece and restarts RoPE positions there
(`octlm.model.positions.segment_attention`), the machinery packed fine-tuning examples use.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from octlm.data.shards import TokenStream

BOS_PACKING = "bos-best-fit-carry/v1"
"""Names the layout in sampler states: another layout would read other rows under the same index."""
BLOCK_TOKENS = 16_384
"""About how many tokens are dealt together (`block_rows`): more gives the best fit more choice
and a row more chance to start at a document, and costs more to deal. A random row's block is
rarely cached on a large corpus, so each row read deals one block: bench/data_rate.py --cold
measures that cost."""
CACHED_BLOCKS = 32
Part = tuple[int, int, int]
"""(piece, offset into the piece, tokens): a run of one piece's tokens in a row."""


def block_rows(context: int) -> int:
    """Rows per block at `context`: BLOCK_TOKENS' worth, at least 4."""
    return max(4, BLOCK_TOKENS // (context + 1))


def _largest_fitting(pool: list[tuple[int, int]], room: int) -> int:
    """Index in `pool` (sorted (length, piece) pairs) of the longest piece of at most `room`
    tokens (ties: the later piece), or -1."""
    return bisect.bisect_right(pool, (room, 1 << 62)) - 1


def fill_rows(lengths: Sequence[int], heads: Sequence[bool], capacity: int) -> list[list[Part]]:
    """Deal pieces of `lengths` tokens (`heads[i]`: piece i starts a document) into rows of
    exactly `capacity` tokens, as the module docstring says; sum(lengths) must be a multiple of
    `capacity`. Row r is a list of parts in the order they fill it."""
    total = int(sum(lengths))
    if capacity < 1 or total % capacity:
        raise ValueError(f"{total} tokens do not fill rows of {capacity}")
    pieces = list(enumerate(zip(lengths, heads, strict=True)))
    head_pool = sorted((int(n), i) for i, (n, h) in pieces if h and n)
    tail_pool = sorted((int(n), i) for i, (n, h) in pieces if not h and n)
    placed = [0] * len(lengths)
    rows: list[list[Part]] = []

    def take(pool: list[tuple[int, int]], at: int, room: int, parts: list[Part]) -> int:
        """Put pool[at] into the row, cut to `room` (its remainder carried as a tail); the room
        left."""
        n, piece = pool.pop(at)
        used = min(n, room)
        parts.append((piece, placed[piece], used))
        placed[piece] += used
        if n > used:
            bisect.insort(tail_pool, (n - used, piece))
        return room - used

    n_rows = total // capacity
    for r in range(n_rows):
        parts: list[Part] = []
        first = head_pool if head_pool else tail_pool
        if len(head_pool) <= n_rows - r:
            # No more document starts than rows left: each can start a row, and the longest
            # first, cut to the row, leaves tails to fill the ends of later rows.
            at = len(first) - 1
        else:  # more than rows: the best fit, and a document too long for any row is cut
            at = max(_largest_fitting(first, capacity), 0)
        room = take(first, at, capacity, parts)
        while room:
            h, t = _largest_fitting(head_pool, room), _largest_fitting(tail_pool, room)
            # Document starts are kept for rows to start with while there are fewer left
            # than rows: a tail that fits fills before any head does.
            scarce = len(head_pool) <= n_rows - r - 1
            if scarce and tail_pool:
                room = take(tail_pool, max(t, 0), room, parts)  # none fits: the shortest, cut
            elif h >= 0 and (t < 0 or head_pool[h][0] >= tail_pool[t][0]):
                room = take(head_pool, h, room, parts)
            elif t >= 0:
                room = take(tail_pool, t, room, parts)
            else:  # nothing fits: cut a tail (document starts stay whole while tails last)
                room = take(tail_pool if tail_pool else head_pool, 0, room, parts)
        rows.append(parts)
    return rows


@dataclass(frozen=True)
class Block:
    """One block, dealt: its tokens, and per row the (start, tokens) runs of them it reads."""

    tokens: np.ndarray
    runs: list[list[tuple[int, int]]]
    at_start: np.ndarray
    """(rows,) bool: whether the row starts at a document."""


@dataclass(frozen=True)
class BosRows:
    """A token stream's BOS-aligned rows of `context` + 1 tokens (inputs, targets[, segments])."""

    stream: TokenStream
    context: int
    eos_id: int
    """A document ends with this token, so the token after it starts one."""
    fingerprint: str
    """The prepared dataset's fingerprint (`ShardDataset.fingerprint`)."""
    doc_mask: bool = False
    rows_per_block: int = 0
    """0: `block_rows(context)`."""
    cached_blocks: int = CACHED_BLOCKS
    """Blocks kept once built (0: none, for measuring the cold cost)."""
    _blocks: OrderedDict = field(default_factory=OrderedDict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.rows_per_block and self.context > 0:
            object.__setattr__(self, "rows_per_block", block_rows(self.context))
        if self.context < 1 or self.rows_per_block < 1:
            raise ValueError(f"rows of context {self.context}, {self.rows_per_block} per block")

    @property
    def row_tokens(self) -> int:
        return self.context + 1

    def __len__(self) -> int:
        return len(self.stream) // self.row_tokens

    @property
    def width(self) -> int:
        return self.context

    @property
    def layout(self) -> dict[str, Any] | None:
        """The layout's name, context, block size and document boundary: another value of any
        of them reads other rows under the same indices."""
        return {
            "algorithm": BOS_PACKING,
            "context": self.context,
            "rows_per_block": self.rows_per_block,
            "eos_id": self.eos_id,
        }

    def summary(self) -> dict[str, Any] | None:
        """For the log header: rows, tokens no row reads (cropped: none; the stream's end),
        padding (none), and over up to 16 blocks spread over the stream the share of rows that
        start at a document."""
        n_blocks = -(-len(self) // self.rows_per_block)
        sampled = sorted({b * n_blocks // 16 for b in range(16)}) if n_blocks else []
        at_start = np.concatenate([self.block(b).at_start for b in sampled] or [np.zeros(0, bool)])
        return {
            "packing": "bos",
            "rows": len(self),
            "rows_per_block": self.rows_per_block,
            "cropped": 0.0,
            "padded": 0.0,
            "unread_tokens": len(self.stream) - len(self) * self.row_tokens,
            "rows_at_document_start": round(float(at_start.mean()) if len(at_start) else 0, 6),
            "sampled_blocks": len(sampled),
        }

    def block_pieces(self, b: int) -> tuple[np.ndarray, np.ndarray, list[bool], int]:
        """(tokens, piece starts, piece is a head, rows) of block `b`."""
        first = b * self.rows_per_block
        rows = min(self.rows_per_block, len(self) - first)
        if rows < 1:
            raise IndexError(f"block {b} of a stream with {len(self)} rows")
        begin, size = first * self.row_tokens, rows * self.row_tokens
        tokens = self.stream.window(begin, size)
        starts = np.concatenate(([0], np.flatnonzero(tokens[:-1] == self.eos_id) + 1))
        first_is_head = begin == 0 or int(self.stream.window(begin - 1, 1)[0]) == self.eos_id
        heads = [first_is_head] + [True] * (len(starts) - 1)
        return tokens, starts, heads, rows

    def block(self, b: int) -> Block:
        """Block `b`'s tokens and the runs of them each of its rows reads. The last few blocks
        asked for are kept (a random draw rarely asks twice, an epoch of a small dataset often)."""
        if b in self._blocks:
            self._blocks.move_to_end(b)
            return self._blocks[b]
        tokens, starts, heads, _ = self.block_pieces(b)
        lengths = np.diff(np.append(starts, len(tokens)))
        runs, at_start = [], []
        for parts in fill_rows(lengths.tolist(), heads, self.row_tokens):
            runs.append([(int(starts[piece]) + offset, n) for piece, offset, n in parts])
            piece, offset, _ = parts[0]
            at_start.append(heads[piece] and offset == 0)
        found = Block(tokens, runs, np.array(at_start, dtype=bool))
        if self.cached_blocks:
            self._blocks[b] = found
            if len(self._blocks) > self.cached_blocks:
                self._blocks.popitem(last=False)
        return found

    def row(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, segments) of row k, each (T + 1,) int64: segment s numbers its s-th run."""
        b, r = divmod(int(k), self.rows_per_block)
        block = self.block(b)
        runs = block.runs[r]
        tokens = np.concatenate([block.tokens[start : start + n] for start, n in runs])
        segments = np.repeat(np.arange(1, len(runs) + 1), [n for _, n in runs])
        return tokens, segments

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, ...]:
        """(inputs, targets), with --doc-mask also segments, each (len(indices), T) int64."""
        rows = [self.row(int(k)) for k in indices]
        tokens = torch.from_numpy(np.stack([t for t, _ in rows]))
        if not self.doc_mask:
            return tokens[:, :-1], tokens[:, 1:]
        segments = torch.from_numpy(np.stack([s for _, s in rows]))
        return tokens[:, :-1], tokens[:, 1:], segments[:, :-1]
