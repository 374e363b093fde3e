"""`octlm bench peak`: a quick measurement is plausible, the cache round-trips, and its key
follows the thread count (a rate measured with other threads is never returned).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from octlm.device import measured_peak, peak_cache_key, peak_cache_path
from octlm.errors import OctlmError
from octlm.tools.peak import GPU_SIZES, SIZES, default_sizes, measure_peak, store_peak


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OCTLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "peak.json"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_measurement_is_quick_and_plausible(dtype: str) -> None:
    t0 = time.perf_counter()
    r = measure_peak("cpu", dtype, seconds=0.4)
    assert time.perf_counter() - t0 < 3.0
    assert r.flops > 1e8 and r.flops == max(r.by_size.values()) == r.by_size[r.size]
    assert set(r.by_size) <= set(SIZES) and SIZES[0] in r.by_size
    assert r.key == peak_cache_key("cpu", dtype)


def test_cache_round_trip(cache: Path) -> None:
    assert peak_cache_path() == cache
    assert measured_peak("cpu", "fp32") is None  # nothing measured yet
    r = measure_peak("cpu", "fp32", seconds=0.2, sizes=(256,))
    assert store_peak(r) == cache
    assert measured_peak("cpu", "fp32") == r.flops
    assert measured_peak("cpu", "bf16") is None  # another dtype, another entry
    r16 = measure_peak("cpu", "bf16", seconds=0.2, sizes=(256,))
    store_peak(r16)
    assert measured_peak("cpu", "fp32") == r.flops  # the first entry survives the second
    assert measured_peak("cpu", "bf16") == r16.flops
    assert set(json.loads(cache.read_text())) == {r.key, r16.key}
    cache.write_text("{ not json")
    assert measured_peak("cpu", "fp32") is None  # unreadable: as if never measured
    store_peak(r)
    assert measured_peak("cpu", "fp32") == r.flops


def test_key_follows_threads(cache: Path) -> None:
    before = torch.get_num_threads()
    store_peak(measure_peak("cpu", "fp32", seconds=0.1, sizes=(128,)))
    key = peak_cache_key("cpu", "fp32")
    assert f"threads {before}" in key and torch.__version__ in key and "|fp32|" in key
    try:
        torch.set_num_threads(before + 1)
        assert peak_cache_key("cpu", "fp32") != key
        assert measured_peak("cpu", "fp32") is None
    finally:
        torch.set_num_threads(before)
    assert measured_peak("cpu", "fp32") is not None


def test_bad_requests() -> None:
    with pytest.raises(OctlmError):
        measure_peak("cpu", "fp8", seconds=0.1)
    with pytest.raises(OctlmError):
        measure_peak("cpu", "fp32", seconds=0)


@pytest.mark.slow
def test_cli(cache: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "octlm", "bench", "peak", "--seconds", "0.4", "--dtype", "fp32",
         "--device", "cpu"],
        capture_output=True, text=True, env=dict(os.environ), timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "FLOP/s" in proc.stdout and str(cache) in proc.stdout
    # The subprocess inherits OMP_NUM_THREADS from conftest, so its key is this process's key.
    assert measured_peak("cpu", "fp32") > 1e8


def test_a_gpu_is_timed_on_products_large_enough_to_hide_the_launch() -> None:
    # On an H200, 2048 x 2048 products reached 420 TFLOP/s and 8192 x 8192 about 790.
    assert default_sizes(torch.device("cpu")) == SIZES
    assert default_sizes(torch.device("cuda", 0)) == GPU_SIZES
    assert max(GPU_SIZES) >= 8192
