"""The device and number formats a run computes with, and the build its bits depend on.

One table of dtype names (`fp32`, `bf16`, `fp16`, as flags and TOML spell them) to torch dtypes,
mixed precision as autocast over FP32 weights, device resolution, and `build_info`: what
PyTorch's bitwise promise depends on (release, platform, device, threads).
"""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path
from typing import Any

import torch

from octlm.config import DTYPES
from octlm.errors import OctlmError

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
    return device


def check_dtype(dtype: str) -> None:
    if dtype not in TORCH_DTYPES:
        raise OctlmError(f"dtype {dtype!r} is unknown", f"use one of {', '.join(DTYPES)}")


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """Mixed precision over FP32 weights; a no-op context for fp32."""
    low = AUTOCAST_DTYPES[dtype]
    if low is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=low)


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


def build_info(device: torch.device) -> dict[str, Any]:
    """What PyTorch's bitwise promise depends on: release, platform, device, threads.

    Stored in every checkpoint and log header; a resume on another build is noted, not refused.
    """
    cuda = device.type == "cuda"
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu:{platform.machine()}",
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }
