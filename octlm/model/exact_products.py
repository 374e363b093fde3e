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
  Why the chunks: for a few rows oneDNN's call costs 30-40 us more than MKL's, and MKL's
  products add each output's products in the same order as long as both cut the inputs
  alike (checked once per shape on this machine: within 384 inputs none cuts; MKL cuts up to
  768 in halves as the chunks do, 1,024 otherwise, where a product per chunk still agrees).
  So a decode step's 2 to `FEW_ROWS` rows run on MKL's plain product over a transposed copy
  of the weight (`nn_cut`; else, for one tile, MKL's packed 2-row tiles, `tile_cut`), at
  kernel 2's very bits, and oneDNN serves the rest; a head of `PANEL_WEIGHT` elements or more
  runs its 2 rows as panels (`panel_product`: one small product per contiguous block of 32
  outputs, read once like the matrix-vector kernel's rows; `panel_cut`). On `small`
  (docs/performance.md, "Exact products") a step's products cost at 8 rows about half and at
  64 rows about a fifth of kernel 1's tiles; "Kernel 3 and MKL's few-row products" and "A head
  in panels, and packed weights kept" have what the MKL calls save a decode step.
  (Where MKL's tiles cut every weight as the chunks do, kernels 1 and 2 give the same
  bits: on this machine every weight of `tiny`, whose widest has 512 inputs.)

Outside float32 on CPU (bf16, autocast, CUDA) both kernels are a plain product per tile of
`ROWS` rows: its shape fixed, its bits its own. Every kernel pads the rows to a multiple of
`ROWS` (`padded_rows`): a lone row is 2, which both oneDNN's and MKL's checks need.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from octlm.config.rl import EXACT_KERNEL
from octlm.model.exact_kept import Stamped, stamp
from octlm.model.packed import MIN_WEIGHT, float32_cpu, onednn_linear, onednn_pack

ROWS = 2
"""Rows of kernel 1's tiles (and the multiple every kernel pads the rows to). In float32 on CPU
a tile is MKL's product with the weight packed once for 2 rows: measured at 1 thread on
`small`'s layer shapes, about what MKL's 1-row product costs."""


CHUNK = 384
"""Kernel 2's products cut a weight's inputs into parts of at most this many, each its own
product, their results added in order: within 384 inputs MKL's 2-row tile and oneDNN add in the
same order (`tile_cut`), so a decode step's tile may run on MKL's faster call for 1-2 rows."""


NOT_YET = object()
"""A packing (`Held.packed`, `Held.tiles`) not made yet: made when a call first needs it."""


def padded_rows(n: int) -> int:
    return -(-n // ROWS) * ROWS


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
def tile_cut(out: int, inp: int) -> str:
    """How MKL's packed 2-row tile gives an (out, inp) weight kernel 2's bits on this machine:
    "whole" (one tile over every input: its own cut of the inputs is the chunks'), "chunks"
    (a tile per chunk, added in order), or "none". Both kernels add each output's products
    over the inputs one after another, which gives one result whatever the kernel, until a
    kernel cuts the inputs into blocks and adds the blocks' sums (measured here: MKL's tile
    cuts 512 inputs in 2 halves, as the chunks do, and 1,024 otherwise; within 384 it does
    not cut). Orders that differ differ on random inputs (2 x `out` sums), so one draw
    decides, once per shape and process."""
    return agreeing_cut(out, inp, ROWS, "tiles")


def agreeing_cut(out: int, inp: int, rows: int, how: str) -> str:
    """`tile_cut`'s and `nn_cut`'s check: whether `run_chunks(.., how)` of `rows` random rows
    gives an (out, inp) weight the oneDNN chunks' bits over the whole weight ("whole") or a
    chunk at a time ("chunks"), else "none"."""
    if not torch.backends.mkl.is_available():
        return "none"
    generator = torch.Generator().manual_seed(out * 100_003 + inp * 101 + rows)
    weight = torch.randn(out, inp, generator=generator)
    x = torch.randn(rows, inp, generator=generator)
    parts_of = {"tiles": mkl_parts, "nn": transposed_parts, "panels": panel_parts}[how]
    try:
        want = run_chunks(x, onednn_parts(weight), "onednn")
        for cut in ("whole", "chunks"):
            if torch.equal(run_chunks(x, parts_of(weight, cut == "whole"), how), want):
                return cut
    except (RuntimeError, AttributeError):  # a build without these ops
        pass
    return "none"


def onednn_parts(weight: Tensor) -> list[tuple[int, int, Tensor]]:
    """Kernel 2's packing: (lo, hi, oneDNN's packing of the chunk) per chunk."""
    cuts = chunks(weight.shape[1])
    return [(lo, hi, onednn_pack(weight[:, lo:hi].contiguous())) for lo, hi in cuts]


def mkl_parts(weight: Tensor, whole: bool = False) -> list[tuple[int, int, Tensor, Tensor]]:
    """(lo, hi, MKL's 2-row packing, the chunk) per chunk, or for the whole weight."""
    cuts = [(0, weight.shape[1])] if whole else chunks(weight.shape[1])
    parts = [(lo, hi, weight[:, lo:hi].contiguous()) for lo, hi in cuts]
    return [(lo, hi, mkl_pack(part), part) for lo, hi, part in parts]


def mkl_pack(weight: Tensor) -> Tensor:
    return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), ROWS)


def pack(weight: Tensor, kernel: int, now: bool = True) -> tuple[int, Any]:
    """The kernel that serves `weight` on this machine (`run_packed`'s `served`) and its packed
    copy: for kernel 2 one oneDNN packing per input chunk, (lo, hi, packed), or with `now`
    False `NOT_YET` (packed when a call first needs it: a decode's few rows may never)."""
    if not float32_cpu(weight):
        return 0, None
    if kernel >= 2 and rows_invariant():
        return 2, onednn_parts(weight) if now else NOT_YET
    if torch.backends.mkl.is_available():
        return 1, mkl_pack(weight)
    return 0, None


def tile_packs(weight: Tensor) -> list[tuple[int, int, Tensor, Tensor]] | None:
    """Kernel 2's product as MKL's 2-row tiles of the same bits (`tile_cut`), or None."""
    cut = tile_cut(*weight.shape)
    return None if cut == "none" else mkl_parts(weight, whole=cut == "whole")


def run_chunks(x: Tensor, parts: list[tuple], how: str) -> Tensor:
    """Kernel 2: each chunk's product, by oneDNN ("onednn", `pack`'s parts), by MKL's tiles of
    the same bits ("tiles", `tile_packs`' parts, for one tile of rows) or by MKL's product over
    the chunk's transposed copy ("nn", `transposed_parts`, for a few rows where it agrees),
    added in chunk order (a left fold: the same additions whichever way)."""
    one = len(parts) == 1
    out = None
    for part in parts:
        # "nn" reads the strided slice in place: the same bits (`nn_cut` checks this code).
        rows = x if one else x[:, part[0] : part[1]]
        if how in ("onednn", "tiles", "panels") and not one:
            rows = rows.contiguous()
        if how == "tiles":
            y = torch.ops.mkl._mkl_linear(rows, part[2], part[3], None, ROWS)
        elif how == "nn":
            y = rows @ part[2]
        elif how == "panels":
            y = panel_product(rows, part[2])
        else:
            y = onednn_linear(rows, part[2])
        out = y if out is None else out + y
    return out


def transposed_parts(weight: Tensor, whole: bool = False) -> list[tuple[int, int, Tensor]]:
    """(lo, hi, the chunk transposed: (inputs, outputs), contiguous) per chunk of kernel 2, or
    for the whole weight."""
    cuts = [(0, weight.shape[1])] if whole else chunks(weight.shape[1])
    return [(lo, hi, weight.detach()[:, lo:hi].t().contiguous()) for lo, hi in cuts]


PANEL = 32
"""Outputs per panel of `panel_parts`: MKL's small products (M x K by K x 32, B contiguous) run
without packing, where 64 and more outputs a panel are packed on every call (measured at 1
thread on `small`'s head: 16 and 32 cost about the same, 64 a third more)."""


def panel_parts(weight: Tensor, whole: bool = False) -> list[tuple[int, int, Tensor]]:
    """(lo, hi, the chunk as panels: (outputs / `PANEL`, inputs, `PANEL`), contiguous) per chunk
    of kernel 2, or for the whole weight; its outputs whole panels (`panel_cut` checks)."""
    cuts = [(0, weight.shape[1])] if whole else chunks(weight.shape[1])
    return [(lo, hi, as_panels(weight.detach()[:, lo:hi])) for lo, hi in cuts]


def as_panels(weight: Tensor) -> Tensor:
    """weight (out, in) as (out / `PANEL`, in, `PANEL`): panel p holds outputs p * PANEL.. as
    columns, one copy."""
    return weight.unflatten(0, (-1, PANEL)).transpose(1, 2).contiguous()


def panel_product(x: Tensor, panels: Tensor) -> Tensor:
    """x @ W.T for W held as `as_panels`: one small product per panel in one batched call, each
    panel read once from one contiguous block (as the matrix-vector kernel reads a row). On
    this machine MKL adds a panel's products over the inputs one after another, as the chunks
    do, at 2 to 16 rows (`panel_cut` checks it)."""
    y = torch.bmm(x.unsqueeze(0).expand(panels.shape[0], -1, -1), panels)
    return y.transpose(0, 1).reshape(x.shape[0], -1)


@functools.cache
def panel_cut(out: int, inp: int, rows: int, threads: int) -> str:
    """`nn_cut` for `panel_product`: "whole", "chunks" or "none" (outputs not whole panels)."""
    if out % PANEL:
        return "none"
    return agreeing_cut(out, inp, rows, "panels")


@functools.cache
def nn_cut(out: int, inp: int, rows: int, threads: int) -> str:
    """How MKL's product of `rows` rows by a transposed weight gives an (out, inp) weight
    kernel 2's bits on this machine at `threads` threads: "whole" (one product over every
    input), "chunks" (one per chunk, added in order) or "none". Measured here (AVX-512 MKL,
    every weight of `tiny` and `small`, 2 to 16 rows): MKL's matrix kernels add a chunk's
    products over the inputs one after another, as oneDNN's do, and cut up to 768 inputs in
    halves as the chunks do (1,024 otherwise: there a product per chunk agrees); at 1 row
    (MKL's matrix-vector product) nothing agrees, which is why a lone row is padded to
    `ROWS`. Another MKL may pick another order by the row count: one random draw per shape,
    row count and thread count decides (orders that differ differ on it), once per process."""
    return agreeing_cut(out, inp, rows, "nn")


WAYS = ("onednn", "tiles", "nn", "panels")  # `run_chunks`' ways, served as codes 2, 3, ...


def run_packed(served: int, x: Tensor, weight: Tensor, packed: Any) -> Tensor:
    """x @ weight.T by the kernel `pack` chose: kernel 2's chunks by oneDNN (2), MKL's tiles of
    the same bits (3), MKL's product of the same bits over transposed chunks (4) or over panels
    (5); kernel 1's MKL tiles (1); plain tiles (0)."""
    if served >= 2:
        return run_chunks(x, packed, WAYS[served - 2])
    tiles = (x,) if x.shape[0] == ROWS else x.split(ROWS)  # a decode step of 1 row: one tile
    if served == 1:
        parts = [torch.ops.mkl._mkl_linear(t, packed, weight, None, ROWS) for t in tiles]
    else:
        parts = [F.linear(t, weight) for t in tiles]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


FEW_ROWS = 16
"""Up to this many rows (a decode step's batch), kernel 2 may run on MKL's calls of the same
bits (`few_rows`); from there on oneDNN's one call per chunk serves."""


@dataclass(slots=True)
class Held:
    """One weight's (or joined weights') packing for a `packs` dict's life (for `Stamped` packs:
    while the weights keep their `stamp`; else empty)."""

    stamp: tuple[int, ...]
    joined: Tensor
    served: int
    packed: Any
    tiles: Any = NOT_YET
    """`tile_packs` of the joined weight (None: none agree), made when a single tile of rows
    first asks (kernel 2)."""
    cuts: dict[tuple[str, str], Any] = field(default_factory=dict)
    """`cut_parts` of the joined weight by (way, cut), made when a few rows first ask."""


def few_rows(held: Held, rows: int) -> tuple[int, Any]:
    """Kernel 2's cheapest call of its very bits for `rows` (at most `FEW_ROWS`): the served
    code and parts `run_packed` takes. oneDNN's call costs 30-40 us more than MKL's on a small
    weight, which a few rows never win back. Measured at 1 thread over a decode step's products in
    order (docs/performance.md, "Kernel 3 and MKL's few-row products" and "A head in panels, and
    packed weights kept"): MKL's product over the transposed chunks costs about two thirds of
    oneDNN's at 2 to 16 rows on `tiny` and at 2 rows on `small`; at 2 rows, for a weight of
    `MIN_WEIGHT` elements or more (`small`'s w1|w3, `tiny`'s head), MKL's tiles over a weight
    packed once cost less again (the plain product repacks the weight every call), and a head of
    `PANEL_WEIGHT` elements or more (`small`'s) streams best as panels, about 20% cheaper than the
    tiles; from 4 rows on, a weight of `MIN_WEIGHT` elements or more streams better through
    oneDNN's packing, whose cost per row is lower. Each way runs only where its check (`tile_cut`,
    `nn_cut`, `panel_cut`) found kernel 2's bits on this machine."""
    size = held.joined.numel()
    if rows == ROWS and size >= PANEL_WEIGHT:
        order = ("panels", "tiles", "nn")
    elif rows == ROWS:
        order = ("tiles", "nn") if size >= MIN_WEIGHT else ("nn", "tiles")
    else:
        order = () if size >= MIN_WEIGHT else ("nn",)
    for way in order:
        found = tiles_of(held) if way == "tiles" else cut_parts(held, rows, way)
        if found is not None:
            return 2 + WAYS.index(way), found
    return held.served, onednn_of(held)


PANEL_WEIGHT = 1 << 22
"""Fewest elements a weight runs as panels (`panel_product`) at 2 rows: a head like `small`'s
(32768 x 384, 12.6 M). Below it MKL's tiles cost less (measured on `small`'s w1|w3, 2048 x 384,
and `tiny`'s head, 8192 x 256: 2.1 M)."""


def onednn_of(held: Held) -> Any:
    """The held weight's packing for its kernel, made on first ask (kernel 2's oneDNN chunks)."""
    if held.packed is NOT_YET:
        held.packed = onednn_parts(held.joined)
    return held.packed


def tiles_of(held: Held) -> Any:
    """`tile_packs` of the held weight, made on first ask (None where no cut agrees)."""
    if held.tiles is NOT_YET:
        held.tiles = tile_packs(held.joined)
    return held.tiles


def cut_parts(held: Held, rows: int, way: str) -> Any:
    """The held weight's parts for `way` ("nn": `transposed_parts` by `nn_cut`, "panels":
    `panel_parts` by `panel_cut`) at `rows`, made on first ask (None where no cut agrees)."""
    check, make = (nn_cut, transposed_parts) if way == "nn" else (panel_cut, panel_parts)
    cut = check(*held.joined.shape, rows, torch.get_num_threads())
    if cut == "none":
        return None
    if (way, cut) not in held.cuts:
        held.cuts[way, cut] = make(held.joined, cut == "whole")
    return held.cuts[way, cut]


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
    """x @ cat(weights).T for x (M, K), M a multiple of ROWS, by exact kernel `kernel`. Weights
    sharing an input (wq, wk, wv; w1, w3) are one product (fewer calls). The joined weight and its
    packed copy are kept in `packs` (a kept model's, `octlm/model/exact_kept.py`; an
    `ExactCache`'s, for its decode; else one forward's) while the weights keep their `stamp`, and
    are made again once a weight was replaced or changed in a counted write (a kept model's
    `Kept.probe` drops them all after an uncounted one, a fused optimizer's step). One `packs`
    serves one kernel in one autocast state. With autograd the weights are joined afresh (the same
    values), so the gradient reaches each."""
    held = packs.get(id(weights[0]))
    now = stamp(weights) if isinstance(packs, Stamped) else ()
    if held is None or held.stamp != now:  # the kernel is decided here, once
        joined = torch.cat([w.detach() for w in weights]) if len(weights) > 1 else weights[0]
        held = packs[id(weights[0])] = Held(now, joined, *pack(joined, kernel, now=False))
    served, packed = held.served, held.packed
    if served == 2 and x.shape[0] <= FEW_ROWS:  # a decode step's rows: MKL's calls, same bits
        served, packed = few_rows(held, x.shape[0])
    elif served == 2:
        packed = onednn_of(held)
    grad = torch.is_grad_enabled() and weights[0].requires_grad
    weight = torch.cat(weights) if grad and len(weights) > 1 else held.joined
    if grad and served:
        return PackedProduct.apply(x, weight, packed, served)
    return run_packed(served, x, weight, packed)


def tiled_linear(
    x: Tensor, weight: Tensor, packs: dict[Any, Any], kernel: int = EXACT_KERNEL
) -> Tensor:
    """x @ weight.T (`product` of one weight)."""
    return product(x, (weight,), packs, kernel)
