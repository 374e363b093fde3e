"""The trackers a run feeds: parsing `--log-to`, the check that their libraries are installed,
the factory, and the guard that turns a tracker's failure into one warning.

A sink sees each record `RunLog` writes, after it is on disk, and nothing else: the log stays
the source of truth, and a tracker can only ever show less than it, never something else.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from octlm.extras import require
from octlm.runlog.writer import Sink


def parse_trackers(log_to: str | None) -> tuple[str, ...]:
    """`"tensorboard,wandb"` -> its names (unknown ones are for the config's check to refuse)."""
    names = (n.strip() for n in (log_to or "").split(","))
    return tuple(dict.fromkeys(n for n in names if n))  # once each, in the order given


def check_installed(names: Sequence[str]) -> None:
    """A one-line error naming `pip install 'octlm[NAME]'` for a tracker's missing library, at
    the start of a run rather than after its first step."""
    for name in names:
        require(name, f"--log-to {name}")


class Guarded:
    """A sink whose first failure (disk full, a broken install, a bug in the library) prints
    one warning and switches it off: training goes on and `log.jsonl` misses nothing."""

    def __init__(self, name: str, make: Callable[[], Sink]) -> None:
        self.name, self.failed = name, False
        self.sink: Sink | None = self._call(make)

    def _call(self, action: Callable[..., Any], *args: Any) -> Any:
        if self.failed:
            return None
        try:
            return action(*args)
        except Exception as exc:  # whatever the library raises: no step may be lost to it
            self.failed = True
            why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            print(
                f"octlm: warning: the {self.name} tracker failed ({why}); training goes on "
                "without it, log.jsonl has every record (`octlm log export` replays it)",
                file=sys.stderr,
            )
            return None

    def open(self, resumed_at: int | None) -> None:
        if self.sink is not None:
            self._call(self.sink.open, resumed_at)

    def record(self, record: dict[str, Any]) -> None:
        if self.sink is not None:
            self._call(self.sink.record, record)

    def close(self, run_failed: bool) -> None:
        if self.sink is not None:
            self._call(self.sink.close, run_failed)


def make_sinks(names: Sequence[str], out: Path) -> list[Guarded]:
    """The guarded sinks of a run folder (rank 0 only: the caller decides)."""
    from octlm.trackers.tensorboard_sink import TensorBoardSink  # lazy: each imports its library
    from octlm.trackers.wandb_sink import WandbSink

    kinds: dict[str, Callable[[], Sink]] = {
        "tensorboard": lambda: TensorBoardSink(out / "tensorboard"),
        "wandb": lambda: WandbSink(out),
    }
    return [Guarded(name, kinds[name]) for name in names]
