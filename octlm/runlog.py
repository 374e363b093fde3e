"""The run log: `OUT/log.jsonl`, one JSON object per line, flushed per line.

Record types: `header` (settings, model, counts, build, git commit), `step`, `val`, `event`
(resume, stop, checkpoint) and `end` (final step and weights_sha256). `step` in a record is the
0-based index of the optimizer step it describes. After a resume the file reads as one run:
records at or past the checkpoint's step are dropped (atomically) before new ones are appended.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TextIO

from octlm.fsutil import atomic_write_bytes

LOG_NAME = "log.jsonl"


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf; write them as strings so every line stays parseable.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    # Nested too: the header's config and a resume's notes are dicts and lists.
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class RunLog:
    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.path = run_dir / LOG_NAME
        self.enabled = enabled
        self._file: TextIO | None = None

    def open(self) -> None:
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def write(self, record_type: str, **fields: Any) -> None:
        if self._file is None:
            return
        record = {"type": record_type, **{k: _clean(v) for k, v in fields.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def truncate_after(self, step: int) -> int:
        """Drop step/val/event/end records with `step >= step` (work the resume will redo).
        Returns how many records were dropped."""
        if not self.path.exists():
            return 0
        kept, dropped = [], 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1  # a line cut short by a crash
                continue
            if record.get("type") != "header" and record.get("step", -1) >= step:
                dropped += 1
                continue
            kept.append(line)
        atomic_write_bytes(self.path, "".join(k + "\n" for k in kept).encode("utf-8"))
        return dropped


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """All records of a run folder's (or a file's) log."""
    path = Path(path)
    if path.is_dir():
        path = path / LOG_NAME
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                records.append(json.loads(line))
    return records
