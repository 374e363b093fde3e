"""`octlm rl`'s settings: `RLConfig`, five frozen sections built from flat keys, as
`TrainConfig` is (`octlm.config.train`), and by the same doors: flags, a `--config` TOML file,
`--print-config`, the Python API.

The sections, by what a setting decides:
- `policy`: the RL trajectory (the task, how many prompts and replies a step samples and how,
  the learning rate, clipping, steps, the seed): every bit of the run depends on these;
- `heldout`: the held-out score (it samples from generators of its own and leaves no trace in
  the weights);
- `run`, `hardware`, `observe`: the folder and lifecycle, the device, what watches. Their keys
  are training's own (`same_as_training`): one name, one rule, one refusal's wording,
  whichever command reads it.

`trajectory()` is what a resume must keep; it and `to_dict()` (what a checkpoint and a log
header record) are the bytes RL runs wrote before the sections (tests/config/test_pinned_rl.py).
Torch-free: the CLI imports it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from octlm.config import checks
from octlm.config.rules import (
    ConfigError,
    check_section,
    declared_rules,
    fill_sections,
    new_trajectory,
    require,
    setting,
    trajectory,
)
from octlm.config.run import device_problem, profile_problem, profile_window, trackers_problem
from octlm.config.train import FIELDS as TRAIN_FIELDS

EXACT_KERNELS = (1, 2, 3)
"""The exact path's kernels by version (`octlm/model/exact_products.py`,
`octlm/model/exact_blocks.py`): 1, MKL's product in tiles of 2 rows; 2, oneDNN's over a packed
weight, every row in one call; 3, kernel 2's products and an attention of one softmax per query
over its own key blocks."""
EXACT_KERNEL = 3
"""The version a new run (and every generate, eval and server call) computes with."""
ABSENT = {"on_policy": False, "sampler": "plain", "exact_kernel": 1}
"""What a trajectory key added after runs existed means where a recorded trajectory lacks it:
what every run before the key did."""
SAMPLERS = ("exact", "plain")
"""`sampler`'s values; a run folder without the key sampled on the plain path."""
MAX_GROUP = 4096
"""Prompts or samples per step at most: more is not a step a small model's run takes."""
SOURCE_FIX = "name the run to start from: octlm rl RUN ... (or source = RUN in --config)"
NO_OUT = (
    "an RL run needs a folder to write (out)",
    "pass --out runs/rl (out = ... in --config, out=... from Python)",
)
TASK_FIX = "name a task: --task addition, sorting, count, ... (docs/rl.md)"


def same_as_training(name: str, default: Any = dataclasses.MISSING) -> Any:
    """The field `octlm train` declares under `name`, with its rule and role (and its default,
    unless RL has its own): an RL run reads `--seed` or `--keep-last` as training does."""
    known = TRAIN_FIELDS[name]
    value = known.default if default is dataclasses.MISSING else default
    return dataclasses.field(default=value, metadata=known.metadata)


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicySettings:
    """What each RL step samples and how it learns from it: the trajectory, which a resume must
    keep (the process count is not part of it: the step is the same on any)."""

    task: str | None = trajectory(None)
    """The verifiable task (octlm/rl/tasks.py): addition[:N], sorting[:N], count,
    reasoning_gym:NAME."""
    prompts: int = trajectory(16, checks.Int(1, MAX_GROUP))
    """P: prompts per step (split across processes)."""
    samples: int = trajectory(8, checks.Int(1, MAX_GROUP))
    """G: replies sampled per prompt; a reply's advantage is its reward minus their mean."""
    max_new_tokens: int = trajectory(32, checks.Int(1))
    """The length cap of a reply (a reply cut here without EOS is counted as cut)."""
    temperature: float = trajectory(1.0, checks.Number(0, 100, lo_open=True))
    """Sampling temperature of the rollouts (and of the held-out score)."""
    top_k: int | None = trajectory(None, checks.Int(1))
    """Sample among the k likeliest tokens only (default: all)."""
    sampler: str | None = new_trajectory(None)
    """How replies are decoded: exact (`octlm/model/exact.py`: a token's logits the same bits
    cached or not, alone or in any batch) or plain (PyTorch's kernels, whose bits follow the
    batch's shape). Unset: exact for a new run, the run's own for a resume (plain for a run
    written before exact decoding existed, so it continues on its own draws)."""
    on_policy: bool = new_trajectory(False)
    """Run the update's forward on the rollouts' exact path (float32, no dropout), so each
    sampled token's log-prob is bit for bit the one it was drawn with: the step's
    logprob_diff reads 0.0 (docs/exactness.md, "Exact in use")."""
    exact_kernel: int | None = new_trajectory(None, checks.Int(1, EXACT_KERNELS[-1]))
    """The exact path's kernel (1: MKL's tiles of 2 rows, 2: oneDNN's packed product, 3: that
    product and an attention of one softmax per query, `EXACT_KERNELS`), whose bits the exact
    sampler and the on-policy update compute. Unset: the newest for a new run, the run's own
    for a resume (1 for a run written before the key), so a run keeps its own bits."""
    steps: int = same_as_training("steps", 100)
    """RL steps: the learning rate reaches 0 at the last."""
    lr: float = same_as_training("lr", 1e-4)
    """The AdamW learning rate at step 0, decayed linearly to 0 at `steps` (nanochat's RL
    schedule). Under Muon, the matrices' rate keeps the source run's muon_lr / lr ratio."""
    grad_clip: float = same_as_training("grad_clip")
    seed: int = same_as_training("seed", 0)
    """Every draw of the run (prompts, replies, dropout) is a function of (seed, step, ...)."""

    def __post_init__(self) -> None:
        check_section(self)
        require(
            self.sampler in (None, *SAMPLERS),
            f"sampler {checks.shown(self.sampler)} is unknown",
            "use exact or plain",
        )
        require(
            not (self.on_policy and self.sampler == "plain"),
            "on_policy=true reads the exact path's log-probs; sampler=plain samples on another",
            "drop --sampler plain (or --on-policy)",
        )

    def sampling(self) -> dict[str, Any]:
        """How a reply is sampled, rollout or held-out: `generate`'s keywords (unset sampler:
        exact, a new run's)."""
        keys = {k: getattr(self, k) for k in ("max_new_tokens", "temperature", "top_k")}
        exact = self.sampler != "plain"
        return {**keys, "exact": exact, "kernel": self.exact_kernel or EXACT_KERNEL}


@dataclass(frozen=True, kw_only=True, slots=True)
class HeldoutSettings:
    """The held-out score: the task's first fixed prompts, sampled k times each, at intervals.
    It never moves a bit of the run."""

    eval_every: int = setting(10, checks.Int(0))
    """Score the held-out prompts every this many steps, and at the last (0: at the last only)."""
    eval_prompts: int = setting(64, checks.Int(1, 100_000))
    """Held-out prompts scored (the task's first N fixed ones)."""
    pass_k: int = setting(4, checks.Int(1, MAX_GROUP))
    """Replies sampled per held-out prompt: pass@1 (the expected share correct) and pass@k."""

    def __post_init__(self) -> None:
        check_section(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class RLRunSettings:
    """The run's folder and lifecycle: where it starts from and writes, how often it
    checkpoints, when it stops, whether it resumes."""

    source: str | None = setting(None, checks.PATH)
    """The run (folder or checkpoint file) whose model RL starts from: a chat fine-tune."""
    out: str | None = same_as_training("out", None)
    """The RL run's own folder (checkpoints, log)."""
    ckpt_every: int = same_as_training("ckpt_every", 10)
    keep_last: int = same_as_training("keep_last")
    stop_at: int | None = same_as_training("stop_at")
    resume: bool = same_as_training("resume")
    skip_nonfinite: bool = same_as_training("skip_nonfinite")
    """Skip an RL step whose loss or gradient norm is not finite (no update; counted in the
    log) instead of stopping."""

    def __post_init__(self) -> None:
        check_section(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class RLHardwareSettings:
    """What the run computes on: the device, and how long a process waits for a peer."""

    device: str = same_as_training("device")
    dist_timeout: float = same_as_training("dist_timeout")

    def __post_init__(self) -> None:
        check_section(self)
        problem = device_problem(self.device)
        if problem is not None:
            raise ConfigError(*problem)


@dataclass(frozen=True, kw_only=True, slots=True)
class RLObserveSettings:
    """What watches the run without changing it: the progress bar, trackers, weights hashes and
    the profiler."""

    log_to: str | None = same_as_training("log_to")
    progress: bool | None = same_as_training("progress")
    hash_every: int | None = same_as_training("hash_every")
    """Write the model's weights_sha256 to the log every N steps; default: at every held-out
    score; 0: only at the end."""
    profile_steps: str | None = same_as_training("profile_steps")

    def __post_init__(self) -> None:
        check_section(self)
        problem = trackers_problem(self.log_to)
        if problem is not None:
            raise ConfigError(*problem)


SECTIONS: dict[str, type] = {
    "policy": PolicySettings,
    "heldout": HeldoutSettings,
    "run": RLRunSettings,
    "hardware": RLHardwareSettings,
    "observe": RLObserveSettings,
}
"""Each section's attribute on `RLConfig` and its class, in `--help` and `--print-config`'s
order."""
SECTION_OF = {f.name: name for name, cls in SECTIONS.items() for f in fields(cls)}
FIELDS = {f.name: f for cls in SECTIONS.values() for f in fields(cls)}
"""Each key's field: its default, rule and role (`octlm eval --tasks` reads the sampling
settings' defaults here, so a generative task is scored as `octlm rl` scores it)."""
# The order RL checkpoints and log headers have always recorded the keys in (JSON objects keep
# insertion order): kept, so an RL run's files are the bytes they were before the sections. A
# new key is appended here and given to its section.
KEY_ORDER = (
    *("source", "task", "out", "prompts", "samples", "max_new_tokens", "temperature", "top_k"),
    "on_policy",
    "sampler",
    "exact_kernel",
    *("steps", "lr", "grad_clip", "seed", "eval_every", "eval_prompts", "pass_k", "ckpt_every"),
    *("keep_last", "stop_at", "resume", "log_to", "progress", "device", "dist_timeout"),
    *("skip_nonfinite", "hash_every", "profile_steps"),
)
ADDED_KEYS = (
    *("on_policy", "sampler", "exact_kernel", "skip_nonfinite", "hash_every", "profile_steps"),
)
"""Keys added after RL runs existed: `to_dict()` records one only when it is not at its
default, so what an RL run records of its settings stays the bytes it always was unless the
run uses them (they decide no bit of the trajectory)."""
if set(KEY_ORDER) != set(SECTION_OF) or len(KEY_ORDER) != len(SECTION_OF):
    raise TypeError(f"KEY_ORDER and the RL sections differ: {set(KEY_ORDER) ^ set(SECTION_OF)}")
TRAJECTORY_KEYS = ("task", "prompts", "samples", "max_new_tokens", "temperature", "top_k")
TRAJECTORY_KEYS += ("steps", "lr", "grad_clip", "seed")
"""What `trajectory()` records, in its recorded order (the policy section's keys)."""
FIELD_RULES = {
    name: rule for cls in SECTIONS.values() for name, rule in declared_rules(cls).items()
}


@dataclass(frozen=True, slots=True, init=False)
class RLConfig:
    """The settings of one RL run, as five sections; built from flat keys."""

    policy: PolicySettings
    heldout: HeldoutSettings
    run: RLRunSettings
    hardware: RLHardwareSettings
    observe: RLObserveSettings

    def __init__(self, *args: Any, **keys: Any) -> None:
        fill_sections(self, args, keys, SECTIONS, KEY_ORDER, "octlm rl")
        self._check_together()

    def __getattr__(self, name: str) -> Any:
        """A flat key (`cfg.prompts`), read from its section."""
        section = SECTION_OF.get(name)
        if section is None:
            raise AttributeError(f"'RLConfig' object has no attribute {name!r}")
        return getattr(object.__getattribute__(self, section), name)

    def _check_together(self) -> None:
        require(self.run.source is not None, "octlm rl needs the run to start from", SOURCE_FIX)
        require(self.policy.task is not None, "octlm rl needs a task", TASK_FIX)
        steps, stop_at = self.policy.steps, self.run.stop_at
        if stop_at is not None:
            require(stop_at <= steps, f"stop_at={stop_at} must be between 1 and steps={steps}")
        problem = profile_problem(self.observe.profile_steps, False, steps, self.run.out)
        if problem is not None:
            raise ConfigError(*problem)

    def to_dict(self) -> dict[str, Any]:
        """Every key, flat, in `KEY_ORDER` (what checkpoints and log headers record; an
        `ADDED_KEYS` key only when set)."""
        values = {k: getattr(getattr(self, SECTION_OF[k]), k) for k in KEY_ORDER}
        return {k: v for k, v in values.items() if k not in ADDED_KEYS or v != FIELDS[k].default}

    @property
    def hash_interval(self) -> int:
        """Steps between weights hashes in the log: hash_every, by default eval_every."""
        every = self.observe.hash_every
        return self.heldout.eval_every if every is None else every

    @property
    def profile_window(self) -> tuple[int, int] | None:
        return profile_window(self.observe.profile_steps, self.policy.steps)

    def by_section(self) -> dict[str, dict[str, Any]]:
        """{section: {key: value}}, in `SECTIONS` order (`--print-config`, the report)."""
        return sectioned(self.to_dict())

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RLConfig:
        """The config a checkpoint or header recorded (keys a newer octlm added left out)."""
        return cls(**{k: v for k, v in values.items() if k in SECTION_OF})

    def replace(self, **changes: Any) -> RLConfig:
        """A new config with `changes` (flat keys) over this one's, checked again."""
        return RLConfig(**{**self.to_dict(), **changes})

    def trajectory(self) -> dict[str, Any]:
        """The settings the run's bits depend on: a resume with others is refused."""
        out = {k: getattr(self.policy, k) for k in TRAJECTORY_KEYS}
        if self.policy.on_policy:  # a later key: recorded only where set (old runs keep theirs)
            out["on_policy"] = True
        if self.policy.sampler == "exact":  # absent: plain, as every run before the key sampled
            out["sampler"] = "exact"
        kernel = self.policy.exact_kernel
        if kernel not in (None, 1) and (self.policy.on_policy or self.policy.sampler == "exact"):
            out["exact_kernel"] = kernel  # absent: 1, the kernel of every run before the key
        return out

    def resolved(self, recorded: Mapping[str, Any] | None) -> RLConfig:
        """The sampler and the exact kernel settled: a new run's (`recorded` None) exact and
        the newest kernel unless set; a resume's those its checkpoint's trajectory `recorded`
        (absent: plain, kernel 1) unless set, which the resume check then compares."""
        changes: dict[str, Any] = {}
        new = {"sampler": "exact", "exact_kernel": EXACT_KERNEL}
        for key, value in new.items():
            if getattr(self.policy, key) is None:
                changes[key] = value if recorded is None else recorded.get(key, ABSENT[key])
        return self.replace(**changes) if changes else self

    def fingerprint(self, source: dict[str, Any]) -> str:
        """sha256 of the trajectory and the source model's identity (`source`)."""
        # json.dumps's own separators, not `octlm.hashing.canonical_json`'s: the bytes every RL
        # run folder's fingerprint was taken over.
        blob = json.dumps({"rl": self.trajectory(), "source": source}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def sectioned(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A flat RL config (an `RLConfig`'s, or a header's from any octlm) grouped by section;
    keys no section knows (a newer octlm's) under "other"."""
    out: dict[str, dict[str, Any]] = {name: {} for name in (*SECTIONS, "other")}
    for key in [*(k for k in KEY_ORDER if k in config), *(k for k in config if k not in KEY_ORDER)]:
        out[SECTION_OF.get(key, "other")][key] = config[key]
    return {name: keys for name, keys in out.items() if keys}
