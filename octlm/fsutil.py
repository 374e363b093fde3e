"""Atomic file writes: temporary file, flush, fsync, rename, fsync of the folder.

A rename either happens completely or not at all, so a crash at any point leaves the previous
file intact and never a half-written one under the final name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from octlm.errors import OctlmError


def cache_dir() -> Path:
    """`$OCTLM_CACHE`, else ~/.cache/octlm: the embedded corpus, the measured peak."""
    return Path(os.environ.get("OCTLM_CACHE") or Path.home() / ".cache" / "octlm")


def fsync_path(path: str | Path) -> None:
    """fsync a file's data, or a folder's entries (what makes a rename durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` to fill a temporary file, then move it over `path` durably."""
    path = Path(path)
    tmp = tmp_path(path)
    try:
        write(tmp)
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def read_json_object(path: Path, error: type[OctlmError], fix: str) -> dict[str, Any]:
    """A JSON file that must hold an object (a config file beside weights or a tokenizer); any
    other content is `error(problem, fix)`, one line."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path} is not readable JSON ({exc})", fix) from None
    if not isinstance(data, dict):
        raise error(f"{path} is not a JSON object", fix)
    return data
