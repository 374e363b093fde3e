"""One run's built parts, and the state that a checkpoint captures from them.

`build_run(cfg)` decides what the parts depend on (an elastic resume's accumulation, the data
folder, the checkpoint a resume reads) before building any, in an order that is part of the
bits. `Run.state_dict()` is each part's state under the checkpoint's keys; `resume` loads the
checkpoint `build_run` found (trainer/resume.py)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from octlm.config.diff import trajectory_changes
from octlm.config.shape import ModelConfig, preset
from octlm.config.train import TrainConfig
from octlm.data.mixture import MixtureSampler
from octlm.data.order import Sampler
from octlm.data.shards import ShardDataset
from octlm.device import build_info, build_notes, check_device_dtype, keep_freed_host_memory
from octlm.errors import ResumeError
from octlm.evaluate.loss import EvalResult, ValidationSet, validate, validate_run
from octlm.evaluate.protocol import AnyTask, read_tasks
from octlm.hashing import weights_sha256
from octlm.model.gpt import GPT
from octlm.runlog.writer import git_commit
from octlm.tokenizer.core import Tokenizer
from octlm.trainer import checkpoint as ckpt
from octlm.trainer.distributed import (
    DistInfo,
    all_reduce_sum,
    barrier,
    full_model_state,
    full_optim_state,
    gather_objects,
    init_distributed,
    load_full_state,
)
from octlm.trainer.guards import check_shared_folder
from octlm.trainer.init_from import InitPlan, load_into, plan_init
from octlm.trainer.inputs import build_inputs, open_data
from octlm.trainer.layout import check_layout, place_model, step_setup
from octlm.trainer.optim import build_optimizer, param_names
from octlm.trainer.reduction import ordered_sum
from octlm.trainer.resume import Found, find_agreed, settle
from octlm.trainer.saver import BackgroundSaver
from octlm.trainer.state import (
    TrainState,
    configure_determinism,
    load_rng_state_dict,
    rng_state_dict,
    seed_everything,
)
from octlm.trainer.step import StepSetup


@dataclass
class Run:
    """The parts of one run, built by `build_run`. Only `state` changes as the run steps (and
    the model and optimizer it updates)."""

    cfg: TrainConfig
    """As resolved for this process count: with --resume on another one, its `accum`."""
    dist: DistInfo
    device: torch.device
    data_dir: Path
    dataset: ShardDataset
    tokenizer: Tokenizer
    model_config: ModelConfig
    model: GPT
    """The plain module: its weights are the ones checkpointed and hashed."""
    wrapped: nn.Module
    """The model under DDP or FSDP (the model itself with one process)."""
    optimizer: torch.optim.Optimizer
    param_names: list[str]
    """The parameters' names in the optimizer's index order, read once when it is built: FSDP2
    later swaps the root module's parameters for unsharded ones, which the optimizer never
    holds, so the names cannot be matched by identity after a step."""
    scaler: torch.amp.GradScaler | None
    sampler: Sampler | MixtureSampler
    val: ValidationSet
    """What validation scores: the validation split's first windows (with a mixture, the first
    dataset's; `val_sources` holds each dataset's)."""
    setup: StepSetup
    fingerprints: dict[str, str]
    state: TrainState = field(default_factory=TrainState)
    saver: BackgroundSaver = field(default_factory=lambda: BackgroundSaver(True))
    notes: list[str] = field(default_factory=list)
    """What `build_run` changed (the accumulation of an elastic resume), for the resume log."""
    init_from: dict[str, Any] | None = None
    """The --init-from source's identity (path, kind, weights_sha256), kept by every checkpoint."""
    packing: dict[str, Any] | None = None
    """Prompt/completion data: how its examples were packed at the run's context (the header)."""
    val_sources: dict[str, ValidationSet] = field(default_factory=dict)
    """A --data mixture's validation sets, per dataset (empty for one dataset)."""
    tasks: list[AnyTask] = field(default_factory=list)
    """The --eval-tasks questions, scored at every validation."""
    start: Found | None = None
    """The checkpoint this run resumes from, found once by `build_run` (None for a new run);
    `resume` loads it and lets it go."""

    @property
    def out(self) -> Path:
        return Path(self.cfg.run.out)

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.tokens_per_step * self.dist.world

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's weights (collective under FSDP)."""
        return full_model_state(self.model, self.dist, self.cfg.hardware.parallel)

    def weights_sha256(self) -> str | None:
        """The weights hash on rank 0 (None elsewhere); collective under FSDP."""
        weights = self.full_model_state()
        return weights_sha256(weights) if self.dist.is_main else None

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> ckpt.RunState:
        """Every part's state (collective with several ranks: full weights and moments are
        gathered under FSDP, and every rank's generators)."""
        names = self.param_names
        parallel = self.cfg.hardware.parallel
        optim = full_optim_state(self.model, self.optimizer, self.dist, parallel, names)
        rngs = gather_objects(rng_state_dict(), self.dist)
        return {
            ckpt.MODEL: self.full_model_state(),
            ckpt.OPTIMIZER: optim,
            ckpt.SCALER: self.scaler.state_dict() if self.scaler else None,
            ckpt.TRAIN_STATE: self.state.state_dict(),
            ckpt.SAMPLER: self.sampler.state_dict(self.state.step),
            ckpt.RNG: rngs,  # type: ignore[typeddict-item]
            **self.identity(),  # type: ignore[typeddict-item]
        }

    def identity(self) -> dict[str, Any]:
        """What the run is, beside its state (the checkpoint's `IDENTITY_KEYS`)."""
        return {
            "fingerprints": self.fingerprints,
            "trajectory": self.cfg.trajectory(self.dist.world),
            "config": self.cfg.to_dict(),
            "model_config": self.model_config.to_dict(),
            "data_dir": str(self.data_dir.resolve()),
            "build": build_info(self.device),
            "world": self.dist.world,
            "init_from": self.init_from,  # left out of the checkpoint when None (v1 layout)
        }

    def load_state_dict(self, state: ckpt.RunState) -> list[str]:
        """Restore every part; returns notes (generators re-seeded for a new process count)."""
        load_full_state(
            self.model,
            self.optimizer,
            state[ckpt.MODEL],
            state[ckpt.OPTIMIZER],
            self.dist,
            self.cfg.hardware.parallel,
            self.param_names,
        )
        if self.scaler is not None and state[ckpt.SCALER]:
            self.scaler.load_state_dict(state[ckpt.SCALER])
        self.state.load_state_dict(state[ckpt.TRAIN_STATE])
        try:
            self.sampler.load_state_dict(state[ckpt.SAMPLER], self.state.step)
        except ValueError as exc:  # another order or block count: the data would not continue
            raise ResumeError(
                f"the checkpoint in {self.out} cannot continue this data order: {exc}",
                "resume with the run's own --order, data and --context",
            ) from None
        # Last: nothing may draw after. Each rank gets its own generators back.
        if state["world"] == self.dist.world:
            load_rng_state_dict(state[ckpt.RNG][self.dist.rank])
            return []
        # No state for this rank layout: fresh generators, distinct per rank and step.
        seed_everything(self.cfg.inputs.seed * 1000 + self.dist.rank + self.state.step)
        if self.cfg.hardware.reduction == "tree":  # each micro-batch seeds its own draws
            return [
                "random generators re-seeded for the new process count (dropout draws from "
                "(seed, step, micro-batch): the same on any process count)"
            ]
        return ["random generators re-seeded for the new process count"]

    def save(self) -> None:
        """Checkpoint the run as it is now: written before this returns, or (async_checkpoint)
        from a private host copy in the background; `self.saver.wait()` waits for it."""
        state = self.state_dict()  # collective: every rank takes part in the gathers
        if not self.dist.is_main:  # one file, written by rank 0; the others go on
            barrier(self.dist)  # (under FSDP they hold no whole tensor: see distributed.py)
            return
        meta, tensors = ckpt.pack(state)
        if self.saver.background:  # later steps must not reach what the writer reads
            meta, tensors = ckpt.host_copy(meta, tensors)
        step, out, cfg = self.state.step, self.out, self.cfg
        self.saver.submit(lambda: write_checkpoint(out, step, meta, tensors, cfg))
        barrier(self.dist)

    # -- reading -----------------------------------------------------------------------------
    def validate(self) -> EvalResult:
        """The validation numbers; a mixture's are each dataset's, and over all of them."""
        return validate_run(self.val, self.val_sources, self.score)

    def score(self, val: ValidationSet) -> EvalResult:
        # DDP: each rank scores its share with the plain module (no collectives in forward) and
        # the totals are summed. FSDP must run the sharded module on every rank in lockstep,
        # so each rank scores everything.
        split = self.dist.enabled and self.cfg.hardware.parallel == "ddp"
        tree = split and self.cfg.hardware.reduction == "tree"  # batches added in order
        return validate(
            self.model if split else self.setup.forward,
            val,
            device=self.device,
            dtype=self.cfg.hardware.dtype,
            rank=self.dist.rank if split else 0,
            world=self.dist.world if split else 1,
            reduce_sum=(lambda t: all_reduce_sum(t, self.dist)) if split else None,
            in_order=(lambda parts: ordered_sum(parts, self.dist)) if tree else None,
        )

    def header(self) -> dict[str, Any]:
        """The log's first record: settings, model, counts, build, provenance."""
        return {
            "config": self.cfg.to_dict(),
            "model_config": self.model_config.to_dict(),
            "params": self.model.num_params(),
            "params_non_embedding": self.model.num_params(non_embedding=True),
            "tokens_per_step": self.tokens_per_step,
            "world": self.dist.world,
            "flops_per_token": self.model.flops_per_token(self.cfg.inputs.context),
            "fingerprints": self.fingerprints,
            "init_from": self.init_from,
            **({"packing": self.packing} if self.packing else {}),
            "data_dir": str(self.data_dir.resolve()),
            "build": build_info(self.device),
            "git_commit": git_commit(),
            "argv": sys.argv,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }


def write_checkpoint(
    out: Path, step: int, meta: ckpt.CheckpointMeta, tensors: dict, cfg: TrainConfig
) -> None:
    """The checkpoint file (rotated), and with --keep-ckpts a weights-only snapshot beside it."""
    ckpt.save_checkpoint(out, step, meta, tensors, keep_last=cfg.run.keep_last)
    if cfg.run.keep_ckpts:
        header = ckpt.snapshot_header(meta)  # type: ignore[arg-type]
        ckpt.save_snapshot(out, step, ckpt.model_weights(tensors), header)


def run_tasks(cfg: TrainConfig) -> list[AnyTask]:
    """The run's --eval-tasks, read and checked (each file's lines: one line for a bad one)."""
    tasks = cfg.evaluation.eval_tasks
    return read_tasks(tasks, "eval_tasks") if tasks else []


def build_run(
    cfg: TrainConfig, model_flag: bool = False, tasks: list[AnyTask] | None = None
) -> Run:
    """Join the process group, then build every part in the order the bits depend on.
    `model_flag`: `--model` was typed, so `plan_init` checks it against the shape the run starts
    from (the source's, or that of the checkpoint found here: it is not read again). `tasks`:
    the --eval-tasks `run_tasks` read before the folder was claimed (None: read them here)."""
    dist, device = init_distributed(cfg.hardware.device, cfg.hardware.dist_timeout)
    check_shared_folder(Path(cfg.run.out), dist, device)  # before any rank reads a checkpoint
    # The one checkpoint a resume reads: the settings, the shape and the state all come from it.
    fsdp = dist.enabled and cfg.hardware.parallel == "fsdp"
    start = find_agreed(Path(cfg.run.out), dist, device, fsdp) if cfg.run.resume else None
    resumed = start.info if start else None
    cfg, notes = settle(cfg, resumed, dist, device)
    check_layout(cfg, dist.world)
    check_device_dtype(device, cfg.hardware.dtype)
    if device.type == "cpu":
        keep_freed_host_memory()
    configure_determinism(cfg.hardware.determinism_parts, device)
    data_dir, dataset, tokenizer = open_data(cfg)
    init = plan_init(cfg, tokenizer, resumed, model_flag)  # the source, unless resuming
    model_config, model = _build_model(cfg, tokenizer, init)
    model = _on_device(model, cfg, device)
    notes += init.notes if init else []
    wrapped = place_model(model, cfg, dist, device)
    # After wrapping: FSDP shards the parameters.
    optimizer = build_optimizer(model, cfg.optim, cfg.lr_schedule.lr)
    scaler = torch.amp.GradScaler(device.type) if cfg.hardware.dtype == "fp16" else None
    setup = step_setup(cfg, model, wrapped, optimizer, scaler, dist, device)
    inputs = build_inputs(cfg, dataset, tokenizer, dist)
    return Run(
        cfg=cfg,
        dist=dist,
        device=device,
        data_dir=data_dir,
        dataset=dataset,
        tokenizer=tokenizer,
        model_config=model_config,
        model=model,
        wrapped=wrapped,
        optimizer=optimizer,
        param_names=param_names(model, optimizer),
        scaler=scaler,
        sampler=inputs.sampler,
        val=inputs.val,
        val_sources=inputs.val_sources,
        tasks=run_tasks(cfg) if tasks is None else tasks,
        setup=setup,
        fingerprints={
            "config": cfg.fingerprint_for(dist.world),
            "data": inputs.fingerprint,
            "tokenizer": tokenizer.fingerprint,
        },
        saver=BackgroundSaver(cfg.run.async_checkpoint),
        notes=notes,
        init_from=init.record if init else None,
        packing=inputs.packing,
        start=start,
    )


def _on_device(model: GPT, cfg: TrainConfig, device: torch.device) -> GPT:
    """The built model on `device`, with how it runs there (no bit of its weights changes)."""
    model = model.to(device)
    model.activation_checkpointing = cfg.hardware.activation_checkpointing
    # --doc-mask on CUDA: FlexAttention's fused kernel (dropout, which flex lacks, keeps SDPA).
    model.flex_segments = cfg.inputs.doc_mask and device.type == "cuda" and cfg.shape.dropout == 0
    return model


def _build_model(
    cfg: TrainConfig, tokenizer: Tokenizer, init: InitPlan | None
) -> tuple[ModelConfig, GPT]:
    """The seeded model, with the --init-from weights copied in (on the CPU, before wrapping)."""
    # The vocabulary always comes from the data's tokenizer, the context from the config; the
    # rest of the shape from the --init-from source, else the preset under the config's keys.
    shape, sizes = cfg.shape, {"vocab_size": tokenizer.vocab_size, "context": cfg.inputs.context}
    sizes["dropout"] = shape.dropout
    model_config = init.model_config if init else preset(shape.model, **sizes, **shape.resolved())
    # Seeded right before the model is built: its init is a function of the seed alone. Nothing
    # above draws from a generator, and a resume overwrites every generator last.
    seed_everything(cfg.inputs.seed)
    model = GPT(model_config)
    if init is not None and init.weights is not None:
        # The source's weights overwrite the seeded init instead of skipping it: the init's
        # draws still happen, so every generator leaves the build in the state a fresh run of
        # this shape and seed leaves it (dropout masks, and anything drawn later, are the
        # same), and an init-from run differs from a fresh one in its weights alone.
        load_into(model, init.weights, str(cfg.run.init_from))
    return model_config, model


def check_resumable(run: Run, state: ckpt.RunState) -> list[str]:
    """Refuse a checkpoint of another run (config, data or tokenizer fingerprint), unless
    --allow-config-change accepts a changed config; notes for what is accepted."""
    notes = []
    for kind in ("config", "data", "tokenizer"):
        if state["fingerprints"][kind] == run.fingerprints[kind]:
            continue
        detail, fix = "", "resume with the original settings, or start a new run in another --out"
        if kind == "config":
            changes = "; ".join(
                trajectory_changes(state["trajectory"], run.cfg.trajectory(run.dist.world))
            )
            if run.cfg.run.allow_config_change:
                notes.append(
                    f"config changed ({changes}) by --allow-config-change: this run is no longer "
                    "exact"
                )
                continue
            detail = ": " + changes
            fix += " (or pass --allow-config-change to continue deliberately)"
        if kind == "data" and run.val_sources:
            # Other weights would draw other samples from here on: not the run that was started.
            detail = ": a mixture's datasets and weights are part of it, and cannot change mid-run"
        raise ResumeError(
            f"the checkpoint in {run.out} has another {kind} fingerprint{detail}", fix
        )
    return notes + build_notes(state["build"], build_info(run.device))


def resume(run: Run) -> tuple[Path, list[str]] | None:
    """Load the checkpoint `build_run` found into `run`; None when there is none. Returns the
    file and the notes for the log (fallbacks, accepted changes, re-seeding)."""
    found, run.start = run.start, None  # its tensors are not kept beside the loaded ones
    if found is None:
        return None
    state = found.info.run_state(found.tensors)
    notes = run.notes + found.notes + check_resumable(run, state)
    return found.path, notes + run.load_state_dict(state)
