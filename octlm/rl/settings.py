"""`octlm rl`'s settings: one frozen dataclass, checked where it is built, so a bad number is a
one-line error before a model is loaded or a folder touched.

The trajectory (`trajectory()`) is every setting the bits depend on: a resume with another one
is refused. The process count is not among them (the step is the same on any, see
`octlm/rl/update.py`), nor are the held-out evaluation's settings (it samples from generators
of its own and leaves no trace in the weights), nor where the run writes and when it stops."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from octlm.config.checks import MAX_INT
from octlm.errors import OctlmError

SEED_MAX = 2**64 - 1
"""The largest seed torch.Generator.manual_seed takes (kept torch-free: the CLI imports this)."""
MAX_GROUP = 4096
"""Prompts or samples per step at most: more is not a step a small model's run takes."""


def _int(name: str, value: Any, lo: int, hi: int = MAX_INT, fix: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise OctlmError(
            f"--{name.replace('_', '-')} {value!r} must be an integer from {lo} to {hi:,}",
            fix or f"pass --{name.replace('_', '-')} {lo} or more",
        )


def _real(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < lo or value > hi or (lo_open and value == lo):
        low = f"above {lo:g}" if lo_open else f"from {lo:g}"
        raise OctlmError(
            f"--{name.replace('_', '-')} {value!r} must be a finite number {low} to {hi:g}",
            f"pass a --{name.replace('_', '-')} in that range",
        )


@dataclass(frozen=True)
class RLConfig:
    """One RL run: where it starts and writes, what it samples, how it learns."""

    source: str
    """The run (folder or checkpoint file) whose model RL starts from: a chat fine-tune."""
    task: str
    """The verifiable task (`octlm/rl/tasks.py`): addition, sorting, count, ..."""
    out: str
    """The RL run's own folder (checkpoints, log); required unless --verify-split."""
    prompts: int = 16
    """P: prompts per step (split across processes)."""
    samples: int = 8
    """G: replies sampled per prompt; a reply's advantage is its reward minus their mean."""
    max_new_tokens: int = 32
    """The length cap of a reply (a reply cut here without EOS is counted as cut)."""
    temperature: float = 1.0
    top_k: int | None = None
    steps: int = 100
    lr: float = 1e-4
    """The AdamW learning rate at step 0, decayed linearly to 0 at `steps` (nanochat's RL
    schedule). Under Muon, the matrices' rate keeps the source run's muon_lr / lr ratio."""
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 10
    """Score the held-out prompts every this many steps, and at the last (0: at the last only)."""
    eval_prompts: int = 64
    """Held-out prompts scored (the task's first N fixed ones)."""
    pass_k: int = 4
    """Replies sampled per held-out prompt: pass@1 (the expected share correct) and pass@k."""
    ckpt_every: int = 10
    keep_last: int = 2
    stop_at: int | None = None
    resume: bool = False
    log_to: str | None = None
    progress: bool | None = None
    """A progress bar (default: on a terminal)."""
    device: str = "auto"
    dist_timeout: float = 1800.0

    def __post_init__(self) -> None:
        _int("prompts", self.prompts, 1, MAX_GROUP)
        _int("samples", self.samples, 1, MAX_GROUP)
        _int("max_new_tokens", self.max_new_tokens, 1)
        _real("temperature", self.temperature, 0.0, 100.0, lo_open=True)
        if self.top_k is not None:
            _int("top_k", self.top_k, 1)
        _int("steps", self.steps, 1)
        _real("lr", self.lr, 0.0, 10.0, lo_open=True)
        _real("grad_clip", self.grad_clip, 0.0, 1e9)
        _int("seed", self.seed, 0, SEED_MAX, "pass a --seed from 0 to 2**64 - 1")
        _int("eval_every", self.eval_every, 0)
        _int("eval_prompts", self.eval_prompts, 1, 100_000)
        _int("pass_k", self.pass_k, 1, MAX_GROUP)
        _int("ckpt_every", self.ckpt_every, 0)
        _int("keep_last", self.keep_last, 1, 1000)
        if self.stop_at is not None:
            _int("stop_at", self.stop_at, 1, self.steps, "stop before --steps, or drop --stop-at")
        _real("dist_timeout", self.dist_timeout, 0.0, 1e7, lo_open=True)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RLConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def trajectory(self) -> dict[str, Any]:
        """The settings the run's bits depend on (see the module doc)."""
        keys = ("task", "prompts", "samples", "max_new_tokens", "temperature", "top_k")
        keys += ("steps", "lr", "grad_clip", "seed")
        return {k: getattr(self, k) for k in keys}

    def fingerprint(self, source: dict[str, Any]) -> str:
        """sha256 of the trajectory and the source model's identity (`source`)."""
        blob = json.dumps({"rl": self.trajectory(), "source": source}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()
