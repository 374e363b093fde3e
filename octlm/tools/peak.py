"""`octlm bench peak`: this machine's measured matmul rate, stored for MFU.

Square matmuls of a few sizes, best of repeats, 2 n^3 FLOPs each. The result is stored in
`$OCTLM_CACHE/peak.json` (default ~/.cache/octlm), keyed by device name, dtype, torch version
and (on CPU) the intra-op thread count, so `octlm.device.measured_peak` never returns another
setup's rate.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from octlm.config import checks
from octlm.device import (
    TORCH_DTYPES,
    check_dtype,
    peak_cache_key,
    peak_cache_path,
    read_peak_cache,
    resolve_device,
)
from octlm.errors import OctlmError
from octlm.fsutil import atomic_write_bytes

SIZES = (512, 1024, 2048)
"""A CPU's: 2048 already takes most of a second on 2 cores."""
GPU_SIZES = (2048, 4096, 8192)
"""A GPU's: on an H200, 2048 x 2048 products (22 us each) measured 420 TFLOP/s, half of what
8192 reaches (about 790): the smaller sizes time the launch, and MFU came out twice too high."""


SECONDS = checks.Number(0, 3600, lo_open=True)
"""The time budget: a rate settles within seconds (best of repeats); an hour is far past any
use, and more is a slip (milliseconds typed as seconds) that would hold the machine. NaN used to
never end the loop (no deadline compares true with NaN)."""


@dataclass(frozen=True)
class PeakResult:
    key: str
    flops: float
    """Best FLOP/s over all sizes and repeats."""
    size: int
    """The matmul size that reached it."""
    by_size: dict[int, float]
    seconds: float
    """Wall time the measurement took."""


def _check(device: torch.device, dtype: str) -> None:
    check_dtype(dtype)
    if device.type not in ("cpu", "cuda"):
        raise OctlmError(f"device {device} is not supported here", "use cpu or cuda")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def default_sizes(device: torch.device) -> tuple[int, ...]:
    return SIZES if device.type == "cpu" else GPU_SIZES


def measure_peak(
    device: torch.device | str,
    dtype: str,
    seconds: float = 5.0,
    sizes: tuple[int, ...] | None = None,
) -> PeakResult:
    """Best matmul FLOP/s within about `seconds`, shared among the sizes (smallest first;
    default: SIZES on a CPU, GPU_SIZES on a GPU).

    A size whose single matmul would not fit in the time left (predicted from the best rate so
    far) is skipped, so a short budget on a slow dtype still returns quickly.
    """
    checks.check("--seconds", seconds, SECONDS, "use --seconds 5 (the default) or up to 3600")
    check_dtype(dtype)
    device = resolve_device(device)
    _check(device, dtype)
    sizes = default_sizes(device) if sizes is None else sizes
    start = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(0)
    by_size: dict[int, float] = {}
    best_rate = 0.0
    for i, n in enumerate(sizes):
        flop = 2.0 * n**3
        left = seconds - (time.perf_counter() - start)
        if by_size and 2 * flop / best_rate > left:
            break  # its warm-up and one timed run would overrun; larger sizes even more so
        a = torch.randn(n, n, device=device, generator=gen).to(TORCH_DTYPES[dtype])
        b = torch.randn(n, n, device=device, generator=gen).to(TORCH_DTYPES[dtype])
        torch.matmul(a, b)  # warm-up: kernel selection, thread pool, caches
        _sync(device)
        deadline = time.perf_counter() + left / (len(sizes) - i)
        best = float("inf")
        while True:  # at least one timed run, then more while the next one fits
            t0 = time.perf_counter()
            torch.matmul(a, b)
            _sync(device)
            best = min(best, time.perf_counter() - t0)
            if time.perf_counter() + best > deadline:
                break
        by_size[n] = flop / best
        best_rate = max(best_rate, by_size[n])
    size = max(by_size, key=by_size.__getitem__)
    return PeakResult(
        peak_cache_key(device, dtype), by_size[size], size, by_size, time.perf_counter() - start
    )


def store_peak(result: PeakResult) -> Path:
    path = peak_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = read_peak_cache()
    entry = asdict(result)
    entry["by_size"] = {str(k): v for k, v in result.by_size.items()}
    entry["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    data[result.key] = entry
    atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
    return path


def format_peak(result: PeakResult, path: Path) -> str:
    sizes = "  ".join(f"{n}: {r / 1e9:,.1f}" for n, r in result.by_size.items())
    return (
        f"{result.key}\npeak {result.flops / 1e12:.4g} TFLOP/s ({result.flops:.4g} FLOP/s) at "
        f"n={result.size}; GFLOP/s by size  {sizes}  ({result.seconds:.1f} s)\nstored in {path}"
    )
