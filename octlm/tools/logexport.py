"""`octlm log export RUN --tensorboard DIR`: a run's log.jsonl replayed into TensorBoard event
files, for a run trained without `--log-to`, or to rebuild a tracker's view from the source.

The log of a resumed run already reads as one run (cut back at each resume), so the replay
has no duplicate and no stale step. Nothing here trains: a failure is an error, not a warning.
"""

from __future__ import annotations

from pathlib import Path

from octlm.runlog.reader import read_log_counted
from octlm.trackers.tensorboard_sink import TensorBoardSink


def export_tensorboard(run: str | Path, out: str | Path) -> tuple[int, int]:
    """Write the run's records as event files in `out`; (records written, unreadable lines)."""
    records, bad = read_log_counted(run)
    sink = TensorBoardSink(Path(out))
    sink.open(None)  # a fresh view: events an earlier export left in `out` are purged
    try:
        for record in records:
            sink.record(record)
    finally:
        sink.close()
    return len(records), bad
