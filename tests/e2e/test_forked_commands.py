"""The suite's fork server (tests/octlm_process.py) is a faithful `python -m octlm`.

Most e2e tests start their commands by forking a server that has done the imports; if that
changed a bit of a run, every exactness test would be checking the harness, not octlm.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import octlm_process
from tests.e2e.helpers import end_hash, octlm, steps_of, train_args

pytestmark = pytest.mark.slow


def test_a_forked_command_ends_on_a_fresh_process_bits(tiny_dataset, tmp_path, monkeypatch):
    forked, fresh = tmp_path / "forked", tmp_path / "fresh"
    assert octlm_process.server_for(dict(os.environ)) is not None  # the run below is forked
    octlm(*train_args(tiny_dataset, forked, "--stop-at", "4"))
    octlm(*train_args(tiny_dataset, forked, "--resume"))
    monkeypatch.setenv("OCTLM_TEST_FRESH", "1")  # plain `python -m octlm`, as a user starts it
    octlm(*train_args(tiny_dataset, fresh))
    assert end_hash(forked) == end_hash(fresh)
    assert steps_of(forked) == steps_of(fresh)


def test_a_server_whose_import_time_settings_drifted_is_replaced(monkeypatch, tmp_path) -> None:
    """torch sets TORCHINDUCTOR_CACHE_DIR in the test process when a test compiles; commands
    after it must still be forked (by a new server that has the setting), not started fresh."""
    before = octlm_process.server_for(dict(os.environ))
    assert before is not None
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    after = octlm_process.server_for(dict(os.environ))
    assert after is not None and after is not before
    assert before.poll() is not None  # the old one has ended
    proc = octlm("hash", str(Path(tmp_path / "missing")), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr  # and it serves commands
