"""`octlm train`: build, maybe resume, then step, log, validate, checkpoint, check for a stop.

Everything the next step depends on is either a pure function of the step (learning rate,
data order) or restored from the checkpoint (weights, AdamW moments, scaler, every RNG), so a
run stopped anywhere and resumed in a new process ends with the same bits as a straight run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from octlm.config import TrainConfig
from octlm.errors import OctlmError
from octlm.hashing import weights_sha256
from octlm.model import GPT, ModelConfig
from octlm.runlog import RunLog
from octlm.train import checkpoint as ckpt
from octlm.train.distributed import (  # noqa: F401  (resolve_device re-exported for tools)
    agree,
    all_reduce_sum,
    resolve_device,
    shutdown,
)
from octlm.train.run import (  # noqa: F401  (re-exported: tools import them from here)
    GPU_PEAK_FLOPS,
    ResumeError,
    Run,
    RunLock,
    _has_run,
    embedded_data_dir,
    peak_flops,
    resolve_data,
)
from octlm.train.schedule import learning_rate
from octlm.train.step import NonFiniteError, train_step


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


def train(cfg: TrainConfig, log_enabled: bool = True) -> TrainResult:
    out = Path(cfg.out)
    main = int(os.environ.get("RANK", "0")) == 0  # under torchrun, rank 0 owns the folder
    created = main and not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with RunLock(out) if main else contextlib.nullcontext():
            return _train_locked(cfg, out, log_enabled and main)
    except BaseException:
        # A run that failed before writing anything leaves no empty folder behind.
        if created and {p.name for p in out.iterdir()} <= {".lock"}:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        shutdown()


def _train_locked(cfg: TrainConfig, out: Path, log_enabled: bool) -> TrainResult:
    if not cfg.resume and _has_run(out):
        raise OctlmError(
            f"{out} already holds a run", "pass --resume to continue it, or choose another --out"
        )
    if log_enabled:
        ckpt.remove_stale_temps(out)
    run = Run(cfg)
    log = RunLog(out, enabled=log_enabled)
    say = print if log_enabled else (lambda *a, **k: None)
    resumed = run.resume() if cfg.resume else None
    if resumed is None:
        if log_enabled:
            log.path.unlink(missing_ok=True)  # a log without a checkpoint holds nothing to keep
        log.open()
        log.write("header", **run.header())
        if cfg.resume:
            say(f"no checkpoint in {out} yet: starting fresh", file=sys.stderr)
    else:
        path, notes = resumed
        if log_enabled:
            log.truncate_after(run.state.step)
        log.open()
        for note in notes:
            say(f"octlm: note: {note}", file=sys.stderr)
        log.write(
            "event",
            event="resume",
            step=run.state.step,
            checkpoint=str(path),
            build=ckpt.build_info(run.device),
            notes=notes,
        )
        say(f"resumed from {path} at step {run.state.step}", file=sys.stderr)
    try:
        result = _loop(run, log)
    except BaseException:
        _finish_saves_quietly(run)
        raise
    finally:
        log.close()
    run.saver.close()
    return result


def _finish_saves_quietly(run: Run) -> None:
    """On the way out with an error: let the write in flight finish (it is a good checkpoint,
    taken before the error) while the run folder is still locked; the first error is the one
    to report, so a second one from the write is only noted."""
    try:
        run.saver.close()
    except Exception as exc:
        print(f"octlm: note: the last checkpoint write failed too ({exc})", file=sys.stderr)


def _nonfinite(log: RunLog, cfg: TrainConfig, step: int, exc: NonFiniteError) -> OctlmError:
    log.write("event", event="nonfinite", step=step, loss=exc.loss, grad_norm=exc.grad_norm)
    return OctlmError(
        f"non-finite loss or gradient norm at step {step} (loss {exc.loss}, "
        f"grad_norm {exc.grad_norm}); the last good checkpoint in {cfg.out} is kept",
        "lower --lr, or pass --skip-nonfinite to skip such steps",
    )


def _loop(run: Run, log: RunLog) -> TrainResult:
    cfg, state, dist = run.cfg, run.state, run.dist
    tokens_per_step = run.tokens_per_step
    flops = run.model.flops_per_token(cfg.context)
    peak = peak_flops(cfg, run.device)
    end_step = cfg.stop_at if cfg.stop_at is not None else cfg.steps
    session_start, elapsed_before = time.perf_counter(), state.elapsed
    show = None if cfg.progress is None else cfg.progress
    bar = tqdm(
        total=cfg.steps,
        initial=state.step,
        desc="train",
        unit="step",
        dynamic_ncols=True,
        disable=(None if show is None else not show) if dist.is_main else True,
    )
    reduce = (lambda t: all_reduce_sum(t, dist)) if dist.enabled else None
    last_loss: float | None = None
    stop_agreed = False
    with StopFlag() as stop, bar:
        while state.step < end_step and not stop_agreed:
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
                    before_backward=run.sync,
                    skip_nonfinite=cfg.skip_nonfinite,
                    # Per-micro-batch gradients are per-rank under DDP: measure on one process.
                    measure_noise=validating and cfg.accum > 1 and not dist.enabled,
                    world=dist.world,
                    reduce_sum=reduce,
                )
            except NonFiniteError as exc:
                raise _nonfinite(log, cfg, s, exc) from None
            dt = time.perf_counter() - t0
            run.saver.check()  # a background checkpoint write that failed stops the run here
            state.step = run.sampler.step = s + 1
            state.tokens += tokens_per_step
            state.skipped_steps += int(result.skipped)
            state.elapsed = elapsed_before + time.perf_counter() - session_start
            tok_per_s = tokens_per_step / dt
            last_loss = result.loss
            skipped = {"skipped": True, "skipped_steps": state.skipped_steps}
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
                **(skipped if result.skipped else {}),
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
                if dist.is_main:
                    bar.write(
                        f"step {s}: val_loss {ev.loss:.4f}  ppl {ev.ppl:.2f}  bpb {ev.bpb:.4f}"
                    )
            hash_every = cfg.val_every if cfg.hash_every is None else cfg.hash_every
            if hash_every and state.step % hash_every == 0 and not finished:
                weights = run.full_model_state()  # collective under FSDP
                if dist.is_main:
                    log.write("hash", step=s, weights_sha256=weights_sha256(weights))
            # Every rank must stop at the same step: a signal on any one stops them all.
            stop_agreed = agree(stop.requested is not None, dist, run.device)
            stopping = stop_agreed or state.step == end_step
            if (cfg.ckpt_every and state.step % cfg.ckpt_every == 0) or finished or stopping:
                run.save()
    run.saver.wait()  # the last checkpoint is on disk before the run says so
    say = print if dist.is_main else (lambda *a, **k: None)
    if state.step == cfg.steps:
        weights = run.full_model_state()
        digest = weights_sha256(weights) if dist.is_main else None
        log.write(
            "end",
            step=state.step,
            weights_sha256=digest,
            tokens=state.tokens,
            elapsed=round(state.elapsed, 3),
        )
        say(f"done: {state.step} steps, weights_sha256 {digest}", file=sys.stderr)
        return TrainResult(state.step, digest, False, last_loss)
    reason = stop.requested or ("signal" if stop_agreed else f"stop_at {cfg.stop_at}")
    log.write("event", event="stop", step=state.step, reason=reason)
    say(
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
