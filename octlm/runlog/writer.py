"""Writing a run log: `RunLog`, its typed records (`header`, `step`, `val`, `weights_hash`,
`tensor_digests`, `event`, `end`), the cut-back on resume (`truncate_after`) and the sinks it
feeds after each line; `git_commit` for the header. The file's name and schema are the
reader's (`reader.py`); the package doc says what each record holds.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TextIO

from octlm.runlog.reader import LOG_NAME, LOG_SCHEMA, file_schema, names_a_step

_BLOCK = 1 << 16


class StepNumbers(Protocol):
    loss: float
    lr: float
    grad_norm: float
    dt: float
    skipped: bool
    epoch: int | dict[str, int] | None
    z_loss: float | None


class Counters(Protocol):
    tokens: int
    elapsed: float
    skipped_steps: int


class Throughput(Protocol):
    def tokens_per_second(self, dt: float) -> float: ...
    def mfu(self, tok_per_s: float) -> float | None: ...
    def memory_mb(self) -> float | None: ...


class EvalNumbers(Protocol):
    loss: float
    ppl: float
    bpb: float
    tokens: int
    sources: Any
    """None, or per dataset of a --data mixture the same numbers."""


def per_source(result: EvalNumbers) -> dict[str, float]:
    """A mixture's per-dataset numbers as flat fields, `val_loss/NAME` and `val_bpb/NAME`, so
    trackers chart them as they chart every numeric field."""
    out: dict[str, float] = {}
    for name, part in (result.sources or {}).items():
        out[f"val_loss/{name}"], out[f"val_bpb/{name}"] = part.loss, part.bpb
    return out


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


class Sink(Protocol):
    """A tracker fed every record after it is in the file (octlm.trackers)."""

    def open(self, resumed_at: int | None) -> None:
        """Start; `resumed_at` is the step `truncate_after` cut the log back to (every record
        with a step at or past it is gone), None for a log started afresh."""

    def record(self, record: dict[str, Any]) -> None: ...
    def close(self, failed: bool) -> None:
        """Stop; `failed` when training ended with an error rather than a finish or a stop."""


class RunLog:
    def __init__(self, run_dir: Path, enabled: bool = True, sinks: Sequence[Sink] = ()) -> None:
        self.path = run_dir / LOG_NAME
        self.enabled = enabled
        self.sinks = tuple(sinks) if enabled else ()
        self._file: TextIO | None = None
        self.schema = LOG_SCHEMA
        """The numbering this file is written in: an existing log's own (see the package doc)."""
        self._cut: int | None = None  # where truncate_after cut the log: the sinks cut there too
        self._replay: list[dict[str, Any]] = []  # kept records the sinks' cut dropped

    def open(self) -> None:
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.schema = file_schema(self.path)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        for sink in self.sinks:
            sink.open(self._cut)
            for record in self._replay:
                sink.record(record)

    def write(self, record_type: str, **fields: Any) -> None:
        if self._file is None:
            return
        record = {"type": record_type, **{k: _clean(v) for k, v in fields.items()}}
        if self.schema == 1 and names_a_step(record):
            record["step"] -= 1  # a schema-1 file stays schema 1 (see the package doc)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for sink in self.sinks:  # after the line is written: a tracker never shows more
            sink.record(record)

    # -- typed records: the schema of each line lives here ------------------------------------
    def header(self, fields: dict[str, Any]) -> None:
        self.schema = LOG_SCHEMA  # a header starts a new file
        self.write("header", log_schema=LOG_SCHEMA, **fields)

    def step(self, step: int, numbers: StepNumbers, state: Counters, meter: Throughput) -> float:
        """One optimizer step; returns its tokens per second (for the progress bar)."""
        tok_per_s = meter.tokens_per_second(numbers.dt)
        mfu = meter.mfu(tok_per_s)
        skipped = {"skipped": True, "skipped_steps": state.skipped_steps}
        # Only --order epoch has epochs: a random-order record keeps the fields it always had.
        epoch = {} if numbers.epoch is None else {"epoch": numbers.epoch}
        self.write(
            "step",
            step=step,
            loss=numbers.loss,
            lr=numbers.lr,
            grad_norm=numbers.grad_norm,
            # Only a z-loss run has the term: other records keep the fields they always had.
            **({} if numbers.z_loss is None else {"z_loss": numbers.z_loss}),
            tokens=state.tokens,
            **epoch,
            dt=round(numbers.dt, 6),
            tok_per_s=round(tok_per_s, 1),
            mfu=round(mfu, 5) if mfu is not None else None,
            mem_mb=meter.memory_mb(),  # CUDA: the step's peak allocated; CPU: resident now
            elapsed=round(state.elapsed, 3),
            **(skipped if numbers.skipped else {}),
        )
        return tok_per_s

    def val(
        self, step: int, result: EvalNumbers, noise_scale: float | None, extra: dict | None = None
    ) -> None:
        """A validation record; `extra`: more numbers of it (--eval-tasks' accuracies)."""
        self.write(
            "val",
            step=step,
            val_loss=result.loss,
            val_ppl=result.ppl,
            val_bpb=result.bpb,
            val_tokens=result.tokens,
            noise_scale=noise_scale,
            **per_source(result),
            **(extra or {}),
        )

    def weights_hash(self, step: int, digest: str) -> None:
        self.write("hash", step=step, weights_sha256=digest)

    def tensor_digests(
        self, step: int, weights: dict[str, str], grads: dict[str, str] | None
    ) -> None:
        """Per-tensor digests after step `step`: the weights, and the gradients of that step
        before clipping; `grads` None: the weights a resume loaded (its checkpoint's step)."""
        more = {"loaded": True} if grads is None else {"grads": grads}
        self.write("tensors", step=step, weights=weights, **more)

    def event(self, event: str, step: int, **fields: Any) -> None:
        self.write("event", event=event, step=step, **fields)

    def end(self, steps: int, digest: str | None, state: Counters) -> None:
        self.write(
            "end",
            step=steps,
            weights_sha256=digest,
            tokens=state.tokens,
            elapsed=round(state.elapsed, 3),
        )

    def close(self, failed: bool = False) -> None:
        """Close the file and every sink; `failed` tells the sinks the run ended with an error
        (W&B then marks it failed, not finished)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        for sink in self.sinks:
            sink.close(failed)
        self.sinks = ()

    def truncate_after(self, step: int) -> int:
        """Drop what a resume from a checkpoint after `step` steps redoes: the records of later
        steps, the events and end at or past it (a stop there is superseded by the resume), and
        a last line cut short by a crash. Returns how many records were dropped.

        Records are appended in order of their step (every record but the header has one, and
        none is ever smaller than one before it), so the records to drop are a tail of the file:
        it is read backwards only as far as the first record to keep and cut there, in place.
        A resume's cost does not grow with the length of the run, and the cut never needs free
        disk space; a crash leaves the file at its old or its new length, both readable.
        The sinks opened next drop everything at or past `step` (a tracker cuts by step, and a
        stop event shares its step with the last step kept); the kept records of step `step`
        itself are sent to them again."""
        self._cut, self._replay = step, []
        if not self.path.exists():
            return 0
        schema = file_schema(self.path)
        with open(self.path, "r+b") as f:
            end = f.seek(0, os.SEEK_END)
            cut, dropped, needs_newline = end, 0, False
            for start, line in _lines_backwards(f, end):
                try:
                    record = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    record = None  # a line cut short by a crash
                if isinstance(record, dict) and _kept(record, step, schema):
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
        if schema == LOG_SCHEMA:
            self._replay = _records_of_step(self.path, step)
        return dropped


def _kept(record: dict[str, Any], done: int, schema: int) -> bool:
    """Whether a resume from a checkpoint after `done` steps keeps this record."""
    if record.get("type") == "header":
        return True
    step = record.get("step", -1)
    if not isinstance(step, int):
        return False
    if names_a_step(record):  # step number n (schema 1 wrote n - 1): kept if done by then
        return step + (schema == 1) <= done
    return step < done  # a count of steps done: events and end at the boundary are redone


def _records_of_step(path: Path, step: int) -> list[dict[str, Any]]:
    """The records of step number `step` (step, val, hash, tensors) at the end of a schema-2 log cut
    back to it, in file order."""
    found = []
    with open(path, "rb") as f:
        for _, line in _lines_backwards(f, f.seek(0, os.SEEK_END)):
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if not isinstance(record, dict) or record.get("type") == "header":
                break
            if record.get("step") != step:
                if isinstance(record.get("step"), int) and record["step"] < step:
                    break
                continue
            if names_a_step(record):
                found.append(record)
    return found[::-1]


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


def git_commit() -> str | None:
    """The octlm checkout's commit, for the log header; None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
