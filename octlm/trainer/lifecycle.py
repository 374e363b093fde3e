"""What every kind of run does around its step, once: `octlm train` and `octlm rl` keep only
their step and their records, and a third kind of run joins here.

In order, a run:
1. is refused in one line when its folder is a file, another kind's folder (merged weights,
   an exported model, a prepared dataset, a run of the other kind) or, without --resume, a
   folder that already holds a run (`refuse_folder`);
2. claims and locks the folder (rank 0 owns it; a failure before anything was written leaves it
   as it was), and leaves the process group on the way out (`claimed_run`);
3. checks its trackers are installed and clears stale temporary files (`ready_folder`), then,
   built, opens its log with the trackers as sinks (`open_log`);
4. writes a header (a new run) or cuts the log back to the checkpoint it resumes and says so
   (`begin`);
5. steps, stopping every rank at the same step when any one gets a signal (`StopFlag`,
   `agreed_stop`), checkpointing when `due`;
6. on the way out with an error, names a failed peer in one line (`closing`); at its end, writes
   the end record or the stop event and their lines (`finish`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from octlm.config.checks import shown_path
from octlm.data.shards import MANIFEST_NAME
from octlm.errors import OctlmError
from octlm.runlog.writer import RunLog
from octlm.trackers.sinks import check_installed, make_sinks, parse_trackers
from octlm.trainer import checkpoint as ckpt
from octlm.trainer.distributed import DistInfo, agree_max, peer_failure, shutdown
from octlm.trainer.guards import claimed_folder, has_run


@dataclass(frozen=True)
class RunKind:
    """A kind of run: what it is called, the command that continues it, and the file that marks
    its folder as its own (None: the folder of a run with no marker, training's)."""

    name: str
    command: str
    marker: str | None


TRAINING = RunKind("a run", "octlm train", None)
RL = RunKind("an RL run", "octlm rl", ckpt.RL_RECORD)
KINDS = (TRAINING, RL)
START_FROM = " (to start from its weights: octlm train --init-from {out}, or octlm rl {out})"
FOREIGN = {
    ckpt.MERGE_RECORD: ("merged weights (octlm merge)", START_FROM),
    "config.json": ("an exported model (octlm export)", START_FROM),
    MANIFEST_NAME: ("a prepared dataset (octlm prepare)", " (train on it with --data {out})"),
}
"""Files that mark a folder as another command's output, which no run may write into: what
it holds, and how a run uses it instead."""


def due(every: int, steps_done: int) -> bool:
    """Whether an every-N-steps action (N = 0: never) falls after `steps_done` steps."""
    return bool(every) and steps_done % every == 0


def kind_of(out: Path) -> RunKind | None:
    """The kind of run `out` holds (None: none)."""
    for kind in KINDS:
        if kind.marker is not None and (out / kind.marker).exists():
            return kind
    return TRAINING if has_run(out) else None


def refuse_folder(out: Path, kind: RunKind, resume: bool) -> None:
    """One line, before anything is written, when `kind`'s run may not write into `out`."""
    shown = shown_path(out)
    if out.exists() and not out.is_dir():
        raise OctlmError(
            f"--out {shown} is a file", f"name a folder for {kind.name} (new or its own)"
        )
    if not out.is_dir():
        return
    for name, (what, use) in FOREIGN.items():
        if (out / name).exists() and not has_run(out):
            raise OctlmError(
                f"--out {shown} holds {what}, not {kind.name}",
                f"give {kind.command} another --out" + use.format(out=shown),
            )
    held = kind_of(out)
    if held is not None and held != kind:
        raise OctlmError(
            f"{shown} holds {held.name} ({held.command}), not {kind.name}",
            f"continue it with {held.command} --resume, or give {kind.command} another --out",
        )
    if held is not None and not resume:
        raise OctlmError(
            f"{shown} already holds {kind.name}",
            "pass --resume to continue it, or choose another --out",
        )


@contextlib.contextmanager
def claimed_run(out: Path, kind: RunKind, resume: bool) -> Iterator[bool]:
    """The folder refused or claimed and locked (True in the process that owns it), and the
    process group left on the way out, however the run ends."""
    try:
        if out.exists() and not out.is_dir():  # before the claim, which cannot lock a file
            refuse_folder(out, kind, resume)
        with claimed_folder(out) as main:  # under torchrun, rank 0 owns the folder
            refuse_folder(out, kind, resume)  # under the lock: no other process is in it
            yield main
    finally:
        shutdown()


def ready_folder(out: Path, enabled: bool, log_to: str | None) -> tuple[str, ...]:
    """Before the run is built: the trackers named, each installed (a missing library is one
    line), and the stale temporary files of a killed write cleared. The trackers."""
    trackers = parse_trackers(log_to)
    check_installed(trackers)
    if enabled:
        ckpt.remove_stale_temps(out)
    return trackers


def open_log(out: Path, enabled: bool, trackers: tuple[str, ...]) -> RunLog:
    """The run's log; only the process that writes it feeds the trackers (they see what it
    writes)."""
    return RunLog(out, enabled=enabled, sinks=make_sinks(trackers, out) if enabled else [])


def speaker(enabled: bool) -> Callable[..., None]:
    """`print` in the process that owns the folder, silence in the others."""
    return print if enabled else (lambda *a, **k: None)


def begin(
    log: RunLog,
    header: Callable[[], dict[str, Any]],
    *,
    resumed: tuple[str, int, list[str], dict[str, Any]] | None,
    resume_asked: bool,
) -> None:
    """A new log with its header, or (`resumed`: where from, its step, notes, the resume event's
    fields) the log cut back to that step (the steps after it are done again), the notes and
    the resume event."""
    say = speaker(log.enabled)
    if resumed is None:
        if log.enabled:
            log.path.unlink(missing_ok=True)  # a log without a checkpoint holds nothing to keep
        log.open()
        log.header(header())
        if resume_asked:
            say(f"no checkpoint in {log.path.parent} yet: starting fresh", file=sys.stderr)
        return
    where, step, notes, fields = resumed
    if log.enabled:
        log.truncate_after(step)
    log.open()
    for note in notes:
        say(f"octlm: note: {note}", file=sys.stderr)
    log.event("resume", step, **fields, notes=notes)
    say(f"resumed from {where} at step {step}", file=sys.stderr)


def agreed_stop(signum: int, dist: DistInfo, device: torch.device) -> int:
    """The signal that stops every rank at this step (0: none). A signal on any one rank stops
    them all, and all of them name the same one (the largest number, if several came)."""
    return agree_max(signum, dist, device)


def signal_name(signum: int) -> str | None:
    return signal.Signals(signum).name if signum > 0 else None


@contextlib.contextmanager
def closing(
    log: RunLog,
    dist: DistInfo,
    steps_done: Callable[[], int],
    timeout_s: float,
    on_error: Callable[[], None] = lambda: None,
) -> Iterator[None]:
    """The log closed however the loop ends (marked failed on an error); on an error,
    `on_error` first (a checkpoint write in flight finished), then a collective that failed
    because of another process becomes the one line naming this rank and step."""
    failed = True
    try:
        yield
        failed = False
    except BaseException as exc:
        on_error()
        lost = peer_failure(exc, dist, steps_done(), timeout_s)
        if lost is None:
            raise
        log.event("peer_failure", steps_done(), rank=dist.rank, error=lost.problem)
        raise lost from None
    finally:
        log.close(failed)


def finish(
    log: RunLog,
    *,
    step: int,
    steps: int,
    stop_signal: str | None,
    stop_at: int | None,
    end: Callable[[], str],
    unit: str = "steps",
) -> str | None:
    """The end record of a finished run (`end` writes it and returns the weights hash) or the
    stop event of a stopped one, and its line; the hash, or None when stopped."""
    say = speaker(log.enabled)
    if step == steps:
        digest = end()
        say(f"done: {step} {unit}, weights_sha256 {digest}", file=sys.stderr)
        return digest
    reason = stop_signal or f"stop_at {stop_at}"
    log.event("stop", step, reason=reason)
    say(
        f"stopped at step {step} ({reason}), checkpoint saved; continue with the same command "
        "plus --resume",
        file=sys.stderr,
    )
    return None


def nonfinite_error(
    log: RunLog, step: int, loss: float, grad_norm: float, out: str | Path
) -> OctlmError:
    """Log the non-finite step, and the one-line error that ends the run (the checkpoint before
    it is the last one written)."""
    log.event("nonfinite", step, loss=loss, grad_norm=grad_norm)
    return OctlmError(
        f"non-finite loss or gradient norm at step {step} (loss {loss}, grad_norm {grad_norm}); "
        f"the last good checkpoint in {out} is kept",
        "lower --lr, or pass --skip-nonfinite to skip such steps",
    )
