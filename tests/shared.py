"""Built once per test session, whatever the number of pytest-xdist workers.

A session- or module-scoped fixture runs once per worker process: with `-n 2` the suite built
its tokenizer, dataset and reference runs twice, and with `--dist worksteal` a module's tests
may run on both workers, so a module's reference runs were trained twice too. `shared` builds
a folder under the session's common temporary root, behind a file lock: the first worker to
ask builds it, the others wait and read it. What it holds is read-only for the tests.

Test modules import from here, never from each other.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def shared(
    tmp_path_factory: pytest.TempPathFactory, key: str, build: Callable[[Path], None]
) -> Path:
    """The folder `key`, filled by `build(folder)` once per session (a build that fails leaves
    nothing, so the next worker to ask builds it again and fails the same way)."""
    # Under xdist each worker's basetemp is <session root>/popen-gwN; without it, the root's
    # parent is a per-user folder that outlives the session, so stay inside basetemp.
    base = tmp_path_factory.getbasetemp()
    root = base.parent if base.name.startswith("popen-gw") else base
    folder = root / "shared" / key
    folder.parent.mkdir(parents=True, exist_ok=True)
    done = folder.parent / f"{key}.done"
    with FileLock(str(folder.parent / f"{key}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.touch()
    return folder
