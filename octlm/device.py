"""The device and number formats a run computes with, and the build its bits depend on.

One table of dtype names (`fp32`, `bf16`, `fp16`, as flags and TOML spell them) to torch dtypes,
mixed precision as autocast over FP32 weights, device resolution, and `build_info`: what
PyTorch's bitwise promise depends on (release, platform, device and its SM count, threads). And
the device's peak FLOP/s, MFU's denominator: a known GPU's table value, or what `octlm bench
peak` measured here (stored in `$OCTLM_CACHE/peak.json`, keyed by device name, dtype, torch
version and, on a CPU, the intra-op thread count, so a peak measured under another setup is
never returned).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

import torch

from octlm import numerics
from octlm.config.diff import changed_keys
from octlm.config.run import DTYPES
from octlm.errors import OctlmError
from octlm.fsutil import cache_dir

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
assert tuple(TORCH_DTYPES) == DTYPES


def resolve_device(name: str | torch.device) -> torch.device:
    """cpu, cuda, cuda:N, or auto (cuda when available); a one-line error for a missing GPU."""
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise OctlmError(f"device {name!r} is unknown", "use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise OctlmError(f"device {name} requested but CUDA is not available", "use --device cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise OctlmError(
            f"device {name} requested but MPS is not available (Apple silicon with macOS only)",
            "use --device cpu",
        )
    if device.type not in ("cpu", "cuda", "mps"):
        raise OctlmError(f"device {name!r} is not supported", "use cpu, cuda, cuda:N, mps or auto")
    return device


def fast_bf16_products(device: torch.device) -> bool:
    """Whether bf16 matrix products beat float32 ones on `device`: a GPU with bf16 tensor
    cores, or a CPU with AMX (Sapphire Rapids and later: about 3x float32 on 2 cores). Without
    AMX a CPU's bf16 products are slower, not faster: 4x with AVX-512, 75x with AVX2 only
    (oneDNN, 384 x 1024 products, 2 threads)."""
    if device.type == "cuda":
        return bf16_problem("", torch.cuda.get_device_capability(device)) is None
    if device.type == "cpu":
        # torch's own probe of the CPU (private in torch.cpu since 2.3; absent: not known fast)
        amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
        return bool(amx and amx())
    return False


def bf16_problem(name: str, capability: tuple[int, int]) -> str | None:
    """Why a GPU cannot run --dtype bf16 (tensor-core bf16 needs compute capability 8.0, Ampere
    and later: on older GPUs autocast emulates it, or fails in a kernel), or None."""
    if capability >= (8, 0):
        return None
    major, minor = capability
    return f"{name} (compute capability {major}.{minor}) has no bf16; it needs 8.0 or later"


def check_device_dtype(device: torch.device, dtype: str) -> None:
    """A one-line error for a dtype this device cannot compute in."""
    if device.type == "cuda" and dtype == "bf16":
        problem = bf16_problem(
            torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
        )
        if problem:
            raise OctlmError(problem, "use --dtype fp16 (with its loss scaler) or --dtype fp32")


def check_dtype(dtype: str) -> None:
    if dtype not in TORCH_DTYPES:
        raise OctlmError(f"dtype {dtype!r} is unknown", f"use one of {', '.join(DTYPES)}")


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """Mixed precision over FP32 weights; a no-op context for fp32."""
    low = AUTOCAST_DTYPES[dtype]
    if low is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=low)


def memory_mb(device: torch.device) -> float | None:
    """Memory for the log's step record, in MiB: on CUDA the peak allocated since the last call
    (the step's own peak: the counter is reset here), on CPU the process's resident set now."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return round(peak / 2**20, 1)
    if device.type == "mps":
        return round(torch.mps.current_allocated_memory() / 2**20, 1)
    try:  # Linux: resident pages x page size, without a syscall per field
        resident = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return round(resident * PAGE_BYTES / 2**20, 1)


def device_name(device: torch.device) -> str:
    """The GPU's name, or on CPU the processor model (Linux), else the architecture."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:  # Linux: the CPU model; platform.processor() is often empty there
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
HOST_HEAP_KEEP_BYTES = 1 << 30
"""Freed host blocks up to this size stay in the process's heap for the next step."""


def keep_freed_host_memory() -> bool:
    """Let glibc keep freed tensor buffers for reuse instead of returning them to the kernel.

    A CPU step allocates and frees the same few hundred activation buffers every step. Above
    glibc's mmap threshold each one is a fresh mapping whose pages are faulted in and zeroed
    again on first touch, which made the elementwise ops of a `small`-shaped CPU step about 5%
    of its time (bench/vs_nanogpt.py). Only where memory comes from changes: c10 still aligns
    every buffer to 64 bytes, so no kernel sees other addresses' alignment and the bits stay
    the same. The cost is a resident set that stays at its peak. False where there is no glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # macOS, musl, Windows: their allocators are left alone
        return False
    return all(
        libc.mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, HOST_HEAP_KEEP_BYTES),
            (_M_TRIM_THRESHOLD, 2 * HOST_HEAP_KEEP_BYTES),
            (_M_TOP_PAD, 64 << 20),
        )
    )


def build_info(device: torch.device) -> dict[str, Any]:
    """What PyTorch's bitwise promise depends on: release, platform, device, threads; on CUDA
    also the device's SM count and MIG slice (cuBLAS promises the same bits only on the same
    architecture with the same number of SMs, and a MIG slice has fewer SMs than its GPU).

    Stored in every checkpoint and log header; a resume on another build is noted, not refused.
    """
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else f"cpu:{platform.machine()}"
    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": name,
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "numerics": numerics.record(),
    }
    if cuda:  # absent on a CPU, as in every record written before these keys
        info["sms"] = torch.cuda.get_device_properties(device).multi_processor_count
        index = device.index if device.index is not None else torch.cuda.current_device()
        info["mig"] = mig_slice(name, os.environ.get("CUDA_VISIBLE_DEVICES"), index)
    return info


MIG_PROFILE = re.compile(r"\bMIG\s+(\d+g\.\d+gb)\b", re.IGNORECASE)


def mig_slice(name: str, visible: str | None, index: int) -> str | None:
    """The MIG slice a CUDA device is, or None for a whole GPU: its profile from the device's
    name ("NVIDIA A100-SXM4-40GB MIG 3g.20gb": "3g.20gb"), else "profile unknown" when the
    visible device at `index` is a MIG instance (CUDA_VISIBLE_DEVICES=MIG-<uuid>,...). The
    uuid itself is not recorded: another slice of the same profile computes the same bits."""
    found = MIG_PROFILE.search(name)
    if found:
        return found[1]
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    if 0 <= index < len(entries) and entries[index].startswith("MIG-"):
        return "profile unknown"
    return None


DEVICE_KEYS = ("device", "sms", "mig")
"""The build keys that say which device computed: a change is its own line (`device_change`)."""


def describe_device(build: dict[str, Any]) -> str:
    """A build's device as a resume note names it: "NVIDIA H100 80GB HBM3 (132 SMs)"."""
    extra = [f"{build['sms']} SMs"] if build.get("sms") is not None else []
    mig = build.get("mig")
    if mig is not None and mig not in str(build.get("device")):
        extra.append(f"MIG slice, {mig}")
    return f"{build.get('device')}" + (f" ({', '.join(extra)})" if extra else "")


def device_change(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """One line when the device differs: another model, or (both recorded) another SM count or
    MIG slice; None when it is the same. A record from before the SM count was kept compares by
    name only, so an old CUDA checkpoint resumed on its own GPU model is no change."""
    both = "sms" in old and "sms" in new
    keys = DEVICE_KEYS if both else ("device",)
    if all(old.get(k) == new.get(k) for k in keys):
        return None
    return (
        f"written on {describe_device(old)}, resumed on {describe_device(new)}: "
        "bits are not promised across devices"
    )


def build_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """How the build a checkpoint was written on differs from this one, where that can change
    bits: the device (`device_change`'s line, first), release, platform, thread count, MKL's
    reproducibility mode. Who set a variable, and MKL's dynamic switch (it matters only under
    load), are not differences."""
    skip = ("numerics", *DEVICE_KEYS)
    changes = changed_keys(
        {k: v for k, v in old.items() if k not in skip},
        {k: v for k, v in new.items() if k not in skip},
    )
    moved = device_change(old, new)
    bits = numerics.bits_changes(old.get("numerics"), new["numerics"])
    return ([moved] if moved else []) + changes + bits


def build_notes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """A resume's notes on the build: the device line alone (`device_change`), then the other
    changes in one line; [] on the same build."""
    moved = device_change(old, new)
    rest = [c for c in build_changes(old, new) if c != moved]
    notes = [moved] if moved else []
    if rest:
        notes.append(
            f"resuming on a different build ({'; '.join(rest)}): bitwise equality with an "
            "uninterrupted run is no longer promised"
        )
    return notes


# Dense bf16 tensor-core peaks (FLOP/s) for MFU, matched against torch.cuda.get_device_name in
# order (the first pattern that matches wins, so a variant comes before its family). Datasheet
# numbers, without sparsity; the RTX 4060 Laptop GPU's is the second seed's measured matmul rate
# (its datasheet depends on the laptop's power limit). A device not listed needs --peak-tflops
# or `octlm bench peak`.
GPU_PEAKS: tuple[tuple[str, float], ...] = (
    (r"\bH100\b.*\bPCIe\b", 756e12),
    (r"\bH100\b.*\bNVL\b", 835e12),
    (r"\bH100\b", 989e12),  # SXM ("NVIDIA H100 80GB HBM3")
    (r"\bH200\b.*\bNVL\b", 835e12),
    (r"\bH200\b", 989e12),
    (r"\bA100\b", 312e12),  # SXM4 and PCIe, 40 and 80 GB
    (r"\bL40S\b", 362e12),
    (r"\bL40\b", 181e12),
    (r"\bL4\b", 121e12),
    (r"\bRTX 4090\b", 165.2e12),
    (r"\bRTX 4060 Laptop\b", 25.3e12),
)
CACHE_NAME = "peak.json"


def peak_cache_path() -> Path:
    return cache_dir() / CACHE_NAME


def peak_cache_key(device: torch.device | str, dtype: str) -> str:
    device = resolve_device(device)
    key = f"{device.type}:{device_name(device)}|{dtype}|torch {torch.__version__}"
    if device.type == "cpu":  # a GPU's rate does not depend on the host's threads
        key += f"|threads {torch.get_num_threads()}"
    return key


def read_peak_cache() -> dict:
    """The peaks `octlm bench peak` stored, by `peak_cache_key`; {} when none is readable."""
    path = peak_cache_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # no cache yet, or an unreadable one: measured again on the next bench
    return data if isinstance(data, dict) else {}


def measured_peak(device: torch.device | str, dtype: str) -> float | None:
    """The cached FLOP/s of `octlm bench peak` for this device, dtype, torch and threads."""
    entry = read_peak_cache().get(peak_cache_key(device, dtype))
    flops = entry.get("flops") if isinstance(entry, dict) else None
    return float(flops) if isinstance(flops, (int, float)) and flops > 0 else None


def peak_flops(peak_tflops: float | None, device: torch.device, dtype: str) -> float | None:
    """The peak MFU is measured against: `peak_tflops` (--peak-tflops) if given, else the peak
    `octlm bench peak` measured on this machine, else the table of known GPUs; None (no MFU in
    the log) when none applies."""
    if peak_tflops:
        return peak_tflops * 1e12
    measured = measured_peak(device, dtype)
    if measured:
        return measured
    if device.type == "cuda":
        return table_peak(torch.cuda.get_device_name(device))
    return None


def table_peak(name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name, or None when the table does not know it."""
    return next((flops for pattern, flops in GPU_PEAKS if re.search(pattern, name)), None)
