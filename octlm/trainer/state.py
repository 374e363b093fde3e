"""Counters of a run, every random generator a resume must restore, and how they are seeded.

RNG states are converted to tensors (torch CPU/CUDA byte states) and JSON-safe lists (Python's
Mersenne Twister, NumPy's global generator), so a checkpoint never needs pickle.
"""

from __future__ import annotations

import os
import random
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


def configure_determinism(deterministic: bool, device: torch.device) -> None:
    """--deterministic: deterministic kernels (and the cuBLAS workspace they need on CUDA)."""
    if not deterministic:
        return
    if device.type == "cuda":
        # cuBLAS needs a fixed workspace to pick reproducible reduction orders.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True)
