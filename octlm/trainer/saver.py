"""Checkpoint writes in a background thread, at most one at a time.

The loop hands over a private copy of the state (host tensors and JSON metadata that nothing
else holds), so the write can overlap the following steps without touching a bit of them.
Writing releases the GIL (file writes, the checksum), so on a GPU the copy is the only time the
loop waits, and on a CPU the write runs beside the step. Every way out of the loop waits for the
write in flight; a failed write is raised at the next `check` (the step after it ended) or
`wait`, so a full disk stops the run as a synchronous save would, a few steps later, with the
previous checkpoint still listed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class BackgroundSaver:
    """Runs `submit`ted writes in one worker thread, or inline when `background` is False."""

    def __init__(self, background: bool) -> None:
        self.background = background
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="octlm-save")
            if background
            else None
        )
        self._pending: Future | None = None

    def submit(self, write: Callable[[], object]) -> None:
        # One write in flight: a disk slower than the checkpoint interval holds the loop back
        # here instead of piling up copies of the state in memory.
        self.wait()
        if self._pool is None:
            write()
        else:
            self._pending = self._pool.submit(write)

    @property
    def busy(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def check(self) -> None:
        """Raise the error of a write that has ended, if it failed; never blocks."""
        if self._pending is not None and self._pending.done():
            self.wait()

    def wait(self) -> None:
        """Block until the write in flight (if any) is on disk; raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the write in flight, then stop the thread (also when the wait raises)."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def close_quietly(self) -> None:
        """On the way out with an error: let the write in flight finish (it is a good
        checkpoint, taken before the error) while the run folder is still locked; the first
        error is the one to report, so a second one from the write is only noted."""
        try:
            self.close()
        except Exception as exc:
            print(f"octlm: note: the last checkpoint write failed too ({exc})", file=sys.stderr)
