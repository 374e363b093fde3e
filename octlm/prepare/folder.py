"""A dataset folder is written beside its destination and renamed into place when whole: an
interrupted or failed `prepare` leaves the old dataset (or nothing) at --out, never half of one."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from octlm.data.shards import MANIFEST_NAME, dataset_fingerprint
from octlm.errors import DataError
from octlm.fsutil import fsync_path


def check_out(out: Path, force: bool) -> None:
    """Refuse an --out that is a file, or a non-empty folder unless --force replaces a dataset."""
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file", "choose a folder path")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise DataError(
                f"{out} already exists and is not empty",
                "choose another --out, or pass --force to replace it",
            )
        if not (out / MANIFEST_NAME).is_file():  # --force replaces datasets, nothing else
            raise DataError(
                f"{out} is not empty and holds no dataset (no {MANIFEST_NAME})",
                "choose another --out; --force only replaces a folder `octlm prepare` wrote",
            )


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A fresh folder to write the dataset in; renamed to `out` when the block ends normally,
    removed when it raises (an old dataset at `out` is kept)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished folder to `out`; an old dataset there is removed only afterwards."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        if old is not None:  # put the old dataset back
            os.replace(old, out)
        raise
    fsync_path(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_manifest(folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Seal `manifest` with its fingerprint and write it (fsynced) as the folder's manifest."""
    manifest["fingerprint"] = dataset_fingerprint(manifest)
    with open(folder / MANIFEST_NAME, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    return manifest
