"""octlm.fsutil.atomic_write: a failure at any point before the rename leaves the old file as it
was and no temporary file behind; a success replaces the content whole. Real files in tmp_path;
the faults that cannot be caused for real (a failing rename or fsync) are injected.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import octlm.fsutil as fsutil
from octlm.fsutil import atomic_write, atomic_write_bytes

OLD = b"old content\n" * 100
NEW = b"new content, longer than the old one\n" * 200


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A folder holding one file with the old content, and nothing else."""
    folder = tmp_path / "folder"
    folder.mkdir()
    path = folder / "state.json"
    path.write_bytes(OLD)
    return path


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_write_raising_midway_keeps_the_old_file_and_no_temp(target: Path, exc) -> None:
    seen: list[Path] = []

    def write(tmp: Path) -> None:
        seen.append(tmp)
        with open(tmp, "wb") as f:
            f.write(NEW[: len(NEW) // 2])  # half written when it fails
            f.flush()
            assert tmp.stat().st_size == len(NEW) // 2
            raise exc

    with pytest.raises(type(exc)):
        atomic_write(target, write)
    assert target.read_bytes() == OLD
    assert entries(target.parent) == [target.name]  # the half-written temp is gone
    # The temporary file was a sibling (same filesystem, so the rename is atomic), never `path`.
    assert seen and seen[0].parent == target.parent and seen[0] != target


def test_write_that_never_creates_the_temp_keeps_the_old_file(target: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write(target, lambda tmp: None)  # fsync of the missing temp fails
    assert target.read_bytes() == OLD
    assert entries(target.parent) == [target.name]


def test_failed_rename_keeps_the_old_file_and_removes_the_temp(target, monkeypatch) -> None:
    attempted: list[tuple[bytes, str]] = []

    def failing_replace(src, dst) -> None:
        attempted.append((Path(src).read_bytes(), str(dst)))  # the temp is complete by now
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_bytes(target, NEW)
    monkeypatch.undo()
    assert attempted == [(NEW, str(target))]
    assert target.read_bytes() == OLD
    assert entries(target.parent) == [target.name]


def test_failed_fsync_of_the_temp_keeps_the_old_file_and_removes_it(target, monkeypatch) -> None:
    real_fsync = fsutil.fsync_path
    calls: list[Path] = []

    def fsync(path) -> None:
        calls.append(Path(path))
        if Path(path) != target.parent:  # the temp file's fsync
            assert Path(path).read_bytes() == NEW
            raise OSError(5, "Input/output error")
        real_fsync(path)

    monkeypatch.setattr(fsutil, "fsync_path", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        atomic_write_bytes(target, NEW)
    monkeypatch.undo()
    assert len(calls) == 1 and calls[0].parent == target.parent  # it failed before the rename
    assert target.read_bytes() == OLD
    assert entries(target.parent) == [target.name]


def test_failed_folder_fsync_after_the_rename_is_raised(target, monkeypatch) -> None:
    real_fsync = fsutil.fsync_path

    def fsync(path) -> None:
        if Path(path) == target.parent:
            raise OSError(5, "Input/output error")
        real_fsync(path)

    monkeypatch.setattr(fsutil, "fsync_path", fsync)
    with pytest.raises(OSError, match="Input/output error"):  # never silently not durable
        atomic_write_bytes(target, NEW)
    monkeypatch.undo()
    assert target.read_bytes() == NEW  # the rename had happened
    assert entries(target.parent) == [target.name]


def test_success_replaces_the_content_durably_and_leaves_no_temp(target, monkeypatch) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = fsutil.fsync_path, os.replace

    def fsync(path) -> None:
        events.append(("fsync", "folder" if Path(path) == target.parent else Path(path).name))
        real_fsync(path)

    def replace(src, dst) -> None:
        events.append(("replace", Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(fsutil, "fsync_path", fsync)
    monkeypatch.setattr(fsutil.os, "replace", replace)
    inode_before = target.stat().st_ino
    atomic_write(target, lambda tmp: tmp.write_bytes(NEW))
    monkeypatch.undo()
    assert target.read_bytes() == NEW
    assert entries(target.parent) == [target.name]
    assert target.stat().st_ino != inode_before  # a new file renamed over, not rewritten in place
    # fsync the temp's data, rename it over the target, then fsync the folder's entry.
    assert [kind for kind, _ in events] == ["fsync", "replace", "fsync"]
    assert events[0][1] != target.name  # the temp's name
    assert events[1:] == [("replace", target.name), ("fsync", "folder")]


def test_atomic_write_bytes_round_trip(tmp_path: Path) -> None:
    data = bytes(range(256)) * 4097  # every byte value, over a MiB
    path = tmp_path / "new" / "blob.bin"
    path.parent.mkdir()
    atomic_write_bytes(str(path), data)  # a str path works too, and no file existed before
    assert path.read_bytes() == data
    atomic_write_bytes(path, b"")
    assert path.read_bytes() == b""
    atomic_write_bytes(path, data[:10])
    assert path.read_bytes() == data[:10]
    assert entries(path.parent) == ["blob.bin"]
