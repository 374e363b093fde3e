"""How a step's sums are made: the tree reduction, the same bits on any process count.

`--reduction tree` (the default for new runs): each micro-batch's gradient is computed alone
and the step's K = processes x accumulation gradients are folded in the fixed tree of
`octlm.trainer.fold`, whose shape depends on K only. Ranks exchange gradients with collectives
that only move bytes (all_to_all, all_gather), never with a collective sum, whose grouping
follows the process count and the backend:

- Micro-batch m of rank r is leaf m * W + r (the data order's layout). After its backward,
  every rank sends chunk c of its gradient to rank c (all_to_all); rank c folds the W pieces it
  holds, leaves m*W .. m*W + W-1, in tree order, and pushes the result on its `FoldStack`.
  After the last micro-batch the stack is folded and the chunks are all-gathered (DDP layout:
  every rank holds the whole gradient) or left sharded (FSDP2: its reduce-scatter is replaced
  by the same all_to_all and fold, `FoldReduceScatter`).
- The loss, the z-loss and the validation loss are folded the same way from per-micro-batch
  (per-batch) values gathered in leaf order.
- The gradient norm is the exactly rounded sum (`math.fsum`) of per-row sums of squares: a row
  never spans two FSDP shards, and an exactly rounded sum has no order to depend on.
- Dropout draws from a generator seeded with (seed, step, leaf): every layout draws alike.

`--reduction collective` is the earlier way (DDP's and FSDP2's own all-reduce/reduce-scatter,
`autograd` accumulating the micro-batches): run folders written before keep it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from octlm.trainer.distributed import DistInfo
from octlm.trainer.fold import FoldStack, fold

Grads = list[torch.Tensor]


def _add(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    return left.add_(right)  # left is a finished subtree's own buffer


def _add_lists(left: Grads, right: Grads) -> Grads:
    torch._foreach_add_(left, right)
    return left


def leaf_seed(seed: int, step: int, leaf: int) -> int:
    """The generator seed of one micro-batch: a function of the run's seed, the step and the
    micro-batch's index in the step, never of the rank that computes it."""
    digest = hashlib.sha256(f"octlm-leaf:{seed}:{step}:{leaf}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # torch.manual_seed takes < 2**63


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (an FSDP2 shard), or `t` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


class FoldReduceScatter:
    """FSDP2's reduce-scatter as moved bytes and a fixed fold (`set_custom_reduce_scatter`).

    FSDP2 hands over each rank's flat gradient laid out as W chunks, chunk c for rank c. The
    all_to_all gives rank c every rank's chunk c, in rank order: the leaves m*W .. m*W + W-1 of
    this micro-batch, which are folded in the fixed tree. The op FSDP2 passes is a plain sum
    (the divide factor is set to 1), which is what the fold computes.
    """

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        world = dist.get_world_size(group)
        received = torch.empty_like(input_tensor)
        dist.all_to_all_single(received, input_tensor, group=group)
        output_tensor.copy_(fold(list(received.view(world, -1)), _add))
        return None


def shard_for_tree(model: nn.Module) -> None:
    """FSDP2 on every block and the root, with the reduce-scatter replaced by the fold."""
    from torch.distributed.fsdp import fully_shard

    units = [*model.layers, model]  # type: ignore[attr-defined]
    for unit in units[:-1]:
        fully_shard(unit)
    fully_shard(model)
    for unit in units:
        unit.set_custom_reduce_scatter(FoldReduceScatter())  # type: ignore[operator]
        unit.set_gradient_divide_factor(1.0)  # type: ignore[operator]


def broadcast_model(model: nn.Module, info: DistInfo) -> None:
    """Rank 0's weights and buffers on every rank (what DDP does when it wraps a model): the
    tree layout replicates the model without DDP's wrapper."""
    if not info.enabled:
        return
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t, src=0)


class TreeReducer:
    """One step's gradient fold over the optimizer's `params` (their order is the row order of
    the norm): `start`, `after_micro` after each backward, `finish` leaves the folded gradient
    in `.grad`. Holds at most log2(accumulation)+1 partial sums (1/W of the gradient each with
    W > 1 processes)."""

    def __init__(self, params: Sequence[nn.Parameter], info: DistInfo, fsdp: bool) -> None:
        self.params, self.info, self.fsdp = list(params), info, fsdp
        self.stack: FoldStack = FoldStack(_add_lists)
        self.pending: tuple[dist.Work, torch.Tensor] | None = None
        """The last micro-batch's exchange, still in flight (DDP layout)."""
        self.peak_depth = 0
        """The most partial sums held at once during the last step."""

    def start(self) -> None:
        self.stack, self.peak_depth, self.pending = FoldStack(_add_lists), 0, None

    def _take_grads(self) -> Grads:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        for p in self.params:  # the next backward writes a fresh gradient, not a sum
            p.grad = None
        return grads

    @torch.no_grad()
    def after_micro(self) -> None:
        """Take the gradient the last backward left (FSDP2: already folded across ranks)."""
        grads = self._take_grads()
        if self.info.enabled and not self.fsdp:
            self._settle()  # the previous micro-batch's exchange, overlapped with this one
            self.pending = self._exchange(grads)
        else:  # one process, or FSDP2's sharded gradients (DTensors: kept to be put back)
            self.stack.push(grads)
        self.peak_depth = max(self.peak_depth, self.stack.depth)

    def _exchange(self, grads: Grads) -> tuple[dist.Work, torch.Tensor]:
        """Start sending the W ranks' gradients cut in W chunks, chunk c to rank c (bytes
        only); `_settle` folds what arrived."""
        world = self.info.world
        numel = sum(g.numel() for g in grads)
        chunk = -(-numel // world)
        pad = grads[0].new_zeros(chunk * world - numel)  # one copy: the flat buffer is sent
        send = torch.cat([*(g.reshape(-1) for g in grads), pad])
        del grads[:]  # the micro-batch's own gradients are in `send` now
        received = torch.empty_like(send)
        work = dist.all_to_all_single(received, send, async_op=True)
        assert work is not None
        return work, received

    def _settle(self) -> None:
        """Fold the pending exchange's pieces, leaves m*W .. m*W + W-1 of micro-batch m, in
        rank (leaf) order, and push this rank's chunk of their sum on the stack. Micro-batches
        settle in their order, so the stack sees the same sequence as without the overlap."""
        if self.pending is None:
            return
        work, received = self.pending
        work.wait()
        self.pending = None
        self.stack.push([fold(list(received.view(self.info.world, -1)), _add)])

    @torch.no_grad()
    def finish(self) -> None:
        """Put the step's folded gradient in every parameter's `.grad`."""
        self._settle()
        folded = self.stack.result()
        if not (self.info.enabled and not self.fsdp):
            for p, g in zip(self.params, folded, strict=True):
                p.grad = g
            return
        mine = folded[0]
        whole = torch.empty(mine.numel() * self.info.world, dtype=mine.dtype, device=mine.device)
        dist.all_gather_into_tensor(whole, mine)
        offset = 0
        for p in self.params:
            p.grad = whole[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    def fold_values(self, values: Sequence[torch.Tensor]) -> torch.Tensor:
        """The fixed-tree sum of one scalar per micro-batch over every rank (the loss)."""
        mine = torch.stack(list(values)).float()
        if self.info.enabled:
            world = self.info.world
            every = torch.empty(mine.numel() * world, dtype=mine.dtype, device=mine.device)
            dist.all_gather_into_tensor(every, mine)
            mine = every.view(world, -1).t().reshape(-1)  # leaf m * W + r, in order
        return fold([v.clone() for v in mine], _add)

    @torch.no_grad()
    def clip(self, max_norm: float) -> float:
        """The global gradient norm before clipping; scales the gradients to `max_norm` when it
        is exceeded (0: never). The same bits on any layout: see the module's doc."""
        rows = [_row_squares(_local(p.grad)) for p in self.params]  # type: ignore[arg-type]
        if self.fsdp and self.info.enabled:
            rows = self._gather_rows(rows)
        values = torch.cat(rows).double().cpu().tolist() if rows else []
        try:
            norm = math.sqrt(math.fsum(values))
        except (OverflowError, ValueError):  # an inf or nan among them
            norm = float("nan") if any(math.isnan(v) for v in values) else float("inf")
        if max_norm > 0 and math.isfinite(norm):
            coef = max_norm / (norm + 1e-6)  # torch's clip_grad_norm_ rule
            if coef < 1.0:
                torch._foreach_mul_([_local(p.grad) for p in self.params], coef)  # type: ignore[arg-type]
        return norm

    def _gather_rows(self, rows: Grads) -> Grads:
        """Every rank's row sums (zero-padded to one length: zeros add nothing to an exact
        sum): an FSDP2 shard holds whole rows, so together they are every row once."""
        world = self.info.world
        sizes = [-(-_rows(p) // world) for p in self.params]
        pad = torch.nn.functional.pad
        padded = torch.cat([pad(r, (0, n - r.numel())) for r, n in zip(rows, sizes, strict=True)])
        every = torch.empty(padded.numel() * world, dtype=padded.dtype, device=padded.device)
        dist.all_gather_into_tensor(every, padded)
        return [every]


def _rows(p: torch.Tensor) -> int:
    return p.shape[0] if p.dim() else 1


def _row_squares(g: torch.Tensor) -> torch.Tensor:
    """Each row's sum of squares (a 1-D tensor's elements are its rows)."""
    g = g.float()
    if g.dim() == 0:
        return g.square().reshape(1)
    if g.dim() == 1:
        return g.square()
    return g.flatten(1).square().sum(1)


def ordered_sum(parts: Sequence[torch.Tensor], info: DistInfo) -> torch.Tensor:
    """Every rank's values (batch b on rank b mod world), added one by one in batch order: the
    sum one process computes (validation's nats)."""
    mine = torch.stack(list(parts)) if parts else torch.zeros(0, dtype=torch.float64)
    count = torch.tensor([mine.numel()], device=mine.device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)  # a maximum: exact in any order
    longest = int(count.item())
    padded = torch.zeros(longest, dtype=mine.dtype, device=mine.device)
    padded[: mine.numel()] = mine
    every = torch.empty(longest * info.world, dtype=mine.dtype, device=mine.device)
    dist.all_gather_into_tensor(every, padded)
    total = torch.zeros((), dtype=mine.dtype, device=mine.device)
    for value in every.view(info.world, longest).t().reshape(-1):  # the padding adds zeros
        total += value
    return total


def seeder(seed: int, world: int, rank: int) -> Callable[[int, int], None]:
    """`seed_micro(step, micro)`: seed torch's generators for this rank's micro-batch `micro`
    of `step` (leaf micro * world + rank), before its forward."""

    def seed_micro(step: int, micro: int) -> None:
        torch.manual_seed(leaf_seed(seed, step, micro * world + rank))

    return seed_micro
