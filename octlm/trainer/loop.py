"""`octlm train`: build, maybe resume, then step, log, validate, checkpoint, check for a stop.

Everything the next step depends on is either a pure function of the step (learning rate,
data order) or restored from the checkpoint (weights, AdamW moments, scaler, every RNG), so a
run stopped anywhere and resumed in a new process ends with the same bits as a straight run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from torch.profiler import record_function

# tqdm.auto: a widget in Jupyter (plain tqdm writes text into the cell), the usual bar elsewhere.
from tqdm.auto import tqdm

from octlm.config.train import TrainConfig
from octlm.device import build_info, memory_mb, peak_flops
from octlm.evaluate.loss import EvalResult
from octlm.evaluate.protocol import AnyScore, progress_part, score, task_fields
from octlm.hashing import tensor_digests, weights_sha256
from octlm.runlog.writer import RunLog
from octlm.trainer.guards import StopFlag
from octlm.trainer.inputs import packing_line
from octlm.trainer.lifecycle import (
    TRAINING,
    agreed_stop,
    begin,
    claimed_run,
    closing,
    due,
    finish,
    nonfinite_error,
    open_log,
    ready_folder,
    signal_name,
    speaker,
)
from octlm.trainer.profile import StepProfile, check_memory_snapshot
from octlm.trainer.run import Run, build_run, resume, run_tasks
from octlm.trainer.schedule import learning_rate
from octlm.trainer.step import NonFiniteError, StepResult, train_step


@dataclass(frozen=True)
class TrainResult:
    step: int
    weights_sha256: str | None
    stopped_early: bool
    last_loss: float | None
    stop_signal: str | None = None
    """The signal that stopped the run (SIGINT, SIGTERM, SIGUSR1); None when it ended or
    stopped at --stop-at."""


def train(
    cfg: TrainConfig, log_enabled: bool = True, *, hard_exit: bool = False, model_flag: bool = False
) -> TrainResult:
    """Train `cfg` in this process. `hard_exit`: a second Ctrl-C exits the process at once (the
    `octlm` command); left False, it raises KeyboardInterrupt (a notebook's kernel survives).
    `model_flag`: `--model` was typed for this run, so it must have the --init-from shape."""
    out = Path(cfg.run.out)
    tasks = run_tasks(cfg)  # read and checked before the folder is claimed: a bad file is one line
    with claimed_run(out, TRAINING, cfg.run.resume) as main:
        return _train_locked(cfg, out, log_enabled and main, hard_exit, model_flag, tasks)


def _train_locked(
    cfg: TrainConfig,
    out: Path,
    log_enabled: bool,
    hard_exit: bool,
    model_flag: bool,
    tasks: list | None = None,
) -> TrainResult:
    # Before anything is built:
    check_memory_snapshot(cfg.observe.memory_snapshot, cfg.hardware.device)
    trackers = ready_folder(out, log_enabled, cfg.observe.log_to)
    run = build_run(cfg, model_flag, tasks)
    log = open_log(out, log_enabled, trackers)
    _start(run, log)
    steps_done = lambda: run.state.step  # noqa: E731
    with closing(log, run.dist, steps_done, cfg.hardware.dist_timeout, run.saver.close_quietly):
        result = _loop(run, log, hard_exit)
    run.saver.close()
    return result


def _start(run: Run, log: RunLog) -> None:
    """Resume from the newest valid checkpoint (--resume), or start a new log."""
    resumed = resume(run) if run.cfg.run.resume else None
    if run.packing:
        speaker(log.enabled)(
            packing_line(run.packing["train"], run.cfg.inputs.context), file=sys.stderr
        )
    if resumed is None:
        begin(log, run.header, resumed=None, resume_asked=run.cfg.run.resume)
        return
    path, notes = resumed
    fields = {"checkpoint": str(path), "build": build_info(run.device)}
    begin(log, run.header, resumed=(str(path), run.state.step, notes, fields), resume_asked=True)
    if run.cfg.observe.hash_tensors:  # the weights as loaded: a resume that changed a bit shows
        _log_hashes(run, log, whole=False, tensors=True)


class Meter:
    """Throughput, MFU and training time for the log. `elapsed` adds this session's wall time
    to what the checkpoint recorded, so it counts across sessions (it is never part of the
    bits: the step records it, no computation reads it)."""

    def __init__(self, run: Run) -> None:
        self.tokens_per_step = run.tokens_per_step
        self.flops_per_token = run.model.flops_per_token(run.cfg.inputs.context)
        self.peak = peak_flops(run.cfg.observe.peak_tflops, run.device, run.cfg.hardware.dtype)
        self.before, self.start = run.state.elapsed, time.perf_counter()
        self.device = run.device
        memory_mb(self.device)  # on CUDA: the first step's peak starts here, not at the build

    def tokens_per_second(self, dt: float) -> float:
        return self.tokens_per_step / dt

    def mfu(self, tok_per_s: float) -> float | None:
        return self.flops_per_token * tok_per_s / self.peak if self.peak else None

    def elapsed(self) -> float:
        return self.before + time.perf_counter() - self.start

    def memory_mb(self) -> float | None:
        return memory_mb(self.device)


class Progress:
    """The progress bar (rank 0; on a terminal unless --progress/--no-progress says)."""

    def __init__(self, run: Run) -> None:
        show = run.cfg.observe.progress
        self.bar = tqdm(
            total=run.cfg.lr_schedule.steps,
            initial=run.state.step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=(None if show is None else not show) if run.dist.is_main else True,
        )
        self.main = run.dist.is_main

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def step(self, result: StepResult, tok_per_s: float) -> None:
        self.bar.update(1)
        self.bar.set_postfix(
            loss=f"{result.loss:.4f}", lr=f"{result.lr:.2e}", tok_s=f"{tok_per_s:,.0f}"
        )

    def val(self, step: int, ev: EvalResult, scores: dict[str, AnyScore]) -> None:
        if self.main:
            parts = ", ".join(f"{n} {e.bpb:.4f}" for n, e in (ev.sources or {}).items())
            tasks = "".join(progress_part(n, s) for n, s in scores.items())
            self.bar.write(
                f"step {step}: val_loss {ev.loss:.4f}  ppl {ev.ppl:.2f}  bpb {ev.bpb:.4f}"
                + (f"  (bpb: {parts})" if parts else "")
                + tasks
            )


def task_scores(run: Run) -> dict[str, AnyScore]:
    """--eval-tasks at a validation every eval_tasks_every steps and at the last step (none at
    the others): every rank scores every question (under FSDP the sharded module must run on
    all ranks in lockstep; under DDP the plain module, the same numbers)."""
    step = run.state.step
    if step != run.cfg.lr_schedule.steps and not due(run.cfg.evaluation.task_interval, step):
        return {}
    fsdp = run.dist.enabled and run.cfg.hardware.parallel == "fsdp"
    model = run.setup.forward if fsdp else run.model
    context = run.model_config.context
    return {t.name: score(model, t, run.tokenizer, context, run.device) for t in run.tasks}


def advance(run: Run, *, validating: bool, digesting: bool = False) -> StepResult:
    """One optimizer step of `run`: the schedule's lr, the step's micro-batches, `train_step`,
    then the counters (`digesting`: with the gradients' digests). The lr and the data are pure
    functions of the step, so a resumed run draws exactly what the straight run drew. Raises
    NonFiniteError (counters unchanged)."""
    cfg, state = run.cfg, run.state
    s = state.step
    lr = learning_rate(s, cfg.lr_schedule)
    t0 = time.perf_counter()
    # Labels for --profile-steps (bench/step_mfu reads them from the trace); outside a profile
    # they record nothing and change no bit.
    with record_function("octlm::data"):
        batches = [run.sampler.batch(s, m) for m in range(cfg.inputs.accum)]
    # The noise scale needs per-micro-batch gradients, which are per-rank under DDP: it is
    # measured at validations, with accumulation, in one process only.
    measure = validating and cfg.inputs.accum > 1 and not run.dist.enabled
    with record_function("octlm::step"):
        result = train_step(
            run.setup,
            run.optimizer,
            batches,
            lr=lr,
            step=s,
            measure_noise=measure,
            digest_grads=digesting,
        )
    dt = time.perf_counter() - t0
    state.advance(run.tokens_per_step, result.skipped)
    return replace(result, lr=lr, dt=dt, epoch=run.sampler.epoch(s))


def _loop(run: Run, log: RunLog, hard_exit: bool) -> TrainResult:
    cfg, state = run.cfg, run.state
    end = cfg.run.stop_at if cfg.run.stop_at is not None else cfg.lr_schedule.steps
    meter, result, stopping, signum = Meter(run), None, False, 0
    watch = StepProfile(
        cfg.profile_window, cfg.observe.memory_snapshot, Path(cfg.run.out), run.dist.rank
    )
    with StopFlag(hard_exit) as stop, Progress(run) as bar, watch:
        while state.step < end and not stopping:
            s = state.step
            last = s + 1 == cfg.lr_schedule.steps
            validating = last or due(cfg.evaluation.val_every, s + 1)
            # The end record hashes the last step's weights; its digests need a `tensors` record.
            hashing = due(cfg.hash_interval, s + 1) and not last
            digesting = cfg.observe.hash_tensors and (hashing or last)
            watch.before(s + 1)
            try:  # lr, micro-batches, update, counters
                result = advance(run, validating=validating, digesting=digesting)
            except NonFiniteError as exc:
                raise nonfinite_error(log, s + 1, exc.loss, exc.grad_norm, cfg.run.out) from None
            watch.after(s + 1)
            run.saver.check()  # a background checkpoint write that failed stops the run here
            state.elapsed = meter.elapsed()
            # Records name a step by the count done after it: s + 1 (runlog's module doc).
            bar.step(result, log.step(state.step, result, state, meter))
            if validating:
                ev, scores = run.validate(), task_scores(run)
                log.val(state.step, ev, result.noise_scale, task_fields(scores))
                bar.val(state.step, ev, scores)
            if hashing or digesting:
                grads = result.grad_digests or {}  # {}: a skipped non-finite step has none
                _log_hashes(run, log, whole=hashing, tensors=digesting, grads=grads)
            signum = agreed_stop(stop.signum, run.dist, run.device)
            stopping = signum > 0
            if last or stopping or state.step == end or due(cfg.run.ckpt_every, state.step):
                run.save()
    run.saver.wait()  # the last checkpoint is on disk before the run says so
    last_loss = result.loss if result is not None else None
    return _finish(run, log, signal_name(signum), last_loss)


def _log_hashes(
    run: Run, log: RunLog, *, whole: bool, tensors: bool, grads: dict[str, str] | None = None
) -> None:
    """The weights hash after this step (`whole`; the last step's is the end record's) and,
    with `tensors` (--hash-tensors), every weight's digest beside the gradients' `grads`
    (None: the weights a resume loaded)."""
    weights = run.full_model_state()  # collective under FSDP: every rank calls it
    if not run.dist.is_main:
        return
    if whole:
        log.weights_hash(run.state.step, weights_sha256(weights))
    if tensors:
        log.tensor_digests(run.state.step, tensor_digests(weights.items()), grads)


def _finish(run: Run, log: RunLog, stop_signal: str | None, last_loss: float | None) -> TrainResult:
    """The end record (weights hash) of a finished run, or the stop event of a stopped one."""
    state = run.state

    def end() -> str:
        digest = run.weights_sha256()
        log.end(state.step, digest, state)
        return digest

    steps, stop_at = run.cfg.lr_schedule.steps, run.cfg.run.stop_at
    digest = finish(
        log, step=state.step, steps=steps, stop_signal=stop_signal, stop_at=stop_at, end=end
    )
    return TrainResult(state.step, digest, digest is None, last_loss, stop_signal)
