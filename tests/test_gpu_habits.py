"""The GPU habits that can be checked without one: the MFU peak table by exact device names,
bf16 refused on a GPU without it, MPS refused where it is missing, memory in the step record."""

from __future__ import annotations

import mmap
import re
from pathlib import Path

import pytest
import torch

from octlm.device import bf16_problem, memory_mb, resolve_device, table_peak
from octlm.errors import OctlmError


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989),  # SXM
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H100 NVL", 835),
        ("NVIDIA H200", 989),
        ("NVIDIA H200 NVL", 835),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA A100-PCIE-40GB", 312),
        ("NVIDIA A100 80GB PCIe", 312),
        ("NVIDIA L4", 121),
        ("NVIDIA L40S", 362),
        ("NVIDIA L40", 181),
        ("NVIDIA GeForce RTX 4090", 165.2),
        ("NVIDIA GeForce RTX 4060 Laptop GPU", 25.3),  # the second seed's measured rate
    ],
)
def test_the_peak_table_matches_exact_device_names(name: str, tflops: float) -> None:
    assert table_peak(name) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4060", "Tesla V100-SXM2-16GB", "NVIDIA L4X"])
def test_a_device_the_table_does_not_know_has_no_peak(name: str) -> None:
    assert table_peak(name) is None


def test_bf16_needs_compute_capability_8() -> None:
    assert bf16_problem("NVIDIA A100-SXM4-80GB", (8, 0)) is None
    assert bf16_problem("NVIDIA H100 PCIe", (9, 0)) is None
    problem = bf16_problem("Tesla T4", (7, 5))
    assert problem == "Tesla T4 (compute capability 7.5) has no bf16; it needs 8.0 or later"


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")
def test_mps_where_there_is_none_is_one_line() -> None:
    with pytest.raises(OctlmError, match="MPS is not available") as info:
        resolve_device("mps")
    assert "\n" not in str(info.value) and "--device cpu" in str(info.value)


def test_an_unsupported_device_type_is_one_line() -> None:
    with pytest.raises(OctlmError, match="is not supported"):
        resolve_device("meta")


def test_cpu_memory_is_the_resident_set() -> None:
    before = memory_mb(torch.device("cpu"))
    # A new anonymous mapping, every page touched: an allocator could hand back pages a test
    # before this one freed but kept resident (a torch tensor did, under xdist: +39 MiB of 64).
    block = mmap.mmap(-1, 64 * 2**20)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    after = memory_mb(torch.device("cpu"))
    assert before is not None and after is not None
    assert after - before > 50
    status = Path("/proc/self/status").read_text()
    vm_rss = int(re.search(r"VmRSS:\s+(\d+) kB", status)[1]) / 1024
    assert abs(vm_rss - after) < 16  # the resident set as the kernel reports it
    block.close()
