"""What guards a run folder while a trainer uses it: the lock, the "already holds a run" check,
the check that every rank sees the same folder, and the stop signals that end a run cleanly at
a step boundary.

Every rank must see rank 0's folder: rank 0 writes a fresh token into it and sends it to the
others; a rank that reads another token (or none) is looking at another folder, e.g. a node
where --out is not on the shared file system, and would silently start afresh: it stops the run
in one line instead."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from octlm.errors import OctlmError, RankError
from octlm.fsutil import atomic_write_bytes
from octlm.runlog.reader import LOG_NAME
from octlm.trainer.checkpoint import read_latest
from octlm.trainer.distributed import DistInfo, agree, broadcast_json


def has_run(out: Path) -> bool:
    """Whether `out` already holds a run: a listed checkpoint or a log."""
    return bool(read_latest(out)) or (out / LOG_NAME).exists()


TOKEN_NAME = ".world"
"""The token rank 0 leaves in the run folder for the others to find (a few bytes, rewritten by
each start)."""


def check_shared_folder(out: Path, info: DistInfo, device: torch.device) -> None:
    """Every rank sees rank 0's run folder, or every rank stops (collective)."""
    if not info.enabled:
        return
    token = secrets.token_hex(16) if info.is_main else None
    if info.is_main:
        atomic_write_bytes(out / TOKEN_NAME, token.encode())  # type: ignore[union-attr]
    token = broadcast_json(token, info, device)
    try:
        seen = (out / TOKEN_NAME).read_text()
    except OSError:
        seen = None
    blind = seen != token
    if agree(blind, info, device):
        if blind:
            raise RankError(
                f"rank {info.rank} (on {socket.gethostname()}) does not see the run folder "
                f"{out} that rank 0 writes",
                "put --out on storage every node mounts at the same path (NFS, Lustre, ...)",
            )
        raise OctlmError(  # printed by rank 0; the blind rank says which it is
            f"another rank does not see the run folder {out}",
            "put --out on storage every node mounts at the same path (NFS, Lustre, ...)",
        )


class RunLock:
    """An OS lock on `OUT/.lock` for as long as a trainer uses the folder. The kernel drops it
    when the process dies, so a lock left by a killed trainer never blocks a resume."""

    def __init__(self, out: Path) -> None:
        self.path = out / ".lock"
        self._fd: int | None = None
        self.created = False
        """Whether this lock made the file (the folder held no lock file before)."""
        self._before = b""
        """What the file held before this lock wrote its pid (put back by `discard`)."""

    def __enter__(self) -> RunLock:
        self.created = not os.path.lexists(self.path)
        try:  # never through a link: the lock would truncate and write the file it points to
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if not self.path.is_symlink():
                raise
            raise OctlmError(
                f"{self.path} is a symbolic link ({exc.strerror}); a run's lock is its own file",
                f"remove the link {self.path}, or choose another --out",
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OctlmError(
                f"{self.path.parent} is in use by another trainer (pid {holder})",
                "wait for it to finish, or choose another --out",
            ) from None
        self._before = os.pread(fd, 64, 0)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def discard(self) -> None:
        """Remove the lock file this lock made (or put back the bytes of one it found), while
        still holding it: a start refused before it wrote anything leaves the folder as it
        found it. (Another trainer meanwhile fails to
        take the held lock at once, so none can be holding the file that goes.)"""
        if self.created and self._fd is not None:
            self.path.unlink(missing_ok=True)
        elif self._fd is not None:  # the lock file an earlier run left: its bytes put back
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, self._before, 0)

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
"""Each asks for a clean stop: Ctrl-C, a scheduler's or torchrun's SIGTERM, Slurm's `--signal`."""
REPEAT_WINDOW = 1.0
"""Seconds in which a repeated SIGTERM or SIGUSR1 is the same request: a scheduler signals
every process of a job and the elastic agent passes its own copy on, so a worker often gets two
at once. Not SIGINT: a terminal's Ctrl-C reaches the launcher alone (workers run in sessions
of their own), so a second one is a person asking to stop now."""


class StopFlag:
    """SIGINT/SIGTERM/SIGUSR1: finish the current step, checkpoint, return. Another signal
    (for SIGTERM/SIGUSR1: more than `REPEAT_WINDOW` later) stops now: the `octlm` command
    exits at once (`hard_exit`); in-process (`octlm.train` in a notebook) it raises
    KeyboardInterrupt instead, because exiting would take the kernel down with it.

    The old handlers come back on exit. Off the main thread nothing is installed: Python runs
    handlers only in the main thread and refuses to install one elsewhere (ValueError), so a
    run started from a thread is stopped the way its caller stops threads, not by a signal."""

    def __init__(self, hard_exit: bool = False) -> None:
        self.hard_exit = hard_exit
        self.requested: str | None = None
        self.signum = 0
        """The signal asked for (0: none), what the ranks agree on."""
        self._at = 0.0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in STOP_SIGNALS:
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            # None: a handler installed outside Python, which cannot be put back from here.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._old.clear()

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested is not None:
            if signum != signal.SIGINT and time.monotonic() - self._at < REPEAT_WINDOW:
                return  # the same request, delivered twice (a second Ctrl-C is a person's)
            if self.hard_exit:
                os._exit(128 + signum)  # the last complete checkpoint stays as it is
            raise KeyboardInterrupt  # the loop lets the checkpoint in flight finish first
        self.requested, self.signum = signal.Signals(signum).name, signum
        self._at = time.monotonic()
        print(f"\n{self.requested}: finishing this step, then checkpointing", file=sys.stderr)


@contextlib.contextmanager
def claimed_folder(out: Path) -> Iterator[bool]:
    """`out` made and locked by rank 0 (under torchrun; the only process otherwise) for the
    run's life; yields whether this process is that one. A run that fails before writing
    anything leaves no lock file behind, and a folder it made, nothing at all."""
    main = int(os.environ.get("RANK", "0")) == 0
    created = main and not out.exists()
    if main:  # another rank making its own folder would hide a node that cannot see this one
        out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out) if main else None
    before = {p.name for p in out.iterdir()} if main else set()
    try:
        with lock or contextlib.nullcontext():
            try:
                yield main
            except BaseException:
                if lock is not None and wrote_nothing(out, before):
                    lock.discard()  # refused before it wrote anything: no lock file left
                    if TOKEN_NAME not in before:  # nor the world marker check_shared_folder left
                        (out / TOKEN_NAME).unlink(missing_ok=True)
                raise
    except BaseException:
        if created and wrote_nothing(out, set()):
            shutil.rmtree(out, ignore_errors=True)
        raise


def wrote_nothing(out: Path, before: set[str]) -> bool:
    """Whether `out` holds nothing beyond `before` but the lock and the ranks' token."""
    return {p.name for p in out.iterdir()} - before <= {".lock", TOKEN_NAME}
