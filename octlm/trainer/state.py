"""Counters of a run, every random generator a resume must restore, how they are seeded, and
the process-wide determinism switches a run sets (`configure_determinism`).

RNG states are converted to tensors (torch CPU/CUDA byte states) and JSON-safe lists (Python's
Mersenne Twister, NumPy's global generator), so a checkpoint never needs pickle.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class TrainState:
    step: int = 0
    """Optimizer steps completed, which is also the 0-based index of the next one. The only
    step counter of a run: the data order and the schedule are functions of it."""
    tokens: int = 0
    """Training tokens consumed (all targets, PAD included)."""
    elapsed: float = 0.0
    """Seconds spent in training across all sessions."""
    skipped_steps: int = 0
    """Steps an fp16 GradScaler skipped for inf/nan gradients."""

    def advance(self, tokens: int, skipped: bool) -> None:
        """One optimizer step done (applied or skipped)."""
        self.step += 1
        self.tokens += tokens
        self.skipped_steps += int(skipped)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tokens": self.tokens,
            "elapsed": self.elapsed,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.tokens = int(state["tokens"])
        self.elapsed = float(state["elapsed"])
        self.skipped_steps = int(state.get("skipped_steps", 0))


def rng_state_dict() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU and CUDA generator states (JSON values for the
    first two, byte tensors for torch's)."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    n_cuda = torch.cuda.device_count() if torch.cuda.is_initialized() else 0
    state: dict[str, Any] = {
        "python": [version, list(mt), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "cuda_devices": n_cuda,
        "torch_cpu": torch.get_rng_state(),
    }
    for i in range(n_cuda):
        state[f"cuda_{i}"] = torch.cuda.get_rng_state(i)
    return state


def load_rng_state_dict(state: dict[str, Any]) -> None:
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch_cpu"])
    for i in range(state.get("cuda_devices", 0)):
        if i < torch.cuda.device_count():
            torch.cuda.set_rng_state(state[f"cuda_{i}"], i)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


_BEFORE: dict[str, Any] = {}
"""Each process-wide switch as it was before a run of this process first set it: a part a later
run leaves off goes back to it (a bench or a notebook builds runs with other parts in turn)."""


def switch(
    name: str, on: bool, read: Callable[[], Any], write: Callable[[Any], None], value: Any
) -> None:
    """Set switch `name` to `value` for a run that turns it on, or back to what it was before
    the first run that did; one never set is left alone (a run without the part touches
    nothing, as before the parts existed)."""
    if on:
        _BEFORE.setdefault(name, read())
        write(value)
    elif name in _BEFORE:
        write(_BEFORE[name])


def configure_determinism(parts: Collection[str], device: torch.device) -> None:
    """The parts of --deterministic this run turns on (`DETERMINISM_PARTS`), each on or back off.

    - algorithms: `torch.use_deterministic_algorithms(True)` (nondeterministic kernels switch to
      deterministic ones, or raise), and on CUDA the fixed cuBLAS workspace it needs and cuDNN
      without benchmarking; torch's call also turns on Inductor's deterministic mode, which is
      put back here (that is the inductor part's).
    - attention, on CUDA: SDPA through backends whose backward is deterministic. torch's flash
      and memory-efficient backwards accumulate dQ over key blocks with atomics (nondeterministic)
      unless `use_deterministic_algorithms` is on, and cuDNN's SDPA has no deterministic
      backward (torch refuses it under that switch): alone this part leaves the math backend
      (matrix products and a softmax, the same bits each time, O(T^2) memory); beside
      algorithms, which already makes flash's own backward deterministic, it changes nothing.
      On a CPU nothing: the CPU's kernels are chosen by these same switches, and already repeat.
    - inductor: `torch._inductor.config.deterministic`: --compile's kernels chosen without
      timing them on the device (no autotuned reduction configs, no benchmarked padding).
    """
    cuda = device.type == "cuda"
    algorithms = "algorithms" in parts
    switch(
        "cublas_workspace",
        algorithms and cuda,
        lambda: os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        set_cublas_workspace,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),  # the user's own value kept
    )
    switch("cudnn", algorithms and cuda, read_cudnn, write_cudnn, (False, True))
    switch("algorithms", algorithms, read_algorithms, write_algorithms, (True, False))
    attention = "attention" in parts and not algorithms and cuda
    switch("attention", attention, read_sdp, write_sdp, (False, False, False, True))
    switch("inductor", "inductor" in parts, read_inductor, write_inductor, True)


def set_cublas_workspace(value: str | None) -> None:
    """cuBLAS picks reproducible reduction orders only with a fixed workspace (read by torch
    when it first makes a cuBLAS handle, so a process's first CUDA run decides)."""
    if value is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = value


def read_cudnn() -> tuple[bool, bool]:
    return torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic


def write_cudnn(value: tuple[bool, bool]) -> None:
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = value


def read_algorithms() -> tuple[bool, bool]:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )


def write_algorithms(value: tuple[bool, bool]) -> None:
    """`use_deterministic_algorithms`, Inductor's deterministic mode kept as it was (torch's
    call sets it too; it is the inductor part's)."""
    kept = read_inductor()
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])
    write_inductor(kept)


def read_sdp() -> tuple[bool, bool, bool, bool]:
    cuda = torch.backends.cuda
    return (
        cuda.flash_sdp_enabled(),
        cuda.mem_efficient_sdp_enabled(),
        cuda.cudnn_sdp_enabled(),
        cuda.math_sdp_enabled(),
    )


def write_sdp(value: tuple[bool, bool, bool, bool]) -> None:
    """SDPA's backends on or off: flash, memory-efficient, cuDNN, math."""
    cuda = torch.backends.cuda
    cuda.enable_flash_sdp(value[0])
    cuda.enable_mem_efficient_sdp(value[1])
    cuda.enable_cudnn_sdp(value[2])
    cuda.enable_math_sdp(value[3])


def read_inductor() -> bool:
    import torch._inductor.config as inductor  # about a second: only when a part needs it

    return bool(inductor.deterministic)


def write_inductor(value: bool) -> None:
    import torch._inductor.config as inductor

    inductor.deterministic = value
