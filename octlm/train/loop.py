"""`octlm train`: build, maybe resume, then step, log, validate, checkpoint, check for a stop.

Everything the next step depends on is either a pure function of the step (learning rate,
data order) or restored from the checkpoint (weights, AdamW moments, scaler, every RNG), so a
run stopped anywhere and resumed in a new process ends with the same bits as a straight run.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from octlm.config import TrainConfig, changed_keys
from octlm.data.blocks import TokenBlocks, make_blocks
from octlm.data.corpus import read_documents
from octlm.data.order import Sampler, validation_starts
from octlm.data.shards import ShardDataset
from octlm.errors import OctlmError
from octlm.evaluate import block_batches, evaluate, evaluate_batches
from octlm.hashing import sha256_bytes, sha256_json, weights_sha256
from octlm.model import GPT, ModelConfig, preset
from octlm.runlog import RunLog
from octlm.tokenizer import Tokenizer
from octlm.train import checkpoint as ckpt
from octlm.train.optim import build_optimizer
from octlm.train.schedule import learning_rate
from octlm.train.state import TrainState, capture_rng, restore_rng
from octlm.train.step import NonFiniteError, train_step

# Dense bf16 peaks (FLOP/s) for MFU; a device not listed needs --peak-tflops.
GPU_PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "4090": 165e12}


class ResumeError(OctlmError):
    """A checkpoint that does not belong to this run."""


@dataclass(frozen=True)
class TrainResult:
    step: int
    weights_sha256: str | None
    stopped_early: bool
    last_loss: float | None


class StopFlag:
    """SIGINT/SIGTERM: finish the current step, checkpoint, exit 0. A second signal exits now."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested is not None:
            os._exit(128 + signum)  # the last complete checkpoint stays as it is
        self.requested = signal.Signals(signum).name
        print(f"\n{self.requested}: finishing this step, then checkpointing", file=sys.stderr)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise OctlmError(f"device {name} requested but CUDA is not available", "use --device cpu")
    return device


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
    if cfg.peak_tflops:
        return cfg.peak_tflops * 1e12
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((v for k, v in GPU_PEAK_FLOPS.items() if k in name), None)
    return None


class Run:
    """The objects of one run, and the checkpoint that captures all of their state."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.device = resolve_device(cfg.device)
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
        self.forward = torch.compile(self.model) if cfg.compile else self.model
        self.optimizer = build_optimizer(self.model, cfg)
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
            )
        except ValueError as exc:
            raise OctlmError(str(exc), "use more data or a shorter --context") from None
        self.state = TrainState()
        if cfg.overfit_blocks:  # validate on the memorised blocks themselves
            self.val_stream = self.dataset.train
            self.val_starts = np.arange(cfg.overfit_blocks, dtype=np.int64) * (cfg.context + 1)
        else:
            self.val_stream = self.dataset.val
            n = cfg.val_batches * cfg.micro_batch
            self.val_starts = validation_starts(len(self.dataset.val), cfg.context, n)
        self.fingerprints = {
            "config": cfg.fingerprint,
            "data": data_fingerprint,
            "tokenizer": self.tokenizer.fingerprint,
        }

    # -- checkpoint ---------------------------------------------------------------------------
    def checkpoint_meta_and_tensors(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        optim_meta, optim_tensors = ckpt.optimizer_to_flat(self.optimizer)
        rng_meta, rng_tensors = capture_rng()
        tensors = {
            f"model.{k}": v.detach().contiguous() for k, v in self.model.state_dict().items()
        }
        tensors.update(optim_tensors)
        tensors.update({f"rng.{k}": v for k, v in rng_tensors.items()})
        meta = {
            "train_state": self.state.state_dict(),
            "sampler": self.sampler.state_dict(),
            "optimizer": optim_meta,
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "rng": rng_meta,
            "fingerprints": self.fingerprints,
            "trajectory": self.cfg.trajectory(),
            "config": self.cfg.to_dict(),
            "model_config": self.model_config.to_dict(),
            "data_dir": str(self.data_dir.resolve()),
            "build": ckpt.build_info(self.device),
        }
        return meta, tensors

    def save(self) -> Path:
        meta, tensors = self.checkpoint_meta_and_tensors()
        path = ckpt.save_checkpoint(
            self.out, self.state.step, meta, tensors, keep_last=self.cfg.keep_last
        )
        if self.cfg.keep_ckpts:
            model_tensors = {
                k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")
            }
            ckpt.save_snapshot(
                self.out,
                self.state.step,
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
        return path

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
                changes = changed_keys(meta["trajectory"], self.cfg.trajectory())
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
        self.model.load_state_dict(ckpt.split_tensors(tensors, "model."))
        self.optimizer.load_state_dict(
            ckpt.optimizer_from_flat(meta["optimizer"], ckpt.split_tensors(tensors, "optim."))
        )
        if self.scaler is not None and meta["scaler"]:
            self.scaler.load_state_dict(meta["scaler"])
        self.state.load_state_dict(meta["train_state"])
        self.sampler.load_state_dict(meta["sampler"])
        restore_rng(
            meta["rng"], ckpt.split_tensors(tensors, "rng.")
        )  # last: nothing may draw after
        return path, notes

    def header(self) -> dict[str, Any]:
        return {
            "config": self.cfg.to_dict(),
            "model_config": self.model_config.to_dict(),
            "params": self.model.num_params(),
            "params_non_embedding": self.model.num_params(non_embedding=True),
            "tokens_per_step": self.cfg.tokens_per_step,
            "flops_per_token": self.model.flops_per_token(self.cfg.context),
            "fingerprints": self.fingerprints,
            "data_dir": str(self.data_dir.resolve()),
            "build": ckpt.build_info(self.device),
            "git_commit": git_commit(),
            "argv": sys.argv,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def validate(self):
        if self.blocks is not None:  # the blocks are their own validation set
            return evaluate_batches(
                self.forward,
                block_batches(self.blocks, self.cfg.micro_batch),
                token_bytes=self.tokenizer.token_bytes_table,
                device=self.device,
                dtype=self.cfg.dtype,
            )
        return evaluate(
            self.forward,
            self.val_stream,
            self.val_starts,
            context=self.cfg.context,
            micro_batch=self.cfg.micro_batch,
            token_bytes=self.tokenizer.token_bytes_table,
            device=self.device,
            dtype=self.cfg.dtype,
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


def train(cfg: TrainConfig, log_enabled: bool = True) -> TrainResult:
    out = Path(cfg.out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with RunLock(out):
            return _train_locked(cfg, out, log_enabled)
    except BaseException:
        # A run that failed before writing anything leaves no empty folder behind.
        if created and {p.name for p in out.iterdir()} <= {".lock"}:
            shutil.rmtree(out, ignore_errors=True)
        raise


def _train_locked(cfg: TrainConfig, out: Path, log_enabled: bool) -> TrainResult:
    if not cfg.resume and _has_run(out):
        raise OctlmError(
            f"{out} already holds a run", "pass --resume to continue it, or choose another --out"
        )
    ckpt.remove_stale_temps(out)
    run = Run(cfg)
    log = RunLog(out, enabled=log_enabled)
    resumed = run.resume() if cfg.resume else None
    if resumed is None:
        log.path.unlink(missing_ok=True)  # a log without a checkpoint holds nothing to keep
        log.open()
        log.write("header", **run.header())
        if cfg.resume:
            print(f"no checkpoint in {out} yet: starting fresh", file=sys.stderr)
    else:
        path, notes = resumed
        log.truncate_after(run.state.step)
        log.open()
        for note in notes:
            print(f"octlm: note: {note}", file=sys.stderr)
        log.write(
            "event",
            event="resume",
            step=run.state.step,
            checkpoint=str(path),
            build=ckpt.build_info(run.device),
            notes=notes,
        )
        print(f"resumed from {path} at step {run.state.step}", file=sys.stderr)
    try:
        return _loop(run, log)
    finally:
        log.close()


def _loop(run: Run, log: RunLog) -> TrainResult:
    cfg, state = run.cfg, run.state
    flops = run.model.flops_per_token(cfg.context)
    peak = peak_flops(cfg, run.device)
    end_step = cfg.stop_at if cfg.stop_at is not None else cfg.steps
    session_start, elapsed_before = time.perf_counter(), state.elapsed
    bar = tqdm(
        total=cfg.steps,
        initial=state.step,
        desc="train",
        unit="step",
        disable=None if cfg.progress is None else not cfg.progress,
        dynamic_ncols=True,
    )
    last_loss: float | None = None
    with StopFlag() as stop, bar:
        while state.step < end_step and stop.requested is None:
            s = state.step
            lr = learning_rate(s, cfg)
            t0 = time.perf_counter()
            batches = [run.sampler.batch(s, m) for m in range(cfg.accum)]
            finished = s + 1 == cfg.steps
            validating = bool(cfg.val_every and (s + 1) % cfg.val_every == 0) or finished
            try:
                result = train_step(
                    run.forward,
                    run.optimizer,
                    batches,
                    lr=lr,
                    grad_clip=cfg.grad_clip,
                    device=run.device,
                    dtype=cfg.dtype,
                    scaler=run.scaler,
                    clip_model=run.model,
                    skip_nonfinite=cfg.skip_nonfinite,
                    measure_noise=validating and cfg.accum > 1,
                )
            except NonFiniteError as exc:
                log.write(
                    "event", event="nonfinite", step=s, loss=exc.loss, grad_norm=exc.grad_norm
                )
                raise OctlmError(
                    f"non-finite loss or gradient norm at step {s} (loss {exc.loss}, "
                    f"grad_norm {exc.grad_norm}); the last good checkpoint in {cfg.out} is kept",
                    "lower --lr, or pass --skip-nonfinite to skip such steps",
                ) from None
            dt = time.perf_counter() - t0
            state.step = run.sampler.step = s + 1
            state.tokens += cfg.tokens_per_step
            state.skipped_steps += int(result.skipped)
            state.elapsed = elapsed_before + time.perf_counter() - session_start
            tok_per_s = cfg.tokens_per_step / dt
            last_loss = result.loss
            log.write(
                "step",
                step=s,
                loss=result.loss,
                lr=lr,
                grad_norm=result.grad_norm,
                tokens=state.tokens,
                dt=round(dt, 6),
                tok_per_s=round(tok_per_s, 1),
                mfu=round(flops * tok_per_s / peak, 5) if peak else None,
                elapsed=round(state.elapsed, 3),
                **(
                    {"skipped": True, "skipped_steps": state.skipped_steps}
                    if result.skipped
                    else {}
                ),
            )
            bar.update(1)
            bar.set_postfix(loss=f"{result.loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tok_per_s:,.0f}")
            if validating:
                ev = run.validate()
                log.write(
                    "val",
                    step=s,
                    val_loss=ev.loss,
                    val_ppl=ev.ppl,
                    val_bpb=ev.bpb,
                    val_tokens=ev.tokens,
                    noise_scale=result.noise_scale,
                )
                bar.write(f"step {s}: val_loss {ev.loss:.4f}  ppl {ev.ppl:.2f}  bpb {ev.bpb:.4f}")
            hash_every = cfg.val_every if cfg.hash_every is None else cfg.hash_every
            if hash_every and state.step % hash_every == 0 and not finished:
                log.write("hash", step=s, weights_sha256=weights_sha256(run.model.state_dict()))
            stopping = stop.requested is not None or state.step == end_step
            if (cfg.ckpt_every and state.step % cfg.ckpt_every == 0) or finished or stopping:
                run.save()
    if state.step == cfg.steps:
        digest = weights_sha256(run.model.state_dict())
        log.write(
            "end",
            step=state.step,
            weights_sha256=digest,
            tokens=state.tokens,
            elapsed=round(state.elapsed, 3),
        )
        print(f"done: {state.step} steps, weights_sha256 {digest}", file=sys.stderr)
        return TrainResult(state.step, digest, False, last_loss)
    reason = stop.requested or f"stop_at {cfg.stop_at}"
    log.write("event", event="stop", step=state.step, reason=reason)
    print(
        f"stopped at step {state.step} ({reason}), checkpoint saved; continue with the same "
        "command plus --resume",
        file=sys.stderr,
    )
    return TrainResult(state.step, None, True, last_loss)


def load_model_for_inference(run_or_ckpt: str | Path, device: str = "cpu") -> tuple[GPT, dict]:
    """The model of a run folder (newest checkpoint), a checkpoint or a snapshot file."""
    path, sha = ckpt.find_checkpoint(run_or_ckpt)
    meta, tensors = ckpt.load_checkpoint(path, sha)
    model = GPT(ModelConfig.from_dict(meta["model_config"]))
    weights = ckpt.split_tensors(tensors, "model.") or tensors
    model.load_state_dict(weights)
    model.to(resolve_device(device)).eval()
    meta["path"] = str(path)
    return model, meta
