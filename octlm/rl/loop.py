"""`octlm rl`: build (or resume), then per step sample the rollouts, update, log, evaluate on
the held-out prompts, checkpoint, check for a stop; a run stopped anywhere and resumed in a new
process, on any process count the prompts allow, ends with the straight run's bits.

A step: this process's prompts (p with p % W == rank) are sampled, G replies each
(`rollout.py`); the step's rewards, cut replies, lengths and rollout ids are gathered from every
process in prompt order (a Python object gather: numbers and ids, never a float sum whose order
could vary); the update (`update.py`) folds the prompts' gradients in the fixed tree."""

from __future__ import annotations

import math
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
from octlm.trainer import lifecycle
from octlm.trainer.distributed import gather_objects
from octlm.trainer.guards import StopFlag
from octlm.trainer.profile import StepProfile


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
    with lifecycle.claimed_run(out, lifecycle.RL, cfg.run.resume) as main:
        return _rl_locked(cfg, out, log_enabled and main, hard_exit)


def _rl_locked(cfg: RLConfig, out: Path, log_enabled: bool, hard_exit: bool) -> RLResult:
    trackers = lifecycle.ready_folder(out, log_enabled, cfg.observe.log_to)
    run = build(cfg)
    log = lifecycle.open_log(out, log_enabled, trackers)
    if run.step == 0:
        if log_enabled:
            (out / MARKER).write_text('{"kind": "rl"}\n')
        lifecycle.begin(log, run.header, resumed=None, resume_asked=cfg.run.resume)
    else:
        fields = {"world": run.dist.world}
        lifecycle.begin(
            log, run.header, resumed=(str(out), run.step, run.notes, fields), resume_asked=True
        )
    steps_done = lambda: run.step  # noqa: E731
    timeout = cfg.hardware.dist_timeout
    with lifecycle.closing(log, run.dist, steps_done, timeout, run.saver.close_quietly):
        result = _loop(run, log, lifecycle.speaker(log_enabled), hard_exit)
    run.saver.close()
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
                **cfg.policy.sampling(),
            )
        )
    return out


def max_known(values: list[Any]) -> float | None:
    """The largest of the values that are not None (None if none is): every process's part."""
    known = [v for v in values if v is not None]
    return max(known) if known else None


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
        **cfg.policy.sampling(),
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
        exact=cfg.on_policy,
        kernel=cfg.policy.sampling()["kernel"],
    )
    if update.nonfinite and not cfg.run.skip_nonfinite:  # (no update was made)
        raise lifecycle.nonfinite_error(log, s + 1, update.loss, update.grad_norm, cfg.run.out)
    run.skipped_steps += int(update.nonfinite)
    skipped = {"skipped": True, "skipped_steps": run.skipped_steps} if update.nonfinite else {}
    t2 = time.perf_counter()
    run.step, run.sampled_tokens = s + 1, run.sampled_tokens + sampled
    run.elapsed += t2 - t0
    log.write(
        "step",
        step=run.step,
        loss=update.loss,
        lr=lr,
        grad_norm=update.grad_norm,
        logprob_diff=max_known(gather_objects(update.logprob_diff, run.dist)),
        **numbers,
        tokens=run.sampled_tokens,
        dt=round(t2 - t0, 6),
        rollout_s=round(t1 - t0, 6),
        update_s=round(t2 - t1, 6),
        tok_per_s=round(sampled / max(t1 - t0, 1e-9), 1),
        elapsed=round(run.elapsed, 3),
        **skipped,
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
    watch = StepProfile(cfg.profile_window, False, Path(cfg.run.out), run.dist.rank)
    with StopFlag(hard_exit) as stop, progress_bar(run, log.enabled) as bar, watch:
        if not bar.disable:  # the step lines go above the bar
            say = lambda text, **_: bar.write(text, file=sys.stderr)  # noqa: E731
        while run.step < end and not stopping:
            watch.before(run.step + 1)
            one_step(run, log, say)
            watch.after(run.step)
            bar.update(1)
            last = run.step == cfg.steps
            if not last and lifecycle.due(cfg.hash_interval, run.step) and log.enabled:
                log.weights_hash(run.step, weights_sha256(run.weights()))  # the end's is its own
            if last or (cfg.eval_every and run.step % cfg.eval_every == 0):
                score = heldout(run)
                log.write("val", step=run.step, **score.fields())
                say(
                    f"step {run.step}: held-out pass@1 {score.pass1:.3f}  pass@{score.k} "
                    f"{score.passk:.3f}",
                    file=sys.stderr,
                )
            signum = lifecycle.agreed_stop(stop.signum, run.dist, run.device)
            stopping = signum > 0
            if last or stopping or run.step == end or lifecycle.due(cfg.ckpt_every, run.step):
                run.save()
    run.saver.wait()  # the last checkpoint is on disk before the run says so
    return _finish(run, log, lifecycle.signal_name(signum), score)


def _finish(
    run: RLRun, log: RunLog, stop_signal: str | None, score: HeldoutScore | None
) -> RLResult:
    def end() -> str:
        digest = weights_sha256(run.weights())
        elapsed = round(run.elapsed, 3)
        log.write(
            "end", step=run.step, weights_sha256=digest, tokens=run.sampled_tokens, elapsed=elapsed
        )
        return digest

    cfg = run.settings
    digest = lifecycle.finish(
        log,
        step=run.step,
        steps=cfg.policy.steps,
        stop_signal=stop_signal,
        stop_at=cfg.run.stop_at,
        end=end,
        unit="RL steps",
    )
    return RLResult(run.step, digest, digest is None, stop_signal, score)
