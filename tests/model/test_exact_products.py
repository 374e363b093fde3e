"""The exact path's product kernels (octlm/model/exact_products.py): kernel 2 (oneDNN's product
over a packed weight, all rows in one call) gives a row the same bits at any row count and
offset, on the shapes `tiny` and `small` run; each kernel keeps the exact path's promise (a
cached decode is the full forward's bits); the two kernels give different bits (so the version
an RL run records decides its draws); the same bits at 1 and 2 threads; and where oneDNN's
check fails (its pre-AVX2 code, forced here) kernel 2 is kernel 1's tiles, still exact."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from octlm.config.shape import preset
from octlm.model.exact import ExactCache, forward_exact
from octlm.model.exact_products import (
    CHUNK,
    ROWS,
    chunks,
    mkl_parts,
    nn_cut,
    onednn_parts,
    pack,
    panel_cut,
    panel_parts,
    product,
    rows_invariant,
    run_chunks,
    tile_cut,
    transposed_parts,
)
from octlm.model.gpt import GPT

SHAPES = [(1152, 384), (384, 384), (4096, 384), (384, 1024), (32768, 384), (576, 192), (100, 37)]
"""(out, in) of `small`'s joined q/k/v, output, joined w1/w3 and w2 products and its head, one
of `tiny`'s, and an odd one."""
ROW_COUNTS = (1, 2, 3, 5, 8, 9, 16, 17, 33, 64, 65, 127, 300, 512, 1024)


def rows_of(x: torch.Tensor, weight: torch.Tensor, packs: dict) -> torch.Tensor:
    """The exact path's product of x's rows (padded to a whole tile, as `forward_exact` pads)."""
    short = -len(x) % ROWS
    return product(F.pad(x, (0, 0, 0, short)), (weight,), packs, 2)[: len(x)]


@torch.no_grad()
def test_kernel_2_gives_a_row_its_bits_at_any_row_count_and_offset() -> None:
    """Through `product`, as the exact path calls it: MKL's calls of the same bits for up to
    `FEW_ROWS` rows where they agree (a transposed weight's product, or for one tile MKL's
    2-row tiles), oneDNN's chunks beyond."""
    generator = torch.Generator().manual_seed(0)
    plain_differs = False
    for out, inp in SHAPES:
        weight = torch.randn(out, inp, generator=generator)
        # The head (32768 x 384) up to 127 rows (its products cost 30x a layer's); the others
        # up to 1,024.
        x = torch.randn(1024 if out * inp < 1 << 22 else 128, inp, generator=generator)
        served, _ = pack(weight, 2)
        assert served == (2 if rows_invariant() else 1)  # where oneDNN fails: kernel 1's tiles
        packs: dict = {}
        whole = rows_of(x, weight, packs)
        for rows in (r for r in ROW_COUNTS if r <= len(x)):
            for start in sorted({0, 1, (len(x) - rows) // 2}):
                part = rows_of(x[start : start + rows], weight, packs)
                assert torch.equal(part, whole[start : start + rows]), (out, inp, rows, start)
        # The control: PyTorch's own product picks its kernel by the row count.
        plain = F.linear(x, weight)
        plain_differs |= not torch.equal(F.linear(x[:1], weight), plain[:1])
    assert plain_differs, "F.linear held a row's bits: a weak control"


def test_kernel_2_cuts_the_inputs_into_equal_chunks_of_at_most_384() -> None:
    assert chunks(384) == [(0, 384)] and chunks(37) == [(0, 37)]
    assert chunks(1024) == [(0, 342), (342, 684), (684, 1024)]
    assert chunks(512) == [(0, 256), (256, 512)] and CHUNK == 384


def small_model(seed: int = 0, **shape) -> GPT:
    torch.manual_seed(seed)
    return GPT(preset("tiny", context=140, **shape)).eval()


@pytest.mark.parametrize("kernel", [1, 2, 3])
@torch.no_grad()
def test_each_kernel_decodes_the_full_forwards_bits(kernel) -> None:
    model = small_model()
    ids = torch.randint(0, 4096, (3, 140), generator=torch.Generator().manual_seed(1))
    full = forward_exact(model, ids, kernel=kernel)
    cache = ExactCache(model, 3, kernel)
    parts = [forward_exact(model, ids[:, :70], cache)]
    for at in range(70, 140):
        parts.append(forward_exact(model, ids[:, at : at + 1], cache, torch.full((3,), at)))
    assert torch.equal(torch.cat(parts, dim=1), full)
    # A full forward of whole key tiles (no padding: its keys a strided view) is a prefix's bits.
    assert torch.equal(forward_exact(model, ids[:, :128], kernel=kernel), full[:, :128])


@torch.no_grad()
def test_the_kernels_give_other_bits_and_the_same_at_one_and_two_threads() -> None:
    """A hidden width of 1,000: w2's 1,000 inputs are 3 chunks of kernel 2, which MKL's tiles
    (kernel 1) cut otherwise. (With `tiny`'s 512 they cut them alike: the same bits.)"""
    model = small_model(d_ff=1000)
    ids = torch.randint(0, 4096, (4, 100), generator=torch.Generator().manual_seed(2))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [forward_exact(model, ids, kernel=k) for k in (1, 2, 3)]
        torch.set_num_threads(2)
        two = [forward_exact(model, ids, kernel=k) for k in (1, 2, 3)]
        decoded = []  # and kernels 2 and 3's decode (its few-row products) at 2 threads
        for kernel in (2, 3):
            cache = ExactCache(model, 1, kernel)
            parts = [forward_exact(model, ids[:1, :90], cache)]
            for at in range(90, 100):
                parts.append(forward_exact(model, ids[:1, at : at + 1], cache, torch.tensor([at])))
            decoded.append(torch.cat(parts, dim=1))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
    assert torch.equal(decoded[0], one[1][:1]) and torch.equal(decoded[1], one[2][:1])
    # The control: another kernel, other bits (where oneDNN serves); the same values near.
    assert torch.equal(one[0], one[1]) is not rows_invariant()
    assert torch.allclose(one[0], one[1], atol=1e-4)
    # Kernel 3's attention adds in other orders than kernels 1-2's, over the same products.
    assert not torch.equal(one[1], one[2]) and torch.allclose(one[1], one[2], atol=1e-4)


@pytest.mark.slow  # a fresh interpreter: oneDNN reads its ISA limit when it starts
def test_where_onednn_fails_the_check_kernel_2_is_kernel_1s_tiles_and_still_exact() -> None:
    """oneDNN's AVX (pre-AVX2) code picks its blocking by the row count: forced here, the check
    fails and kernel 2 serves as kernel 1 does (its bits, its exactness)."""
    script = """
import torch
from octlm.config.shape import preset
from octlm.model.exact import ExactCache, forward_exact
from octlm.model.exact_products import rows_invariant
from octlm.model.gpt import GPT
torch.manual_seed(0)
model = GPT(preset("tiny", context=80)).eval()
ids = torch.randint(0, 4096, (2, 80))
with torch.no_grad():
    full = forward_exact(model, ids, kernel=2)
    cache = ExactCache(model, 2, 2)
    parts = [forward_exact(model, ids[:, :40], cache)]
    for t in range(40, 80):
        parts.append(forward_exact(model, ids[:, t : t + 1], cache, torch.full((2,), t)))
    print(rows_invariant(), torch.equal(full, forward_exact(model, ids, kernel=1)),
          torch.equal(torch.cat(parts, dim=1), full))
"""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "True"], proc.stdout


@torch.no_grad()
@pytest.mark.parametrize("threads", [1, 2])
def test_each_few_row_way_its_check_admits_gives_fresh_rows_kernel_2s_bits(threads) -> None:
    """`few_rows`' ways (MKL's tiles, its product over the transposed weight, panels) run only
    where a check on one random draw found the oneDNN chunks' bits: on fresh rows and a fresh
    weight of each shape they must give those bits too, at 1 and 2 threads. The control: a
    weight whose outputs are not whole panels has no panels."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(5)
        admitted = 0
        for out, inp in [(1152, 384), (384, 1024), (32768, 384), (576, 192)]:
            weight = torch.randn(out, inp, generator=generator)
            want_parts = onednn_parts(weight)
            for rows in (2, 3, 8, 16):
                x = torch.randn(rows, inp, generator=generator)
                want = run_chunks(x, want_parts, "onednn")
                cuts = {
                    "tiles": tile_cut(out, inp) if rows == ROWS else "none",
                    "nn": nn_cut(out, inp, rows, threads),
                    "panels": panel_cut(out, inp, rows, threads),
                }
                makers = {"tiles": mkl_parts, "nn": transposed_parts, "panels": panel_parts}
                for way, cut in cuts.items():
                    if cut != "none":
                        got = run_chunks(x, makers[way](weight, cut == "whole"), way)
                        assert torch.equal(got, want), (way, cut, out, inp, rows, threads)
                        admitted += 1
        assert admitted, "no way was admitted: the test checked nothing"
        assert panel_cut(100, 37, ROWS, threads) == "none"
    finally:
        torch.set_num_threads(before)
