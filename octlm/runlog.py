"""The run log: `OUT/log.jsonl`, one JSON object per line, flushed per line.

Record types: `header` (settings, model, counts, build, git commit), `step`, `val`, `event`
(resume, stop, checkpoint) and `end` (final step and weights_sha256). `step` in a record is the
0-based index of the optimizer step it describes. After a resume the file reads as one run:
records at or past the checkpoint's step are dropped before new ones are appended.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

LOG_NAME = "log.jsonl"
_BLOCK = 1 << 16


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
        """Drop step/val/event/end records with `step >= step` (work the resume will redo), and
        a last line cut short by a crash. Returns how many records were dropped.

        Records are appended in order of their step (every record but the header has one, and
        none is ever smaller than one before it), so the records to drop are a tail of the file:
        it is read backwards only as far as the first record to keep and cut there, in place.
        A resume's cost does not grow with the length of the run, and the cut never needs free
        disk space; a crash leaves the file at its old or its new length, both readable."""
        if not self.path.exists():
            return 0
        with open(self.path, "r+b") as f:
            end = f.seek(0, os.SEEK_END)
            cut, dropped, needs_newline = end, 0, False
            for start, line in _lines_backwards(f, end):
                try:
                    record = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    record = None  # a line cut short by a crash
                if isinstance(record, dict) and (
                    record.get("type") == "header" or record.get("step", -1) < step
                ):
                    needs_newline = start + len(line) == end  # kept last line lacks its "\n"
                    break
                cut, dropped = start, dropped + 1
            if cut < end:
                f.truncate(cut)
            if needs_newline:
                f.seek(0, os.SEEK_END)
                f.write(b"\n")
            if cut < end or needs_newline:
                f.flush()
                os.fsync(f.fileno())
        return dropped


def _lines_backwards(f: BinaryIO, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of every non-empty line of `f[:end]`, last line first, read in blocks."""
    pos, head = end, b""  # head: the start of a line whose beginning lies in an earlier block
    while pos > 0:
        size = min(_BLOCK, pos)
        pos -= size
        f.seek(pos)
        block = f.read(size) + head
        parts = block.split(b"\n")
        stop = pos + len(block)  # where the current part ends
        for part in reversed(parts[1:]):
            start = stop - len(part)
            if part:
                yield start, part
            stop = start - 1  # skip its newline
        head = parts[0]
    if head:
        yield 0, head


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
