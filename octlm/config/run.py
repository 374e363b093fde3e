"""How a run is carried out, none of which is the model or its data: the hardware it computes
on (`HardwareSettings`), how often it is evaluated (`EvalSettings`), its folder and lifecycle
(`RunSettings`: checkpoints, stopping, resuming, where it starts from) and what is watched
(`ObserveSettings`: hashes, profiles, trackers). Torch-free.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from octlm.config import checks
from octlm.config.rules import (
    CHANGE_IT,
    ConfigError,
    check_section,
    declared_rules,
    new_trajectory,
    require,
    setting,
    trajectory,
)

DTYPES = ("fp32", "bf16", "fp16")
DEVICE_PATTERN = r"auto|(cpu|cuda|mps)(:\d+)?"  # what octlm.device.resolve_device takes
MAX_DIST_TIMEOUT_S = 7 * 24 * 3600.0
DETERMINISM_PARTS = ("algorithms", "attention", "inductor")
"""What --deterministic turns on, each of which --deterministic-parts may pick alone
(`octlm.trainer.state.configure_determinism` says what each does)."""
PARTS_FIX = "use a comma-separated list of algorithms, attention, inductor"
REDUCTIONS = ("tree", "collective")
REDUCTION_DEFAULT = "tree"
"""`reduction` of a new run that leaves it unset (run folders written before it existed ran
the collective sums: a resume takes the checkpoint's, `octlm.trainer.resume`)."""


def reduction_or_default(reduction: str | None) -> str:
    return REDUCTION_DEFAULT if reduction is None else reduction


"""A week: no collective waits longer for a peer (torch's own default is 30 minutes)."""
TRACKERS = ("tensorboard", "wandb")  # --log-to (octlm.trackers); each is its own extra
_LOOKS_NUMERIC = re.compile(r"[-+]?[\d_.]*\d[\d_.]*(e[-+]?\d+)?", re.IGNORECASE)
_INTEGER = re.compile(r"[-+]?\d+")
TASKS_FIX = "name task files as FILE[:N],FILE[:N] (N: its first N questions; docs/evaluation.md)"


def task_specs(label: str, text: str) -> list[tuple[str, int | None]]:
    """`FILE[:N],FILE[:N]` (--tasks, eval_tasks) as (FILE, N or None) pairs, checked before any
    file is read: at least one file, each N an integer from 1."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        given = (
            f"{label} {checks.shown(text)}"
            if label.startswith("--")
            else f"{label}={checks.shown(text)}"
        )
        raise ConfigError(f"{given} names no task file", TASKS_FIX)
    return [task_spec(label, part) for part in parts]


def task_spec(label: str, part: str) -> tuple[str, int | None]:
    """One `FILE[:N]`; `FILE:abc` is left whole (a path with a colon, which
    `octlm.evaluate.tasks.read_task` refuses when FILE is a file)."""
    head, colon, tail = part.rpartition(":")
    tail = tail.strip()
    if not (colon and head.strip() and _LOOKS_NUMERIC.fullmatch(tail)):
        return part, None
    count = int(tail) if _INTEGER.fullmatch(tail) and len(tail) < 40 else tail
    if not checks.Int(1).ok(count):
        raise ConfigError(
            f"{label}: N={checks.shown(count)} in {checks.shown(part)} must be {checks.Int(1)}",
            TASKS_FIX,
        )
    return head.strip(), count  # type: ignore[return-value]


PROFILE_FOLDER = "profile"
PROFILE_FILES = ("trace.json", "ops.txt", "memory.pickle")
"""What --profile-steps and --memory-snapshot write in OUT/profile/ (rank 0's names; the others
add -rankN before the suffix): octlm.trainer.profile writes them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareSettings:
    """What the run computes on and with: number format, compilation, determinism, how several
    processes share the model, the device."""

    dtype: str = trajectory("bf16")
    """fp32, or autocast over fp32 weights with bf16 or fp16 (fp16 adds a GradScaler)."""
    compile: bool = trajectory(False)
    """Wrap the model with torch.compile."""
    activation_checkpointing: bool = setting(False)
    """Recompute each block's activations in the backward pass instead of storing them: less
    memory for about one more forward per step, the same bits (a setting, so a resume may
    turn it on or off)."""
    deterministic: bool = trajectory(False)
    """All three parts of determinism (algorithms, attention, inductor: see
    deterministic_parts), without which two straight CUDA runs part within a few steps. Costly
    on a GPU; deterministic_parts picks some."""
    deterministic_parts: str | None = new_trajectory(None)
    """Some parts of --deterministic, comma-separated: algorithms (torch's deterministic
    kernels everywhere, with the cuBLAS workspace and cuDNN settings they need), attention (on
    CUDA, SDPA only through a backend whose backward is deterministic: the math one, unless
    algorithms makes flash's own backward deterministic), inductor (--compile's kernels chosen
    without timing them on the device). Without it, --deterministic is all three; not both."""
    parallel: str = trajectory("ddp")
    """With several processes (torchrun): ddp (replicated) or fsdp (FSDP2, sharded)."""
    reduction: str | None = trajectory(None)
    """How a step's micro-batch gradients and losses are summed: tree (one fixed tree over the
    step's micro-batches: the same bits on 1, 2, 4, ... processes, any power of 2 dividing
    them, or one per micro-batch) or collective (autograd accumulation and DDP's/FSDP2's own
    sums: bits follow the process count). Unset: tree for a new run, the checkpoint's own for a
    resume (collective before tree existed)."""
    dist_timeout: float = setting(1800.0, checks.Number(0, MAX_DIST_TIMEOUT_S, lo_open=True))
    """With several processes: seconds a collective waits for a peer before the run ends with
    an error naming the rank and step (a dead, stopped or hung process); torch's default. Must
    exceed the longest step, validation or checkpoint write."""
    device: str = setting("auto")  # checked through the build record instead
    """cpu, cuda, cuda:N, or auto (cuda when available)."""

    def __post_init__(self) -> None:
        check_section(self)
        require(
            self.dtype in DTYPES,
            f"dtype {checks.shown(self.dtype)} is unknown",
            f"use one of {DTYPES}",
        )
        check_determinism(self)
        require(
            self.parallel in ("ddp", "fsdp"),
            f"parallel {checks.shown(self.parallel)} is unknown",
            "use ddp or fsdp",
        )
        require(
            self.reduction in (None, *REDUCTIONS),
            f"reduction {checks.shown(self.reduction)} is unknown",
            "use tree or collective",
        )
        problem = device_problem(self.device)
        if problem is not None:
            raise ConfigError(*problem)

    @property
    def determinism_parts(self) -> tuple[str, ...]:
        """The parts of determinism this run turns on, in `DETERMINISM_PARTS` order."""
        if self.deterministic:
            return DETERMINISM_PARTS
        parts = self.deterministic_parts
        return tuple(parts.split(",")) if parts else ()


def check_determinism(hardware: HardwareSettings) -> None:
    """`deterministic_parts` names known parts, some but not all, and not beside
    `deterministic` (which is all of them); stored in `DETERMINISM_PARTS` order, each once (the
    same run however it is spelt)."""
    given = hardware.deterministic_parts
    if given is None:
        return
    shown = f"deterministic_parts {checks.shown(given)}"
    names = [p.strip() for p in given.split(",") if p.strip()]
    unknown = [p for p in names if p not in DETERMINISM_PARTS]
    require(bool(names), f"{shown} names no part", PARTS_FIX)
    require(not unknown, f"{shown} names unknown part(s) {', '.join(unknown)}", PARTS_FIX)
    require(
        not hardware.deterministic,
        f"deterministic=true is every part already; {shown} names some",
        "pass either --deterministic (all parts) or --deterministic-parts, not both",
    )
    parts = [p for p in DETERMINISM_PARTS if p in names]
    require(
        len(parts) < len(DETERMINISM_PARTS),
        f"{shown} names every part",
        "pass --deterministic instead (the same run, and the fingerprint old runs have)",
    )
    object.__setattr__(hardware, "deterministic_parts", ",".join(parts))


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalSettings:
    """How often the run is scored, and on what: validation windows and task files. Scoring
    never moves a training bit (it runs under `fork_rng`)."""

    val_every: int = setting(20, checks.Int(0))
    """Validate every N steps and at the end; 0 disables periodic validation."""
    val_batches: int = setting(40, checks.Int(1))
    """Micro-batches of the validation stream to evaluate (always the same first ones)."""
    eval_tasks: str | None = setting(None)  # scoring never moves a training bit
    """Multiple-choice task files, FILE[:N],... (their first N questions), scored at every
    validation: acc and acc_norm per task in the log, as lm-eval scores them (docs/
    evaluation.md)."""
    eval_tasks_every: int | None = setting(None, checks.Int(0))
    """Score eval_tasks every N steps (a multiple of val_every: the scores go in that
    validation's record) and at the last step; default: at every validation; 0: only at the
    last step (nanochat's core_metric_every)."""

    def __post_init__(self) -> None:
        check_section(self)
        if self.eval_tasks is not None:  # the files are read when the run is built
            task_specs("eval_tasks", self.eval_tasks)
        every, val = self.eval_tasks_every, self.val_every
        require(
            not every or (val > 0 and every % val == 0),
            f"eval_tasks_every={every} is not a multiple of val_every={val}",
            "tasks are scored at validations: give a multiple of val_every, or 0 (the last step "
            "only)",
        )

    @property
    def task_interval(self) -> int:
        """Steps between eval_tasks scorings (0: only the last step's, which always scores)."""
        return self.val_every if self.eval_tasks_every is None else self.eval_tasks_every


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSettings:
    """The run's folder and lifecycle: where it writes, where it starts from, how often it
    checkpoints and keeps, when it stops, whether it resumes, what it does on a bad step."""

    out: str = setting("runs/octlm", checks.PATH)
    """Run folder: log.jsonl, checkpoints, snapshots."""
    init_from: str | None = new_trajectory(None, checks.PATH)
    """Start from these weights (an octlm run folder or checkpoint file, or a Hugging Face
    LlamaForCausalLM or Qwen3ForCausalLM folder), whose shape the model takes; fresh optimizer,
    step 0."""
    ckpt_every: int = setting(40, checks.Int(0))
    """Checkpoint every N steps and at the end; 0 = only at the end and on interruption."""
    keep_last: int = setting(2, checks.Int(1))
    """Full checkpoints kept (rotated); a damaged newest one falls back to the one before."""
    keep_ckpts: bool = setting(False)
    """Also keep a weights-only snapshot at every checkpoint."""
    async_checkpoint: bool = setting(True)  # it writes a private copy
    """Write checkpoints in a background thread from a private copy of the state, so training
    goes on while they are written; every exit waits for the write in flight."""
    stop_at: int | None = setting(None, checks.Int(1))
    """Stop cleanly once this many steps are done, with a checkpoint, as an interruption would."""
    resume: bool = setting(False)
    """Continue from the newest valid checkpoint in `out` (start fresh if it holds none)."""
    allow_config_change: bool = setting(False)
    """Resume even though trajectory settings changed (e.g. more steps); the log records that
    the run is no longer exact."""
    skip_nonfinite: bool = setting(False)  # acts only when logged
    """Skip steps with a non-finite loss or gradient norm (counted in the log) instead of
    stopping."""

    def __post_init__(self) -> None:
        check_section(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class ObserveSettings:
    """What watches the run without changing it: weight and tensor hashes, the progress bar,
    the profiler, trackers, the peak MFU is measured against."""

    hash_every: int | None = setting(None, checks.Int(0))
    """Write the model's weights_sha256 to the log every N steps; default: at every validation;
    0: only at the end."""
    hash_tensors: bool = setting(False)  # digests only read the tensors
    """With each weights hash, also log a 16-hex digest of every weight and of every gradient
    of the step just done (before clipping), so `octlm diff` names the first tensor that
    differs."""
    progress: bool | None = setting(None)
    """Progress bar: on a terminal by default."""
    profile_steps: str | None = setting(None)  # the profiler only watches
    """A:B: steps A to B (from 1) profiled into OUT/profile/, a Chrome trace and a per-op table."""
    memory_snapshot: bool = setting(False)
    """On CUDA: PyTorch's memory snapshot of the first steps (up to 3) in OUT/profile/."""
    log_to: str | None = setting(None)  # trackers only read the log's records
    """Also send the log's records to trackers, comma-separated: tensorboard (OUT/tensorboard),
    wandb (the run id kept in OUT/wandb_id; WANDB_MODE=offline needs no network)."""
    peak_tflops: float | None = setting(None, checks.Number(0, lo_open=True))
    """Device peak for MFU; default: a table for known GPUs, none on CPU."""

    def __post_init__(self) -> None:
        check_section(self)
        problem = trackers_problem(self.log_to)
        if problem is not None:
            raise ConfigError(*problem)


def device_problem(device: str) -> tuple[str, str] | None:
    """Why `device` names no device octlm can resolve (training's and RL's one wording)."""
    if re.fullmatch(DEVICE_PATTERN, device) is not None:
        return None
    return f"device {checks.shown(device)} is unknown", "use cpu, cuda, cuda:N, mps or auto"


def trackers_problem(log_to: str | None) -> tuple[str, str] | None:
    """Why `log_to` names a tracker octlm does not have (training's and RL's one wording)."""
    for name in (log_to or "").split(","):
        if name.strip() not in (*TRACKERS, ""):
            near = difflib.get_close_matches(name.strip().lower(), TRACKERS, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            return (
                f"log_to names an unknown tracker {checks.shown(name.strip())}{hint}",
                f"use a comma-separated list of {', '.join(TRACKERS)}",
            )
    return None


RULES = {
    **declared_rules(HardwareSettings),
    **declared_rules(EvalSettings),
    **declared_rules(RunSettings),
    **declared_rules(ObserveSettings),
}


def profile_window(profile_steps: str | None, steps: int) -> tuple[int, int] | None:
    """(A, B) of `profile_steps` ("A:B"), None if unset or not 1 <= A <= B <= steps."""
    found = re.fullmatch(r"(\d+):(\d+)", profile_steps or "")
    a, b = (int(found[1]), int(found[2])) if found else (0, 0)
    return (a, b) if 1 <= a <= b <= steps else None


def profile_problem(
    profile_steps: str | None, memory_snapshot: bool, steps: int, out: str | None
) -> tuple[str, str] | None:
    """Why --profile-steps (or --memory-snapshot) cannot be honoured: a window that is not A:B
    inside the run, or an OUT/profile/ that could not take the files (checked before a run
    trains for hours and then fails writing them); None when they can."""
    if profile_steps is not None and profile_window(profile_steps, steps) is None:
        shown = checks.shown(profile_steps)
        return f"profile_steps {shown} is not A:B, 1 <= A <= B <= steps", CHANGE_IT
    profiled = profile_steps is not None or memory_snapshot
    return profile_out_problem(out) if profiled and out is not None else None


def profile_out_problem(out: str) -> tuple[str, str] | None:
    """Why OUT/profile/ could not take the profile's files, checked before the run starts (a
    run must not train for hours, then fail writing them); None when it can."""
    folder = Path(out) / PROFILE_FOLDER
    fix = "move it away, or choose another --out (or drop --profile-steps/--memory-snapshot)"
    shown = checks.shown_path(folder)
    if folder.exists() and not folder.is_dir():
        return f"the profile goes to {shown}/, which is a file", fix
    for name in PROFILE_FILES:
        if (folder / name).is_dir():
            return f"the profile writes {checks.shown_path(folder / name)}, which is a folder", fix
    existing = next((p for p in (folder, *folder.absolute().parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        return f"the profile goes to {shown}/, under {checks.shown_path(existing)}, a file", fix
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        return f"the profile goes to {shown}/, but {checks.shown_path(existing)} is read-only", fix
    return None
