"""The fixed tree a step's K micro-batch sums are folded in: its shape depends on K alone, so
any process count that holds whole subtrees of it computes the same bits.

Floating-point addition is commutative but not associative: `a + b` is `b + a` to the bit,
`(a + b) + c` need not be `a + (b + c)`. A sum whose grouping follows the process count (a ring
all-reduce, or accumulating K/W micro-batches on each of W ranks before a collective sum) so
changes in the last bits with the layout. Here the grouping is a binary counter over the K
leaves in order: equal-sized neighbours merge as soon as both exist, and what remains at the
end (one subtree per set bit of K, largest first) is folded from the left. Every subtree is an
aligned block of 2^i leaves, so a layout whose pieces are such blocks folds the same tree
(`block_ok`).

Pure functions: no torch, no process group; `octlm.trainer.reduction` applies them to tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class FoldStack(Generic[T]):
    """The binary-counter fold, one leaf at a time: at most log2(K)+1 partial sums are held.

    `add(left, right)` returns their sum and may reuse `left`'s storage (an in-place add): the
    left operand is always a finished subtree nobody else reads again.
    """

    def __init__(self, add: Callable[[T, T], T]) -> None:
        self.add = add
        self.parts: list[tuple[int, T]] = []  # (leaves, partial sum), sizes strictly falling

    def push(self, leaf: T, size: int = 1) -> None:
        """Append the next `size` leaves, already folded as one subtree (`size` a power of 2)."""
        item = (size, leaf)
        while self.parts and self.parts[-1][0] == item[0]:
            left_size, left = self.parts.pop()
            item = (left_size + item[0], self.add(left, item[1]))
        self.parts.append(item)

    @property
    def depth(self) -> int:
        """Partial sums held now (the extra buffers the fold costs)."""
        return len(self.parts)

    def result(self) -> T:
        """The sum of everything pushed: the remaining subtrees folded from the left."""
        if not self.parts:
            raise ValueError("nothing was pushed")
        total = self.parts[0][1]
        for _, part in self.parts[1:]:
            total = self.add(total, part)
        self.parts = []
        return total


def fold(leaves: Sequence[T], add: Callable[[T, T], T]) -> T:
    """The fixed-tree sum of `leaves`, in their order."""
    stack: FoldStack[T] = FoldStack(add)
    for leaf in leaves:
        stack.push(leaf)
    return stack.result()


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def block_ok(total: int, world: int) -> bool:
    """Whether `world` processes can fold `total` leaves in the fixed tree.

    Micro-batch m of rank r is leaf m * world + r (the data order's own layout), so each
    micro-batch index brings a block of `world` neighbouring leaves, folded across the ranks
    first; the blocks are then folded in the order of m. That equals the one-process tree when
    each block is a subtree of it (world a power of 2: the blocks are aligned) or when there is
    one block (world == total)."""
    return world >= 1 and total % world == 0 and (is_power_of_two(world) or world == total)


def worlds_for(total: int) -> list[int]:
    """Every process count that folds `total` micro-batches in the fixed tree."""
    return [w for w in range(1, total + 1) if block_ok(total, w)]
