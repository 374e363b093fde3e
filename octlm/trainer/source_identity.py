"""Whether the source a resume names is the one its run started from, wherever it is typed.

A run records its source twice: as the user typed it (relative to the working folder of the
day, in the settings) and as the file it read (absolute, in the source's record). A resume
compares the path typed now, resolved in today's working folder, with that file, so the same
run resumes from any folder; a source copied or moved elsewhere counts when its weights are
the recorded ones. Anything else is another source, refused with both sides in full.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from octlm.errors import OctlmError
from octlm.trainer.checkpoint import CKPT_DIR


def source_folder(file: str) -> Path:
    """The folder a user names for a recorded source file: a run folder for one of its
    checkpoints, the folder of an export's or a Hugging Face model's weights."""
    path = Path(file)
    return path.parent.parent if path.parent.name == CKPT_DIR else path.parent


def names_file(typed: str, file: str) -> bool:
    """Whether `typed` (resolved here) names the recorded source `file`: the file itself, its
    run folder or the folder it lies in."""
    given, recorded = Path(typed).resolve(), Path(file).resolve()
    return given in (recorded, recorded.parent, source_folder(str(recorded)))


def other_source(
    typed: str,
    given: str | None,
    file: str,
    sha256: str | None,
    weights_sha256: Callable[[str], str],
) -> str | None:
    """None when `typed` names the recorded source: `file`, the absolute file read when the run
    started (typed then as `given`), by its path or, for a source moved or copied since, by its
    weights (`weights_sha256(typed)` reads them, compared with the recorded `sha256`).
    Otherwise both sides in full, for the refusal to name."""
    if names_file(typed, file):
        return None
    if Path(typed).exists() and sha256 and _weights_or_none(typed, weights_sha256) == sha256:
        return None
    then = f" (given as {given})" if given and given != file else ""
    return f"{file}{then}, not {Path(typed).resolve()} (given as {typed})"


def _weights_or_none(typed: str, weights_sha256: Callable[[str], str]) -> str | None:
    try:
        return weights_sha256(typed)
    except OctlmError:  # not a source at all: another one, named as such by the caller
        return None
