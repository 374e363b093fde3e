"""Looking at where a step's time and memory go: `--profile-steps A:B` and `--memory-snapshot`.

The profiler only watches (it records which operators ran and for how long), so the run's
bits are those of the same run without it (tests/e2e/test_profile.py). Files go to
OUT/profile/, one set per rank when there are several:
- `trace.json`: the steps' Chrome trace (chrome://tracing, ui.perfetto.dev);
- `ops.txt`: PyTorch's per-operator table of those steps, by total time;
- `memory.pickle` (CUDA): PyTorch's memory snapshot of the first steps, for
  pytorch.org/memory_viz. The format is PyTorch's own (a pickle): it is a file to inspect,
  not one octlm reads back.
"""

from __future__ import annotations

from pathlib import Path

import torch

from octlm.config.run import PROFILE_FILES, PROFILE_FOLDER
from octlm.device import resolve_device
from octlm.errors import OctlmError

TRACE, OPS, MEMORY = (Path(name) for name in PROFILE_FILES)
SNAPSHOT_STEPS = 3
"""Steps the memory snapshot covers: the first step allocates the optimizer's state, the
next ones show the steady state."""


def check_memory_snapshot(wanted: bool, device: str) -> None:
    """One line before anything is built: the memory snapshot is CUDA's allocator's."""
    kind = resolve_device(device).type if wanted else "cuda"
    if kind != "cuda":
        raise OctlmError(
            f"--memory-snapshot records CUDA's allocator; this run is on {kind}",
            "drop --memory-snapshot (--profile-steps A:B profiles a CPU run)",
        )


class StepProfile:
    """Starts and stops the profiler around steps A..B and the memory recording over the first
    steps this process runs; `before(n)` and `after(n)` bracket step n (counted from 1). A run
    that stops inside a window writes what it recorded when the `with` block ends."""

    def __init__(self, window: tuple[int, int] | None, snapshot: bool, out: Path, rank: int):
        self.window, self.snapshot = window, snapshot
        self.folder = out / PROFILE_FOLDER
        self.suffix = "" if rank == 0 else f"-rank{rank}"
        self.profiler: torch.profiler.profile | None = None
        self.recording_since: int | None = None

    def __enter__(self) -> StepProfile:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:  # a failed run's error line is what matters
            self._write_trace()
            self._write_snapshot()

    def before(self, step: int) -> None:
        window = self.window
        # From A, or from the first step a resume runs inside the window (past B: nothing).
        if window is not None and self.profiler is None and window[0] <= step <= window[1]:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.start()
        if self.snapshot and self.recording_since is None:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
            self.recording_since = step

    def after(self, step: int) -> None:
        if self.window is not None and step >= self.window[1]:
            self._write_trace()
        since = self.recording_since
        if since is not None and step >= since + SNAPSHOT_STEPS - 1:
            self._write_snapshot()

    def _path(self, name: Path) -> Path:
        """OUT/profile/NAME, this rank's (trace-rank1.json beside rank 0's trace.json)."""
        return self.folder / f"{name.stem}{self.suffix}{name.suffix}"

    def _write_trace(self) -> None:
        if self.profiler is None:
            return
        self.profiler.stop()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.profiler.export_chrome_trace(str(self._path(TRACE)))
        sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
        table = self.profiler.key_averages().table(sort_by=sort, row_limit=40)
        self._path(OPS).write_text(table + "\n", encoding="utf-8")
        self.profiler, self.window = None, None

    def _write_snapshot(self) -> None:
        if self.recording_since is None or not self.snapshot:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(self._path(MEMORY)))
        torch.cuda.memory._record_memory_history(enabled=None)
        self.snapshot = False
