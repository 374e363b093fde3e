"""Counters of a run and every random generator a resume must restore.

RNG states are converted to tensors (torch CPU/CUDA byte states) and JSON-safe lists (Python's
Mersenne Twister, NumPy's global generator), so a checkpoint never needs pickle.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class TrainState:
    step: int = 0
    """Optimizer steps completed, which is also the 0-based index of the next one."""
    tokens: int = 0
    """Training tokens consumed (all targets, PAD included)."""
    elapsed: float = 0.0
    """Seconds spent in training across all sessions."""
    skipped_steps: int = 0
    """Steps an fp16 GradScaler skipped for inf/nan gradients."""

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


def capture_rng() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(JSON part, tensor part) of the Python, NumPy, torch CPU and CUDA generator states."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    meta = {
        "python": [version, list(mt), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_initialized() else 0,
    }
    tensors = {"torch_cpu": torch.get_rng_state()}
    for i in range(meta["cuda_devices"]):
        tensors[f"cuda_{i}"] = torch.cuda.get_rng_state(i)
    return meta, tensors


def restore_rng(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    version, mt, gauss = meta["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch_cpu"])
    for i in range(meta.get("cuda_devices", 0)):
        if i < torch.cuda.device_count():
            torch.cuda.set_rng_state(tensors[f"cuda_{i}"], i)
