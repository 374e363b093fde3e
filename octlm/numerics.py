"""The process's numeric environment: thread-library settings pinned before torch loads.

MKL and OpenMP read these variables once, when the library starts (at `import torch`), so
they are set by `octlm/__init__.py`, before anything of octlm imports torch: the `octlm`
command, every worker a launcher starts (`-m octlm`), and the Python API's first use. A value
the user set wins and is recorded as theirs; so is the case of torch imported before octlm
(a notebook), where the pinning comes too late to matter.

Why these (bench/thread_determinism.py, docs/exactness.md "Thread and BLAS settings"): MKL's
dynamic adjustment is on by default (MKL_DYNAMIC=TRUE) and may run a call on fewer threads
than asked when the machine is busy, which splits a reduction differently and changes the last
bits from one fresh process to the next. Turning it off costs nothing measurable and changes
no bit of a run on an idle machine, so run folders written before it resume exactly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

PINNED: dict[str, str] = {"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"}
"""Set unless the user set them."""
RECORDED = (*PINNED, "MKL_CBWR")
"""Recorded in the build record: the pinned ones, and MKL's reproducibility mode (the user's
choice; it changes the bits, and even AUTO,STRICT does not make 1 and 2 threads agree on the
`small` preset: docs/exactness.md)."""

MARK = "OCTLM_PINNED"
"""The variables octlm set in this process, for the processes it starts."""
READ_AT_START = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "ONEDNN_", "DNNL_", "ATEN_")
READ_AT_START += ("TORCH_", "PYTORCH_", "CUDA", "NCCL_", "PYTHON", "LD_", "MALLOC", "GLIBC")
"""Prefixes of the variables that libraries (and Python itself) may read only while a process
starts or imports them: a process that changed one since then is not what a fresh process
with its environment would be (octlm/trainer/forkserver_here.py)."""

_user_set: frozenset[str] = frozenset()
_late = False
_values: dict[str, str | None] = {}
_at_start: dict[str, str] = {}


def pin() -> None:
    """Set the pinned variables the user left unset; remember which were the user's and
    whether torch had started already (then the values in effect are torch's, not these)."""
    global _user_set, _late, _values, _at_start
    _late = "torch" in sys.modules
    # A launcher's workers inherit what octlm pinned in the launcher: that is not the user's.
    inherited = set(os.environ.get(MARK, "").split(","))
    _user_set = frozenset(k for k in RECORDED if k in os.environ and k not in inherited)
    ours = inherited | {k for k in PINNED if k not in os.environ}
    for key, value in PINNED.items():
        os.environ.setdefault(key, value)
    os.environ[MARK] = ",".join(sorted(ours - {""}))
    _values = {key: os.environ.get(key) for key in RECORDED}  # what the libraries will read
    _at_start = read_at_start(os.environ)


def read_at_start(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` named by `READ_AT_START`."""
    return {k: v for k, v in env.items() if k.startswith(READ_AT_START)}


def changed_since_start() -> list[str]:
    """The `READ_AT_START` variables whose value differs from when octlm was imported (a
    variable set or removed since counts), sorted."""
    now = read_at_start(os.environ)
    return sorted(k for k in now.keys() | _at_start.keys() if now.get(k) != _at_start.get(k))


def record() -> dict[str, Any]:
    """The settings as a build record holds them: each variable's value when octlm was first
    imported (None: unset; a later change reaches no library) and who chose it."""
    values: dict[str, Any] = dict(_values)
    values["set_by_user"] = sorted(_user_set)
    values["torch_loaded_first"] = _late
    return values


def bits_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """What differs between two records in a way that can change a run's bits on an idle
    machine: MKL's reproducibility mode. The dynamic switches only matter under load, where
    they are the nondeterminism itself; a record from before this module (None) ran with
    every variable unset."""
    before = (old or {}).get("MKL_CBWR")
    after = new.get("MKL_CBWR")
    return [] if before == after else [f"MKL_CBWR: {before} -> {after}"]
