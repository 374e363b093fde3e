"""The thread-library settings octlm pins before torch loads, and what a resume compares.

Fresh interpreters, because the pinning happens once, at `import octlm`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from octlm.device import build_changes
from tests.e2e.helpers import train_args

PROBE = "import octlm, json; from octlm.numerics import record; print(json.dumps(record()))"
OURS = ("MKL_DYNAMIC", "OMP_DYNAMIC", "MKL_CBWR", "OCTLM_PINNED")


def _record(code: str, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in OURS}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_unset_variables_are_pinned_before_torch_loads() -> None:
    rec = _record(PROBE + "; import os; assert os.environ['MKL_DYNAMIC'] == 'FALSE'")
    assert rec == {
        "MKL_DYNAMIC": "FALSE",
        "OMP_DYNAMIC": "FALSE",
        "MKL_CBWR": None,
        "set_by_user": [],
        "torch_loaded_first": False,
    }


def test_the_users_values_win_and_are_recorded_as_theirs() -> None:
    rec = _record(PROBE, MKL_DYNAMIC="TRUE", MKL_CBWR="AUTO,STRICT")
    assert rec["MKL_DYNAMIC"] == "TRUE" and rec["OMP_DYNAMIC"] == "FALSE"
    assert rec["MKL_CBWR"] == "AUTO,STRICT"
    assert rec["set_by_user"] == ["MKL_CBWR", "MKL_DYNAMIC"]


def test_a_launchers_workers_know_octlms_values_from_the_users() -> None:
    """Workers inherit the launcher's environment, octlm's pinned values included."""
    code = (
        "import octlm, os, subprocess, sys; "
        f"subprocess.run([sys.executable, '-c', {PROBE!r}], check=True)"
    )
    assert _record(code)["set_by_user"] == []
    assert _record(code, MKL_DYNAMIC="TRUE")["set_by_user"] == ["MKL_DYNAMIC"]


@pytest.mark.slow  # the only one of these interpreters that imports torch
def test_torch_imported_first_is_recorded() -> None:
    """In a notebook that imported torch before octlm, the pinning comes too late: the record
    says so rather than claim settings that MKL never read."""
    assert _record("import torch; " + PROBE)["torch_loaded_first"] is True


BUILD = {"torch": "2.13.0", "device": "cpu:x86_64", "threads": 2, "platform": "Linux"}
PINNED = {"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE", "MKL_CBWR": None}


@pytest.mark.parametrize(
    ("old", "new", "changes"),
    [
        # A checkpoint from before the pinning: the dynamic switch is no difference.
        (BUILD, {**BUILD, "numerics": PINNED}, []),
        (
            {**BUILD, "numerics": PINNED},
            {**BUILD, "numerics": {**PINNED, "MKL_CBWR": "COMPATIBLE"}},
            ["MKL_CBWR: None -> COMPATIBLE"],
        ),
        (
            {**BUILD, "numerics": PINNED},
            {**BUILD, "threads": 1, "numerics": PINNED},
            ["threads: 2 -> 1"],
        ),
        (  # strict CNR on both sides still splits ATen's own reductions by thread count
            {**BUILD, "numerics": {**PINNED, "MKL_CBWR": "AUTO,STRICT"}},
            {**BUILD, "threads": 1, "numerics": {**PINNED, "MKL_CBWR": "AUTO,STRICT"}},
            ["threads: 2 -> 1"],
        ),
        (
            {**BUILD, "numerics": {**PINNED, "set_by_user": []}},
            {**BUILD, "numerics": {**PINNED, "MKL_DYNAMIC": "TRUE", "set_by_user": ["x"]}},
            [],
        ),
    ],
)
def test_build_changes_name_what_can_change_bits(old, new, changes) -> None:
    assert build_changes(old, new) == changes


@pytest.mark.slow
def test_a_resume_under_another_mkl_mode_is_told_it_is_no_longer_exact(tiny_dataset, tmp_path):
    out = tmp_path / "run"
    base = {k: v for k, v in os.environ.items() if k not in OURS}

    def train(*extra: str, **env: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "octlm", *train_args(tiny_dataset, out, *extra)]
        proc = subprocess.run(cmd, env={**base, **env}, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc

    train("--stop-at", "2")
    header = json.loads((out / "log.jsonl").read_text().splitlines()[0])
    assert header["build"]["numerics"]["MKL_DYNAMIC"] == "FALSE"
    proc = train("--resume", MKL_CBWR="COMPATIBLE")
    notes = [ln for ln in proc.stderr.splitlines() if "different build" in ln]
    assert len(notes) == 1 and "MKL_CBWR: None -> COMPATIBLE" in notes[0]
