"""`octlm rl`: build (or resume), then per step sample the rollouts, update, log, evaluate on
the held-out prompts, checkpoint, check for a stop; a run stopped anywhere and resumed in a new
process, on any process count the prompts allow, ends with the straight run's bits.

A step: this process's prompts (p with p % W == rank) are sampled, G replies each
(`rollout.py`); the step's rewards, cut replies, lengths and rollout ids are gathered from every
process in prompt order (a Python object gather: numbers and ids, never a float sum whose order
could vary); the update (`update.py`) folds the prompts' gradients in the fixed tree."""

from __future__ import annotations

import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from octlm.config.rl import NO_OUT, RLConfig
from octlm.errors import OctlmError
from octlm.hashing import weights_sha256
from octlm.rl.heldout import HeldoutScore, score_heldout
from octlm.rl.rollout import Group, reply_seed, rollout_sha256, sample_group
from octlm.rl.run import MARKER, RLRun, build
from octlm.rl.update import learning_rate, policy_update
from octlm.runlog.writer import RunLog
from octlm.trackers.sinks import check_installed, make_sinks, parse_trackers
from octlm.trainer import checkpoint as ckpt
from octlm.trainer.distributed import agree_max, barrier, gather_objects, shutdown
from octlm.trainer.guards import StopFlag, claimed_folder, has_run
from octlm.trainer.loop import due


@dataclass(frozen=True)
class RLResult:
    step: int
    weights_sha256: str | None
    stopped_early: bool
    stop_signal: str | None = None
    heldout: HeldoutScore | None = None


def rl(cfg: RLConfig, log_enabled: bool = True, *, hard_exit: bool = False) -> RLResult:
    """Run `cfg` in this process (one of several under `--nproc`)."""
    if cfg.run.out is None:
        raise OctlmError(*NO_OUT)
    out = Path(cfg.run.out)
    if out.exists() and not out.is_dir():
        raise OctlmError(f"--out {out} is a file", "name a folder for the RL run (new or its own)")
    if out.is_dir() and has_run(out) and not (out / MARKER).exists():
        raise OctlmError(
            f"{out} holds a training run, not an RL run",
            "give octlm rl another --out (the run to start from is its first argument)",
        )
    if not cfg.resume and has_run(out):
        raise OctlmError(
            f"{out} already holds an RL run",
            "pass --resume to continue it, or choose another --out",
        )
    try:
        with claimed_folder(out) as main:
            return _rl_locked(cfg, out, log_enabled and main, hard_exit)
    finally:
        shutdown()


def _rl_locked(cfg: RLConfig, out: Path, log_enabled: bool, hard_exit: bool) -> RLResult:
    trackers = parse_trackers(cfg.log_to)
    check_installed(trackers)
    if log_enabled:
        ckpt.remove_stale_temps(out)
    run = build(cfg)
    say = print if log_enabled else (lambda *a, **k: None)
    log = RunLog(out, enabled=log_enabled, sinks=make_sinks(trackers, out) if log_enabled else [])
    if run.step == 0:
        if log_enabled:
            (out / MARKER).write_text('{"kind": "rl"}\n')
            log.path.unlink(missing_ok=True)
        log.open()
        log.header(run.header())
        if cfg.resume:
            say(f"no checkpoint in {out} yet: starting fresh", file=sys.stderr)
    else:
        if log_enabled:
            log.truncate_after(run.step)
        log.open()
        for note in run.notes:
            say(f"octlm: note: {note}", file=sys.stderr)
        log.event("resume", run.step, world=run.dist.world, notes=run.notes)
        say(f"resumed from {out} at step {run.step}", file=sys.stderr)
    failed = True
    try:
        result = _loop(run, log, say, hard_exit)
        failed = False
    finally:
        log.close(failed)
    return result


def rollouts(run: RLRun, step: int) -> list[Group]:
    """This process's groups of `step`: prompts rank, rank + W, ... in order."""
    cfg = run.settings
    out = []
    for p in range(run.dist.rank, cfg.prompts, run.dist.world):
        out.append(
            sample_group(
                run.model,
                run.tokenizer,
                run.task,
                run.task.problem(cfg.seed, step, p),
                index=p,
                seeds=[reply_seed(cfg.seed, step, p, j) for j in range(cfg.samples)],
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
            )
        )
    return out


def step_numbers(groups: list[Group]) -> dict[str, Any]:
    """The step's rollout numbers from every prompt's group (prompt order)."""
    groups = sorted(groups, key=lambda g: g.index)
    rewards = [r for g in groups for r in g.rewards]
    n = len(rewards)
    return {
        "reward": math.fsum(rewards) / n,
        "correct": sum(c for g in groups for c in g.correct) / n,
        "cut": sum(c for g in groups for c in g.cut) / n,
        "reply_len": sum(len(r) for g in groups for r in g.replies) / n,
        "rollout_sha256": rollout_sha256(groups),
    }


def heldout(run: RLRun) -> HeldoutScore:
    cfg = run.settings
    return score_heldout(
        run.model,
        run.tokenizer,
        run.task,
        prompts=cfg.eval_prompts,
        k=cfg.pass_k,
        seed=cfg.seed,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        rank=run.dist.rank,
        world=run.dist.world,
        gather=(lambda obj: gather_objects(obj, run.dist)) if run.dist.enabled else None,
    )


def one_step(run: RLRun, log: RunLog, say: Any) -> None:
    """Step `run.step`: rollouts, the update, the step's record."""
    cfg, s = run.settings, run.step
    t0 = time.perf_counter()
    mine = rollouts(run, s)
    t1 = time.perf_counter()
    every: list[Group] = [g for part in gather_objects(mine, run.dist) for g in part]  # type: ignore[attr-defined]
    numbers = step_numbers(every)
    sampled = sum(len(r) for g in every for r in g.replies)
    lr = learning_rate(s, cfg.steps, cfg.lr)
    update = policy_update(
        run.model,
        run.optimizer,
        run.reducer,
        mine,
        sampled_tokens=sampled,
        lr=lr,
        grad_clip=cfg.grad_clip,
        seed=cfg.seed,
        step=s,
        world=run.dist.world,
        rank=run.dist.rank,
        dtype=run.dtype,
    )
    if update.nonfinite:
        log.event("nonfinite", s + 1, loss=update.loss, grad_norm=update.grad_norm)
        raise OctlmError(
            f"non-finite loss or gradient norm at RL step {s + 1} (loss {update.loss}, "
            f"grad_norm {update.grad_norm}); the last good checkpoint in {cfg.out} is kept",
            "lower --lr",
        )
    t2 = time.perf_counter()
    run.step, run.sampled_tokens = s + 1, run.sampled_tokens + sampled
    run.elapsed += t2 - t0
    log.write(
        "step",
        step=run.step,
        loss=update.loss,
        lr=lr,
        grad_norm=update.grad_norm,
        **numbers,
        tokens=run.sampled_tokens,
        dt=round(t2 - t0, 6),
        rollout_s=round(t1 - t0, 6),
        update_s=round(t2 - t1, 6),
        tok_per_s=round(sampled / max(t1 - t0, 1e-9), 1),
        elapsed=round(run.elapsed, 3),
    )
    say(
        f"step {run.step}/{cfg.steps}: reward {numbers['reward']:.3f}  correct "
        f"{numbers['correct']:.3f}  cut {numbers['cut']:.3f}  len {numbers['reply_len']:.1f}  "
        f"loss {update.loss:+.4f}",
        file=sys.stderr,
    )


def progress_bar(run: RLRun, shown: bool) -> tqdm:
    """The progress bar (rank 0; on a terminal unless --progress/--no-progress says)."""
    flag = run.settings.progress
    return tqdm(
        total=run.settings.steps,
        initial=run.step,
        desc="rl",
        unit="step",
        dynamic_ncols=True,
        disable=(None if flag is None else not flag) if shown else True,
    )


def _loop(run: RLRun, log: RunLog, say: Any, hard_exit: bool) -> RLResult:
    cfg = run.settings
    end = cfg.stop_at if cfg.stop_at is not None else cfg.steps
    stopping, signum, score = False, 0, None
    with StopFlag(hard_exit) as stop, progress_bar(run, log.enabled) as bar:
        if not bar.disable:  # the step lines go above the bar
            say = lambda text, **_: bar.write(text, file=sys.stderr)  # noqa: E731
        while run.step < end and not stopping:
            one_step(run, log, say)
            bar.update(1)
            last = run.step == cfg.steps
            if last or (cfg.eval_every and run.step % cfg.eval_every == 0):
                score = heldout(run)
                log.write("val", step=run.step, **score.fields())
                say(
                    f"step {run.step}: held-out pass@1 {score.pass1:.3f}  pass@{score.k} "
                    f"{score.passk:.3f}",
                    file=sys.stderr,
                )
            # Every rank stops at the same step: a signal on any one stops them all.
            signum = agree_max(stop.signum, run.dist, run.device)
            stopping = signum > 0
            if last or stopping or run.step == end or due(cfg.ckpt_every, run.step):
                run.save()
                barrier(run.dist)  # rank 0 has written the file before any rank goes on
    return _finish(run, log, say, signal.Signals(signum).name if stopping else None, score)


def _finish(
    run: RLRun, log: RunLog, say: Any, stop_signal: str | None, score: HeldoutScore | None
) -> RLResult:
    if run.step == run.settings.steps:
        digest = weights_sha256(run.weights())
        log.write(
            "end",
            step=run.step,
            weights_sha256=digest,
            tokens=run.sampled_tokens,
            elapsed=round(run.elapsed, 3),
        )
        say(f"done: {run.step} RL steps, weights_sha256 {digest}", file=sys.stderr)
        return RLResult(run.step, digest, False, None, score)
    reason = stop_signal or f"stop_at {run.settings.stop_at}"
    log.event("stop", run.step, reason=reason)
    say(
        f"stopped at RL step {run.step} ({reason}), checkpoint saved; continue with the same "
        "command plus --resume",
        file=sys.stderr,
    )
    return RLResult(run.step, None, True, stop_signal, score)
