"""The exact path's weight products (`octlm/model/exact.py`): a row's bits depend on that row
and the weight only, not on how many rows share the call or where the row sits among them.

Two kernels, by version (an RL run records the one it sampled with: `exact_kernel`, so a
resumed run keeps drawing its own bits):

- **1: MKL's product in tiles of `ROWS` rows.** MKL picks its kernel by the row count (1 row is
  a matrix-vector product, 2..15 rows others, M = 300 another), so each tile of 2 rows (the
  last zero-padded) is its own product, with the weight packed once for 2 rows. A batch of 8
  pays 4 calls, a prefill of 512 rows 256: each streams the whole weight.
- **2: oneDNN's product over a weight packed once, every row in one call** (the float32 CPU ops
  PyTorch's own compiler emits, `octlm/model/packed.py` uses them for the plain batch), the
  weight's inputs cut into `chunks` of at most `CHUNK` (384), each chunk its own product, the
  chunks' results added in order. Measured on this build (oneDNN's AVX2 and AVX-512 paths, 1
  and 2 threads, tests in tests/model/test_exact_products.py): a row's bits are the same for 1
  to 4,096 rows at any offset, and at 1 and 2 threads: the weight's blocked layout fixes the
  order over the inputs whatever the row count. So a decode step of 8 rows is one call per
  chunk, and a prefill or an evaluation's micro-batch of thousands of rows too.
  oneDNN's older paths do not hold it (with `ONEDNN_MAX_CPU_ISA=AVX` a row's bits follow the
  row count; `=SSE41` a lone row's), so `rows_invariant()` checks on first use, on this
  machine, and where it fails kernel 2 is kernel 1's tiles (one machine's bits, as ever).
  Why the chunks: for 1 or 2 rows oneDNN's call costs more than MKL's, and within 384 inputs
  MKL's packed 2-row tile adds each output's products in oneDNN's order (`tiles_agree`,
  checked once per shape), so a decode step's single tile runs on MKL's tiles at kernel 2's
  very bits. On `small` (docs/performance.md, "Exact products") a step's products cost at 8
  rows about 0.4x and at 64 rows about 0.16x what kernel 1's tiles cost, at 1 row about the
  same. (Where MKL's tiles cut a weight's inputs as the chunks do, kernels 1 and 2 give the
  same bits: on this machine every weight of `tiny`, whose widest has 512 inputs.)

Outside float32 on CPU (bf16, autocast, CUDA) both kernels are a plain product per tile of
`ROWS` rows: its shape fixed, its bits its own. Every kernel pads the rows to a multiple of
`ROWS` (`padded_rows`): a lone row is 2, which both oneDNN's and MKL's checks need.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from octlm.config.rl import EXACT_KERNEL
from octlm.model.packed import onednn_linear, onednn_pack

ROWS = 2
"""Rows of kernel 1's tiles (and the multiple every kernel pads the rows to). In float32 on CPU
a tile is MKL's product with the weight packed once for 2 rows: measured at 1 thread on
`small`'s layer shapes, about what MKL's 1-row product costs."""


CHUNK = 384
"""Kernel 2's products cut a weight's inputs into parts of at most this many, each its own
product, their results added in order: within 384 inputs MKL's 2-row tile and oneDNN add in the
same order (`tiles_agree`), so a decode step's tile may run on MKL's faster call for 1-2 rows."""


def padded_rows(n: int) -> int:
    return -(-n // ROWS) * ROWS


def packable(weight: Tensor) -> bool:
    """float32 on CPU outside autocast: where the packed kernels serve."""
    return (
        weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
    )


@functools.cache
def rows_invariant() -> bool:
    """Whether this machine's oneDNN gives a row the same bits at any row count: the kernel 2
    check (the module's docstring), on two shapes (one whose K is not a multiple of 16) and the
    row counts a decode, a batch and a prefill take. Deterministic inputs; about 2 ms."""
    if not torch.backends.mkldnn.is_available():
        return False
    generator = torch.Generator().manual_seed(0)
    try:
        for n, k in ((96, 80), (200, 37)):
            weight = torch.randn(n, k, generator=generator)
            x = torch.randn(70, k, generator=generator)
            packed = onednn_pack(weight)
            whole = onednn_linear(x, packed)
            for start, rows in ((0, 1), (0, 2), (3, 3), (0, 5), (1, 8), (9, 17), (0, 33)):
                part = onednn_linear(x[start : start + rows], packed)
                if not torch.equal(part, whole[start : start + rows]):
                    return False
    except (RuntimeError, AttributeError):  # a build without these ops
        return False
    return True


def chunks(inputs: int) -> list[tuple[int, int]]:
    """Kernel 2's cut of a weight's inputs: as few equal parts of at most `CHUNK` as cover it."""
    parts = -(-inputs // CHUNK)
    size = -(-inputs // parts)
    return [(lo, min(lo + size, inputs)) for lo in range(0, inputs, size)]


@functools.cache
def tiles_agree(out: int, inp: int) -> bool:
    """Whether MKL's packed 2-row tile gives an (out, inp) weight oneDNN's bits on this machine.
    Both add each output's products over the inputs one after another, which gives one result
    whatever the kernel, until a kernel cuts the inputs into blocks and adds the blocks' sums
    (measured: they agree on weights of 192 and 384 inputs, not of 512 and 1,024; hence
    `CHUNK`). Orders that differ differ on random inputs (2 x `out` sums), so one draw
    decides, once per shape and process."""
    if not torch.backends.mkl.is_available():
        return False
    generator = torch.Generator().manual_seed(out * 100_003 + inp)
    weight = torch.randn(out, inp, generator=generator)
    x = torch.randn(ROWS, inp, generator=generator)
    try:
        tiled = torch.ops.mkl._mkl_linear(x, mkl_pack(weight), weight, None, ROWS)
        return torch.equal(tiled, onednn_linear(x, onednn_pack(weight)))
    except (RuntimeError, AttributeError):  # a build without these ops
        return False


def mkl_pack(weight: Tensor) -> Tensor:
    return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), ROWS)


def pack(weight: Tensor, kernel: int) -> tuple[int, Any]:
    """The kernel that serves `weight` on this machine (`run_packed`'s `served`) and its packed
    copy: for kernel 2 one oneDNN packing per input chunk, (lo, hi, packed)."""
    if not packable(weight):
        return 0, None
    if kernel >= 2 and rows_invariant():
        cuts = chunks(weight.shape[1])
        return 2, [(lo, hi, onednn_pack(weight[:, lo:hi].contiguous())) for lo, hi in cuts]
    if torch.backends.mkl.is_available():
        return 1, mkl_pack(weight)
    return 0, None


def tile_packs(weight: Tensor) -> list[tuple[int, int, Tensor, Tensor]] | None:
    """Kernel 2's chunks as MKL's 2-row tiles (lo, hi, packed, chunk), where every chunk's tile
    gives oneDNN's bits (`tiles_agree`); else None."""
    parts = [(lo, hi, weight[:, lo:hi].contiguous()) for lo, hi in chunks(weight.shape[1])]
    if not all(tiles_agree(*chunk.shape) for *_, chunk in parts):
        return None
    return [(lo, hi, mkl_pack(chunk), chunk) for lo, hi, chunk in parts]


def run_packed(served: int, x: Tensor, weight: Tensor, packed: Any) -> Tensor:
    """x @ weight.T by the kernel `pack` chose: kernel 2's chunks by oneDNN (2) or, one tile of
    rows, by MKL's tiles of the same bits (3), each chunk's product then added in chunk order
    (a left fold: the same additions whichever way); MKL's tiles (1), plain tiles (0)."""
    if served >= 2:
        out = None
        for lo, hi, chunk_pack, *chunk in packed:
            part = x if len(packed) == 1 else x[:, lo:hi].contiguous()
            if served == 2:
                part = onednn_linear(part, chunk_pack)
            else:
                part = torch.ops.mkl._mkl_linear(part, chunk_pack, chunk[0], None, ROWS)
            out = part if out is None else out + part
        return out
    tiles = (x,) if x.shape[0] == ROWS else x.split(ROWS)  # a decode step of 1 row: one tile
    if served == 1:
        parts = [torch.ops.mkl._mkl_linear(t, packed, weight, None, ROWS) for t in tiles]
    else:
        parts = [F.linear(t, weight) for t in tiles]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class PackedProduct(torch.autograd.Function):
    """The packed product, differentiable: the forward is the inference path's (so the RL
    update's log-probs are the rollout's bits), the backward plain matrix products."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, packed: Any, served: int) -> Tensor:
        ctx.save_for_backward(x, weight)
        return run_packed(served, x, weight, packed)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None, None]:
        x, weight = ctx.saved_tensors
        return grad @ weight, grad.t() @ x, None, None


def product(
    x: Tensor, weights: tuple[Tensor, ...], packs: dict[Any, Any], kernel: int = EXACT_KERNEL
) -> Tensor:
    """x @ cat(weights).T for x (M, K), M a multiple of ROWS, by exact kernel `kernel`.
    Weights sharing an input (wq, wk, wv; w1, w3) are one product (fewer calls). The joined
    weight and its packed copy are kept in `packs` (an `ExactCache`'s, for its decode; else one
    forward's): the weights must not change while it lives, and one `packs` serves one kernel
    in one autocast state. With autograd the weights are joined afresh (the same values), so
    the gradient reaches each."""
    held = packs.get(id(weights[0]))
    if held is None:  # the kernel is decided here, once
        joined = torch.cat([w.detach() for w in weights]) if len(weights) > 1 else weights[0]
        held = packs[id(weights[0])] = (joined, *pack(joined, kernel))
    joined, served, packed = held
    if served == 2 and x.shape[0] == ROWS:
        # One tile (a decode step of 1 or 2 rows): MKL's tiles give kernel 2's chunks oneDNN's
        # very bits, at about MKL's 1-row cost where oneDNN's call costs more there.
        key = (id(weights[0]), ROWS)
        if key not in packs:
            packs[key] = tile_packs(joined)
        if packs[key] is not None:
            served, packed = 3, packs[key]
    grad = torch.is_grad_enabled() and weights[0].requires_grad
    weight = torch.cat(weights) if grad and len(weights) > 1 else joined
    if grad and served:
        return PackedProduct.apply(x, weight, packed, served)
    return run_packed(served, x, weight, packed)


def tiled_linear(
    x: Tensor, weight: Tensor, packs: dict[Any, Any], kernel: int = EXACT_KERNEL
) -> Tensor:
    """x @ weight.T (`product` of one weight)."""
    return product(x, (weight,), packs, kernel)
