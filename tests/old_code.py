"""Older octlm, run on this machine: a commit of the repository's own history, extracted with
`git archive` into a folder and run with that folder first on PYTHONPATH.

"Run folders users already have keep resuming exactly" needs the old code's bits, and bits
are a property of the CPU (AVX2 against AVX-512, MKL code paths): a run folder written on the
machine that wrote the tests ends elsewhere on other bits. So the old side is computed here,
by the old code, and today's code must land on what it computed.

Test modules import from here, never from each other.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def extract(commit: str, dest: Path) -> Path:
    """The tree of `commit` under `dest`; skips the test when this checkout lacks the commit
    (an installed package, a shallow clone), saying which history it needs."""
    have = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if have.returncode != 0:
        pytest.skip(
            f"needs octlm's git history (commit {commit[:12]}, the code that wrote the old run "
            "folders): run the suite from a full clone (`git fetch --unshallow`)"
        )
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit],
        capture_output=True,
        check=True,
    ).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def run_old(tree: Path, *args: str) -> subprocess.CompletedProcess:
    """`python *args` with the old tree's `octlm` package imported instead of today's, one
    intra-op thread as the suite's runs, in the old tree (so nothing of today's is on the path)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, *args], cwd=tree, capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(f"old code ({tree}) failed: {args}\n{proc.stderr[-3000:]}")
    return proc
