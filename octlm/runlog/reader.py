"""Reading a run log: where it is (`LOG_NAME`, `log_file`, `require_log`), its schema
(`LOG_SCHEMA`, `file_schema`, `names_a_step`) and `read_log`, the one tolerant reader every
tool uses: a line cut short or garbled is skipped and counted, a schema-1 log is read in
schema 2's step numbers (the package doc). The writer (`writer.py`) builds on these names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from octlm.config import checks
from octlm.errors import OctlmError

LOG_NAME = "log.jsonl"
LOG_SCHEMA = 2
_NUMBERED = ("step", "val", "hash", "tensors")
"""Record types whose `step` names an optimizer step (1-based in schema 2, 0-based in 1)."""


def names_a_step(record: dict[str, Any]) -> bool:
    """Whether the record's `step` is a step's number (schema 1 wrote those from 0), not a
    count of steps done (events at a boundary, `end`: the same in both schemas)."""
    kind = record.get("type")
    return kind in _NUMBERED or (kind == "event" and record.get("event") == "nonfinite")


def file_schema(path: Path) -> int:
    """The schema of an existing log (its header's `log_schema`; 1 when absent), else the
    current one."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline()
    except FileNotFoundError:
        return LOG_SCHEMA
    try:
        header = json.loads(first)
    except json.JSONDecodeError:
        return LOG_SCHEMA
    if not isinstance(header, dict) or header.get("type") != "header":
        return LOG_SCHEMA
    schema = header.get("log_schema", 1)
    return schema if schema in (1, LOG_SCHEMA) else LOG_SCHEMA


def log_file(run: str | Path) -> Path:
    """The log of a run folder, or the log file itself."""
    path = Path(run)
    return path / LOG_NAME if path.is_dir() else path


def require_log(run: str | Path) -> Path:
    """The log of `run`; a one-line error when `run` is not a run folder (or a log file)."""
    checks.check_path("run", run)  # `octlm.read_log` takes anything a notebook hands it
    path = log_file(run)
    if not path.is_file():
        raise OctlmError(
            f"no run log at {path}",
            "name a run folder written by `octlm train` (it holds log.jsonl), or the log itself",
        )
    return path


def read_log_counted(run: str | Path) -> tuple[list[dict[str, Any]], int]:
    """The readable records of a run's log, and how many non-empty lines were not records.

    A kill can cut the last line short, and a damaged disk can garble one: such lines are
    skipped and counted, never a traceback. A missing log is an `OctlmError`.
    """
    records: list[dict[str, Any]] = []
    bad, schema = 0, None
    with open(require_log(run), encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if isinstance(record, dict) and isinstance(record.get("type"), str):
                if schema is None and record["type"] == "header":
                    schema = record.get("log_schema", 1)
                if schema == 1 and names_a_step(record) and isinstance(record.get("step"), int):
                    record["step"] += 1  # read in today's numbering (the package doc)
                records.append(record)
            else:
                bad += 1
    return records, bad


def read_log(run: str | Path) -> list[dict[str, Any]]:
    """The readable records of a run folder's (or a file's) log; see `read_log_counted`."""
    return read_log_counted(run)[0]
