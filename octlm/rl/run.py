"""One RL run's parts, built from its source (a new run) or from its own checkpoint (a resume).

The state a checkpoint must hold is small: the weights, the optimizer's tensors, the step and
the counters. Nothing else carries over from one step to the next: a step's prompts and reply
seeds are functions of (seed, step), its learning rate of the step, and the only global draws
(dropout, in the update) are seeded per prompt. So an RL checkpoint has no generator states.

The checkpoint is the training checkpoint's format (`octlm/trainer/checkpoint.py`), with a
`kind` of "rl" and the RL settings under `rl`: `octlm chat`, `eval`, `generate`, `export` and
`merge` read an RL run as they read a fine-tune, and `octlm train` refuses to continue one."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from octlm.config.learning import OptimSettings
from octlm.config.rl import ABSENT, RLConfig
from octlm.config.shape import ModelConfig
from octlm.config.train import TrainConfig
from octlm.data.chat_format import check_chat_dataset
from octlm.device import build_info, build_notes
from octlm.errors import OctlmError, ResumeError
from octlm.generation.trained import load_weights, run_dataset
from octlm.hashing import weights_sha256
from octlm.model.gpt import GPT
from octlm.rl.rollout import prompt_ids
from octlm.rl.tasks import Task, get_task
from octlm.runlog.writer import git_commit
from octlm.tokenizer.core import Tokenizer
from octlm.trainer import checkpoint as ckpt
from octlm.trainer.distributed import DistInfo, barrier, init_distributed
from octlm.trainer.fold import block_ok, worlds_for
from octlm.trainer.optim import build_optimizer
from octlm.trainer.reduction import TreeReducer
from octlm.trainer.resume import load_newest_valid
from octlm.trainer.saver import BackgroundSaver
from octlm.trainer.source_identity import other_source, source_folder
from octlm.trainer.state import configure_determinism

KIND = "rl"
MARKER = ckpt.RL_RECORD
"""In an RL run's folder from its start: `octlm train` refuses the folder, `octlm rl` knows it."""


@dataclass
class RLRun:
    settings: RLConfig
    dist: DistInfo
    device: torch.device
    task: Task
    tokenizer: Tokenizer
    model: GPT
    model_config: dict[str, Any]
    optimizer: torch.optim.Optimizer
    optim: dict[str, Any]
    """The optimizer's settings (the source run's section, at the RL learning rate)."""
    reducer: TreeReducer
    dtype: str
    source: dict[str, Any]
    """The source model: its file, the step it was saved at, its weights' sha256."""
    fingerprints: dict[str, str]
    data_dir: str
    step: int = 0
    elapsed: float = 0.0
    sampled_tokens: int = 0
    skipped_steps: int = 0
    """Steps whose loss or gradient norm was not finite, skipped (--skip-nonfinite)."""
    notes: list[str] = dataclasses.field(default_factory=list)
    saver: BackgroundSaver = dataclasses.field(default_factory=lambda: BackgroundSaver(True))

    @property
    def out(self) -> Path:
        return Path(self.settings.out)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def meta_and_tensors(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """The checkpoint's metadata and tensors (every process holds the same: rank 0's)."""
        tensors = {f"{ckpt.MODEL_PREFIX}{k}": v.contiguous() for k, v in self.weights().items()}
        optim_meta, optim_tensors = ckpt.optimizer_to_flat(self.optimizer)
        tensors.update(optim_tensors)
        meta = {
            "kind": KIND,
            "rl": self.settings.to_dict(),
            "task_version": self.task.version,
            "trajectory": self.settings.trajectory(),
            "fingerprints": self.fingerprints,
            "model_config": self.model_config,
            "data_dir": self.data_dir,
            "world": self.dist.world,
            "build": build_info(self.device),
            "init_from": self.source,
            "optim": self.optim,
            "dtype": self.dtype,
            ckpt.OPTIMIZER: optim_meta,
            ckpt.TRAIN_STATE: {
                "step": self.step,
                "elapsed": self.elapsed,
                "sampled_tokens": self.sampled_tokens,
                # Only a run that skipped a step records the count: the others keep the bytes
                # RL checkpoints always had.
                **({"skipped_steps": self.skipped_steps} if self.skipped_steps else {}),
            },
        }
        return meta, tensors

    def save(self) -> None:
        """Checkpoint the run as it is now, from a private host copy written in the background
        (as training's async_checkpoint); `self.saver.wait()` waits for it."""
        if self.dist.is_main:
            meta, tensors = ckpt.host_copy(*self.meta_and_tensors())
            out, step, keep = self.out, self.step, self.settings.run.keep_last
            self.saver.submit(
                lambda: ckpt.save_checkpoint(out, step, meta, tensors, keep_last=keep)
            )
        barrier(self.dist)

    def header(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "rl": self.settings.to_dict(),
            "model_config": self.model_config,
            "params": self.model.num_params(),
            "world": self.dist.world,
            "source": self.source,
            "optim": self.optim,
            "dtype": self.dtype,
            "fingerprints": self.fingerprints,
            "data_dir": self.data_dir,
            "build": build_info(self.device),
            "git_commit": git_commit(),
            "argv": sys.argv,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }


def check_world(prompts: int, world: int) -> None:
    """Each process must hold whole subtrees of the step's fold over its prompts."""
    if block_ok(prompts, world):
        return
    can = ", ".join(str(w) for w in worlds_for(prompts))
    raise OctlmError(
        f"{world} processes cannot share {prompts} prompts in the update's fixed tree",
        f"use {can} process(es) for --prompts {prompts}, or another --prompts",
    )


def _source_settings(info: ckpt.CheckpointInfo, lr: float) -> tuple[OptimSettings, str, list[str]]:
    """The source run's optimizer section at the RL rate, and its dtype (notes: defaults used)."""
    written = info.as_written()
    if written.get("kind") == KIND:  # RL after RL: the first one's settings
        optim = OptimSettings(**written["optim"])
        ratio = lr / written["rl"]["lr"]  # its rates, at this run's: muon_lr / lr is kept
        return dataclasses.replace(optim, muon_lr=optim.muon_lr * ratio), written["dtype"], []
    if info.config is None:  # a snapshot, an export's or a merge's weights: no run settings
        note = f"{info.path} records no training settings: AdamW with octlm's defaults, fp32"
        return dataclasses.replace(OptimSettings(), fused=True), "fp32", [note]
    source = TrainConfig(**info.config)
    optim = source.optim
    if optim.optimizer == "muon":  # the matrices keep the source's muon_lr / lr ratio
        optim = dataclasses.replace(optim, muon_lr=optim.muon_lr * lr / source.lr_schedule.lr)
    if optim.fused is None:
        optim = dataclasses.replace(optim, fused=True)
    return optim, source.hardware.dtype, []


def _check_source(conf: RLConfig, info: ckpt.CheckpointInfo) -> None:
    """The source must know the chat format its prompts are written in (an RL run's source
    did: its dataset is the fine-tune's)."""
    check_chat_dataset(run_dataset(info).manifest, conf.source)


def check_lengths(conf: RLConfig, task: Task, tokenizer: Tokenizer, context: int) -> None:
    """A prompt and its longest reply must fit the model's context: checked on the held-out
    prompts and the first step's, before anything is written."""
    problems = [task.problem(conf.seed, 0, p) for p in range(conf.prompts)]
    problems += task.heldout(conf.eval_prompts)
    longest = max(len(prompt_ids(tokenizer, p)) for p in problems)
    if longest >= context:  # no --max-new-tokens helps: the prompt leaves no room for a reply
        raise OctlmError(
            f"a prompt of task {task.name} is {longest} tokens, which alone fills the model's "
            f"context of {context}",
            "use a task of shorter prompts, or a model trained with a longer --context",
        )
    if longest + conf.max_new_tokens > context:
        raise OctlmError(
            f"--max-new-tokens {conf.max_new_tokens} after a prompt of {longest} tokens runs past "
            f"the model's context of {context}",
            f"use --max-new-tokens {max(1, context - longest)} or less",
        )


@dataclass(frozen=True)
class Start:
    """Where the weights and settings come from: the source (a new run) or the checkpoint."""

    info: ckpt.CheckpointInfo
    weights: dict[str, torch.Tensor]
    optim: OptimSettings
    dtype: str
    source: dict[str, Any]
    fingerprints: dict[str, str]
    data_dir: str
    notes: list[str]
    state: dict[str, Any] | None = None
    """The checkpoint's counters and optimizer (None for a new run)."""


def _from_checkpoint(conf: RLConfig, found: Any, device: torch.device) -> Start:
    meta = found.info.as_written()
    _check_resumable(conf, meta)
    return Start(
        info=found.info,
        weights=ckpt.model_weights(found.tensors),
        optim=OptimSettings(**meta["optim"]),
        dtype=meta["dtype"],
        source=meta["init_from"],
        fingerprints=meta["fingerprints"],
        data_dir=meta["data_dir"],
        notes=[*found.notes, *build_notes(meta["build"], build_info(device))],
        state={
            "counters": meta[ckpt.TRAIN_STATE],
            "optimizer": ckpt.optimizer_from_flat(
                meta[ckpt.OPTIMIZER], ckpt.optimizer_tensors(found.tensors)
            ),
        },
    )


def _from_source(conf: RLConfig) -> Start:
    info, weights = load_weights(conf.source)
    _check_source(conf, info)
    optim, dtype, notes = _source_settings(info, conf.lr)
    source = {
        "path": str(info.path.resolve()),
        "kind": "rl source",
        "step": info.step,
        "weights_sha256": weights_sha256(weights),
    }
    fingerprints = {
        "config": conf.fingerprint(source),
        "tokenizer": info.fingerprints.get("tokenizer", ""),
        "data": info.fingerprints.get("data", ""),
    }
    data_dir = str(info.data_dir or "")
    return Start(info, weights, optim, dtype, source, fingerprints, data_dir, notes)


def build(conf: RLConfig) -> RLRun:
    """Join the process group, open the source (or this run's checkpoint), build the parts."""
    task = get_task(conf.task)
    dist, device = init_distributed(conf.device, conf.dist_timeout)
    check_world(conf.prompts, dist.world)
    found = load_newest_valid(Path(conf.out)) if conf.resume else None
    # The sampler settled before the fingerprint or the resume check reads the trajectory.
    conf = conf.resolved((found.info.as_written().get("trajectory") or {}) if found else None)
    start = _from_checkpoint(conf, found, device) if found else _from_source(conf)
    tokenizer = _tokenizer(start.info, start.data_dir)
    model_config = dict(start.info.model_config or {})
    configure_determinism((), device)
    model = GPT(ModelConfig.from_dict(model_config))
    model.load_state_dict(start.weights)
    model.to(device)
    check_lengths(conf, task, tokenizer, model.config.context)
    optimizer = build_optimizer(model, start.optim, conf.lr)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    run = RLRun(
        settings=conf,
        dist=dist,
        device=device,
        task=task,
        tokenizer=tokenizer,
        model=model,
        model_config=model_config,
        optimizer=optimizer,
        optim=dataclasses.asdict(start.optim),
        reducer=TreeReducer(params, dist, fsdp=False),
        dtype=start.dtype,
        source=start.source,
        fingerprints=start.fingerprints,
        data_dir=start.data_dir,
        notes=start.notes,
    )
    if start.state is not None:
        run.optimizer.load_state_dict(start.state["optimizer"])
        counters = start.state["counters"]
        run.step, run.elapsed = int(counters["step"]), float(counters["elapsed"])
        run.sampled_tokens = int(counters["sampled_tokens"])
        run.skipped_steps = int(counters.get("skipped_steps", 0))
    return run


def _tokenizer(info: ckpt.CheckpointInfo, data_dir: str) -> Tokenizer:
    from octlm.generation.trained import run_tokenizer

    return run_tokenizer(info, data_dir or None)


def _check_resumable(conf: RLConfig, meta: dict[str, Any]) -> None:
    """Refuse, in one line, to continue an RL run with other settings or another source."""
    if meta.get("kind") != KIND:
        raise ResumeError(
            f"{conf.out} holds a training run, not an RL run",
            "continue it with octlm train --resume, or give octlm rl another --out",
        )
    # A key added after runs existed is absent where it holds its old meaning (`ABSENT`): on
    # either side, so a run recorded with it is not continued by settings that drop it.
    was = {**ABSENT, **meta["trajectory"]}
    now = {**ABSENT, **json.loads(json.dumps(conf.trajectory()))}
    keys = [k for k in now | was if was.get(k) != now.get(k)]
    changed = [f"{k}: {was.get(k)!r} -> {now.get(k)!r}" for k in keys]
    if changed:
        raise ResumeError(
            f"the RL run in {conf.out} was started with other settings ({'; '.join(changed)})",
            "resume with the run's own settings, or start a new run in another --out",
        )
    version = get_task(conf.task).version
    if meta.get("task_version") != version:
        raise ResumeError(
            f"the RL run in {conf.out} drew its problems from {meta.get('task_version')}, this "
            f"octlm from {version}: the run would not continue on the same problems",
            "resume with the octlm (or reasoning-gym) the run started with",
        )
    given, file = meta["rl"]["source"], meta["init_from"]["path"]
    sha256 = meta["init_from"].get("weights_sha256")
    other = other_source(str(conf.source), given, file, sha256, _source_weights_sha256)
    if other is not None:
        raise ResumeError(
            f"the RL run in {conf.out} started from {other}",
            f"resume with {source_folder(file)} as the run to start from",
        )


def _source_weights_sha256(source: str) -> str:
    return weights_sha256(load_weights(source)[1])
