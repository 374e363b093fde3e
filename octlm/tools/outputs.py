"""What a tool may write to, checked before it does any work, and what it writes, checked finite
before a byte of it is written (`octlm merge`, `export`, `plot`, `report`).

A run folder (one holding `log.jsonl` or `checkpoints/`) is never an output: a tool that wrote
its files there, or beside them in a folder inside it, would leave a run that can no longer be
told from its own files (merged weights where a run resumes, a model's config.json over the
run's). Torch-free: torch is imported where tensors are checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from octlm.config.checks import shown, shown_path
from octlm.errors import OctlmError
from octlm.runlog.reader import LOG_NAME

RUN_MARKS = (LOG_NAME, "checkpoints")
"""A folder holding either is a run (`octlm train`'s log, its checkpoints)."""
LISTED = "checkpoints/latest.json"
"""Above the output, a folder is a run by its log or its list of checkpoints: a folder of
unrelated files that happens to hold a `checkpoints/` folder (a home folder) is not."""


def run_folder_at_or_above(path: Path) -> Path | None:
    """The run folder `path` is, or lies inside; None when it is in none."""
    path = path.absolute()
    if path.is_dir() and any((path / mark).exists() for mark in RUN_MARKS):
        return path
    for folder in path.parents:
        if (folder / LOG_NAME).is_file() or (folder / LISTED).is_file():
            return folder
    return None


def file_above(path: Path) -> Path | None:
    """A file where one of `path`'s parent folders should be (nothing can be written there)."""
    for parent in path.parents:  # as the user wrote it, relative or not
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def check_folder_out(flag: str, out: Path, force: bool, replaceable: Iterable[str] = ()) -> None:
    """An output folder: not a file, not a run folder nor inside one, no file among its
    parents, and new or empty unless --force (which, given `replaceable`, replaces only a folder
    holding one of those files: one this tool wrote)."""
    run = run_folder_at_or_above(out)
    if run is not None:
        where = "is a run folder" if run == out.absolute() else f"is inside the run folder {run}"
        raise OctlmError(
            f"{flag} {shown_path(out)} {where}, which its run could no longer resume from",
            f"name a folder outside the run for {flag}",
        )
    check_no_file_above(flag, out)
    if out.exists() and not out.is_dir():
        raise OctlmError(f"{flag} {shown_path(out)} is a file", f"name a folder for {flag}")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise OctlmError(
            f"{flag} {shown_path(out)} already exists and is not empty",
            f"name a new folder for {flag}, or add --force",
        )
    marks = tuple(replaceable)
    if marks and not any((out / name).is_file() for name in marks):
        raise OctlmError(
            f"{flag} {shown_path(out)} is not empty and was not written by this command "
            f"(no {marks[0]})",
            f"name a new folder for {flag}; --force only replaces this command's own output",
        )


def check_no_file_above(flag: str, out: Path) -> None:
    above = file_above(out)
    if above is not None:
        raise OctlmError(
            f"{flag} {shown_path(out)} lies under {shown_path(above)}, which is a file",
            f"name a path under a folder for {flag}",
        )


def check_file_out(flag: str, out: Path, kinds: tuple[str, ...] = ()) -> None:
    """An output file: not an existing folder, no file among its parents, and (given `kinds`,
    the suffixes it may end in) one of those, or none (the writer's default)."""
    if out.is_dir():
        example = "out.png" if kinds else "out.html"
        raise OctlmError(f"{shown_path(out)} is a folder", f"name a file, e.g. {flag} {example}")
    check_no_file_above(flag, out)
    allowed = sorted(kinds)
    if allowed and out.suffix and out.suffix.lower().lstrip(".") not in allowed:
        raise OctlmError(
            f"{flag} {shown_path(out)} ends in {shown(out.suffix)}, a format this cannot write",
            f"end it in one of .{', .'.join(allowed)}",
        )


def check_finite(tensors: Mapping[str, Any], what: str) -> None:
    """Every tensor finite, or one line naming the first that is not: checked before writing."""
    import torch

    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise OctlmError(
                f"{what}: tensor {shown(name)} holds NaN or inf values; nothing was written",
                "check the sources (octlm hash, octlm eval) and merge or export finite weights",
            )
