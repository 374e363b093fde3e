"""One run's objects: device, data, model, optimizer, sampler, and the checkpoint that holds
all of their state (what `state_dict` is to a module, `Run.save`/`Run.resume` are to a run).

Also the run-folder lock, and the small pure helpers the loop and the tools share.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from octlm.config import TrainConfig, changed_keys
from octlm.data.blocks import TokenBlocks, make_blocks
from octlm.data.corpus import read_documents
from octlm.data.order import Sampler, validation_starts
from octlm.data.shards import ShardDataset
from octlm.errors import OctlmError
from octlm.evaluate import block_batches, evaluate_batches, stream_batches
from octlm.hashing import sha256_bytes, sha256_json
from octlm.model import GPT, preset
from octlm.tokenizer import Tokenizer
from octlm.train import checkpoint as ckpt
from octlm.train.distributed import (
    all_reduce_sum,
    barrier,
    full_model_state,
    full_optim_state,
    gather_objects,
    init_distributed,
    load_full_state,
    sync_context,
    wrap_model,
)
from octlm.train.optim import build_optimizer, param_names
from octlm.train.saver import BackgroundSaver
from octlm.train.state import TrainState, capture_rng, restore_rng

# Dense bf16 peaks (FLOP/s) for MFU; a device not listed needs --peak-tflops.
GPU_PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "4090": 165e12}


class ResumeError(OctlmError):
    """A checkpoint that does not belong to this run."""


def embedded_data_dir(vocab_size: int) -> Path:
    """Where the embedded corpus is prepared on first use (per vocabulary size)."""
    root = os.environ.get("OCTLM_CACHE") or Path.home() / ".cache" / "octlm"
    return Path(root) / f"shakespeare-v{vocab_size}"


def resolve_data(cfg: TrainConfig) -> Path:
    if cfg.data is not None:
        return Path(cfg.data)
    vocab = preset(cfg.model).vocab_size
    path = embedded_data_dir(vocab)
    if not (path / "manifest.json").is_file():
        from octlm.data.prepare import PrepareConfig, prepare

        print(f"preparing the embedded corpus (vocabulary {vocab}) in {path}", file=sys.stderr)
        prepare(PrepareConfig(out=path, vocab_size=vocab, context=1024, force=True))
    return path


def configure_determinism(cfg: TrainConfig, device: torch.device) -> None:
    if not cfg.deterministic:
        return
    if device.type == "cuda":
        # cuBLAS needs a fixed workspace to pick reproducible reduction orders.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def peak_flops(cfg: TrainConfig, device: torch.device) -> float | None:
    """--peak-tflops, else the peak `octlm bench peak` measured on this machine, else a table of
    known GPUs; None (no MFU in the log) when none applies."""
    from octlm.peak import measured_peak

    if cfg.peak_tflops:
        return cfg.peak_tflops * 1e12
    measured = measured_peak(device, cfg.dtype)
    if measured:
        return measured
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in GPU_PEAK_FLOPS.items() if k in name), None)
    return None


class Run:
    """The objects of one run, and the checkpoint that captures all of their state."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.out = Path(cfg.out)
        self.dist, self.device = init_distributed(cfg.device)
        self.notes: list[str] = []
        self.cfg = cfg = self._elastic(cfg) if cfg.resume else cfg
        configure_determinism(cfg, self.device)
        self.data_dir = resolve_data(cfg)
        self.dataset = ShardDataset.open(self.data_dir)
        self.tokenizer = Tokenizer.load(self.dataset.tokenizer_path)
        if self.tokenizer.fingerprint != self.dataset.tokenizer_fingerprint:
            raise OctlmError(
                f"{self.dataset.tokenizer_path} does not match the manifest's tokenizer",
                "re-run `octlm prepare`",
            )
        # The vocabulary always comes from the data's tokenizer, the context from the config.
        self.model_config = preset(
            cfg.model,
            vocab_size=self.tokenizer.vocab_size,
            context=cfg.context,
            dropout=cfg.dropout,
        )
        seed_everything(cfg.seed)
        self.model = GPT(self.model_config).to(self.device)
        self.wrapped = wrap_model(self.model, self.dist, cfg.parallel, self.device)
        self.forward = torch.compile(self.wrapped) if cfg.compile else self.wrapped
        self.optimizer = build_optimizer(self.model, cfg)  # after wrapping: FSDP shards params
        self.sync = sync_context(self.wrapped, self.dist, cfg.parallel, cfg.accum)
        self.scaler = torch.amp.GradScaler(self.device.type) if cfg.dtype == "fp16" else None
        self.blocks = None
        data_fingerprint = self.dataset.fingerprint
        if cfg.blocks:  # the first seed's in-memory path, PAD-masked
            texts = [d.text for d in read_documents([cfg.blocks])]
            self.blocks = make_blocks(texts, self.tokenizer, cfg.context)
            if cfg.overfit_blocks:
                n = cfg.overfit_blocks
                self.blocks = TokenBlocks(
                    self.blocks.inputs[:n], self.blocks.targets[:n], self.blocks.byte_lengths[:n]
                )
            data_fingerprint = sha256_json(
                {
                    "tokenizer": self.tokenizer.fingerprint,
                    "blocks": sha256_bytes(
                        self.blocks.inputs.numpy().tobytes() + self.blocks.targets.numpy().tobytes()
                    ),
                }
            )
        try:
            self.sampler = Sampler(
                self.blocks if self.blocks is not None else self.dataset.train,
                seed=cfg.seed,
                context=cfg.context,
                micro_batch=cfg.micro_batch,
                accum=cfg.accum,
                overfit_blocks=cfg.overfit_blocks,
                rank=self.dist.rank,
                world=self.dist.world,
            )
        except ValueError as exc:
            raise OctlmError(str(exc), "use more data or a shorter --context") from None
        self.state = TrainState()
        self.saver = BackgroundSaver(cfg.async_checkpoint)
        if cfg.overfit_blocks:  # validate on the memorised blocks themselves
            self.val_stream = self.dataset.train
            self.val_starts = np.arange(cfg.overfit_blocks, dtype=np.int64) * (cfg.context + 1)
        else:
            self.val_stream = self.dataset.val
            n = cfg.val_batches * cfg.micro_batch
            self.val_starts = validation_starts(len(self.dataset.val), cfg.context, n)
        self.fingerprints = {
            "config": cfg.fingerprint_for(self.dist.world),
            "data": data_fingerprint,
            "tokenizer": self.tokenizer.fingerprint,
        }

    # -- checkpoint ---------------------------------------------------------------------------
    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's weights (collective under FSDP; only rank 0 gets them)."""
        return full_model_state(self.model, self.dist, self.cfg.parallel)

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.tokens_per_step * self.dist.world

    def _elastic(self, cfg: TrainConfig) -> TrainConfig:
        """Resuming with another world size: keep the global batch by adjusting accumulation."""
        meta = ckpt.peek_newest_meta(self.out)
        if meta is None or meta.get("world", 1) == self.dist.world:
            return cfg
        total = meta["trajectory"]["accum"]  # micro-batches per step over all ranks
        if total % self.dist.world:
            raise ResumeError(
                f"the checkpoint's {total} micro-batches per step do not split over "
                f"{self.dist.world} processes",
                "resume with a process count that divides it",
            )
        self.notes.append(
            f"checkpoint written by {meta.get('world', 1)} process(es), resumed by "
            f"{self.dist.world}: --accum set to {total // self.dist.world} to keep the global "
            "batch; the data order continues, but sums run in another order (not bitwise)"
        )
        return cfg.replace(accum=total // self.dist.world)

    def checkpoint_meta_and_tensors(
        self, private: bool = False
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Collective with several ranks (every rank's RNG state is gathered). The tensors are
        the live ones (weights, AdamW moments) unless `private`: then host copies that later
        steps cannot change, and metadata that shares no object with the run."""
        names = param_names(self.model)
        optim_sd = full_optim_state(self.model, self.optimizer, self.dist, self.cfg.parallel, names)
        optim_meta, optim_tensors = ckpt.optimizer_to_flat(optim_sd)
        ranks = gather_objects(capture_rng(), self.dist)
        rng_meta, rng_tensors = ranks[0]  # type: ignore[misc]
        tensors = {
            f"model.{k}": v.detach().contiguous() for k, v in self.full_model_state().items()
        }
        tensors.update(optim_tensors)
        tensors.update({f"rng.{k}": v for k, v in rng_tensors.items()})
        for r, (_, other) in enumerate(ranks[1:], start=1):  # type: ignore[misc]
            tensors.update({f"rng{r}.{k}": v for k, v in other.items()})
        meta = {
            "train_state": self.state.state_dict(),
            "sampler": self.sampler.state_dict(),
            "optimizer": optim_meta,
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "rng": rng_meta,
            "fingerprints": self.fingerprints,
            "trajectory": self.cfg.trajectory(self.dist.world),
            "config": self.cfg.to_dict(),
            "model_config": self.model_config.to_dict(),
            "data_dir": str(self.data_dir.resolve()),
            "build": ckpt.build_info(self.device),
            "world": self.dist.world,
            "rng_ranks": [m for m, _ in ranks[1:]],  # type: ignore[misc]
        }
        if private:
            tensors = {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}
            meta = json.loads(json.dumps(meta))  # also fails here, not in a thread, if not JSON
        return meta, tensors

    def save(self) -> None:
        """Checkpoint the run as it is now: written before this returns, or (async_checkpoint)
        from a private copy in the background; `self.saver.wait()` waits for it."""
        background = self.saver.background and self.dist.is_main
        meta, tensors = self.checkpoint_meta_and_tensors(private=background)
        if not self.dist.is_main:  # one file, written by rank 0; the others go on
            barrier(self.dist)
            return
        step = self.state.step
        self.saver.submit(lambda: self._write(step, meta, tensors))
        barrier(self.dist)

    def _write(self, step: int, meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        ckpt.save_checkpoint(self.out, step, meta, tensors, keep_last=self.cfg.keep_last)
        if self.cfg.keep_ckpts:
            model_tensors = {
                k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")
            }
            ckpt.save_snapshot(
                self.out,
                step,
                model_tensors,
                {
                    "format": "octlm-snapshot",
                    "format_version": ckpt.FORMAT_VERSION,
                    "train_state": meta["train_state"],
                    "model_config": meta["model_config"],
                    "fingerprints": self.fingerprints,
                    "data_dir": meta["data_dir"],
                },
            )

    def resume(self) -> tuple[Path, list[str]] | None:
        """Load the newest valid checkpoint in `out`; None when there is none yet."""
        found = ckpt.load_newest_valid(self.out)
        if found is None:
            return None
        path, meta, tensors, notes = found
        for kind in ("config", "data", "tokenizer"):
            if meta["fingerprints"][kind] == self.fingerprints[kind]:
                continue
            detail = ""
            if kind == "config":
                changes = changed_keys(meta["trajectory"], self.cfg.trajectory(self.dist.world))
                detail = ": " + "; ".join(changes)
                if self.cfg.allow_config_change:
                    notes.append(
                        f"config changed ({'; '.join(changes)}) by "
                        "--allow-config-change: this run is no longer exact"
                    )
                    continue
            fix = "resume with the original settings, or start a new run in another --out"
            if kind == "config":
                fix += " (or pass --allow-config-change to continue deliberately)"
            raise ResumeError(
                f"the checkpoint in {self.out} has another {kind} fingerprint{detail}", fix
            )
        build = ckpt.build_info(self.device)
        if meta["build"] != build:
            diff = changed_keys(meta["build"], build)
            notes.append(
                "resuming on a different build (" + "; ".join(diff) + "): bitwise "
                "equality with an uninterrupted run is no longer promised"
            )
        load_full_state(
            self.model,
            self.optimizer,
            ckpt.split_tensors(tensors, "model."),
            ckpt.optimizer_from_flat(meta["optimizer"], ckpt.split_tensors(tensors, "optim.")),
            self.dist,
            self.cfg.parallel,
            param_names(self.model),
        )
        if self.scaler is not None and meta["scaler"]:
            self.scaler.load_state_dict(meta["scaler"])
        self.state.load_state_dict(meta["train_state"])
        self.sampler.load_state_dict(meta["sampler"])
        notes = self.notes + notes
        # Last: nothing may draw after. Each rank gets its own generators back.
        if meta.get("world", 1) == self.dist.world:
            r = self.dist.rank
            rng_meta = meta["rng"] if r == 0 else meta["rng_ranks"][r - 1]
            prefix = "rng." if r == 0 else f"rng{r}."
            restore_rng(rng_meta, ckpt.split_tensors(tensors, prefix))
        else:  # no state for this rank layout: derive fresh, distinct generators
            seed_everything(self.cfg.seed * 1000 + self.dist.rank + self.state.step)
            notes.append("random generators re-seeded for the new process count")
        return path, notes

    def header(self) -> dict[str, Any]:
        return {
            "config": self.cfg.to_dict(),
            "model_config": self.model_config.to_dict(),
            "params": self.model.num_params(),
            "params_non_embedding": self.model.num_params(non_embedding=True),
            "tokens_per_step": self.tokens_per_step,
            "world": self.dist.world,
            "flops_per_token": self.model.flops_per_token(self.cfg.context),
            "fingerprints": self.fingerprints,
            "data_dir": str(self.data_dir.resolve()),
            "build": ckpt.build_info(self.device),
            "git_commit": git_commit(),
            "argv": sys.argv,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def validate(self):
        # DDP: each rank scores its share with the plain module (no collectives in forward) and
        # the totals are summed. FSDP must run the sharded module on every rank in lockstep,
        # so each rank scores everything.
        split = self.dist.enabled and self.cfg.parallel == "ddp"
        model = self.model if split else self.forward
        reduce = (lambda t: all_reduce_sum(t, self.dist)) if split else None
        rank, world = (self.dist.rank, self.dist.world) if split else (0, 1)
        if self.blocks is not None:  # the blocks are their own validation set
            mine = TokenBlocks(
                *(
                    t[rank::world]
                    for t in (self.blocks.inputs, self.blocks.targets, self.blocks.byte_lengths)
                )
            )
            return evaluate_batches(
                model,
                block_batches(mine, self.cfg.micro_batch),
                reduce_sum=reduce,
                token_bytes=self.tokenizer.token_bytes_table,
                device=self.device,
                dtype=self.cfg.dtype,
            )
        return evaluate_batches(
            model,
            stream_batches(
                self.val_stream,
                self.val_starts[rank::world],
                self.cfg.context,
                self.cfg.micro_batch,
            ),
            token_bytes=self.tokenizer.token_bytes_table,
            device=self.device,
            dtype=self.cfg.dtype,
            reduce_sum=reduce,
        )


def _has_run(out: Path) -> bool:
    return bool(ckpt.read_latest(out)) or (out / "log.jsonl").exists()


class RunLock:
    """An OS lock on `OUT/.lock` for as long as a trainer uses the folder. The kernel drops it
    when the process dies, so a lock left by a killed trainer never blocks a resume."""

    def __init__(self, out: Path) -> None:
        self.path = out / ".lock"
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OctlmError(
                f"{self.path.parent} is in use by another trainer (pid {holder})",
                "wait for it to finish, or choose another --out",
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None
