"""The suite's fork servers (tests/octlm_process.py, tests/shim_server.py) are a faithful
`python -m octlm`.

Most e2e tests start their commands by forking a server that has done the imports; if that
changed a bit of a run, every exactness test would be checking the harness, not octlm.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from octlm.tools import subrun
from tests import octlm_process, shim_server
from tests.doc_blocks import run_block, shim, shim_env
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


def test_a_doc_blocks_octlm_answers_as_a_fresh_one(tmp_path, monkeypatch) -> None:
    """A walkthrough's `octlm` (tests/shim_server.py: a client of a server that has done the
    imports) gives its block what a fresh `python -m octlm` gives: the output through a pipe,
    the error through a redirect, the exit code, the working folder."""
    block = 'octlm --version | tr a-z A-Z\noctlm hash missing 2> err.txt || echo "code $?"\n'
    block += "cat err.txt\n"
    results = []
    for name in ("forked", "fresh"):
        if name == "fresh":  # OCTLM_TEST_FRESH=1: the shim is a plain `python -m octlm`
            monkeypatch.setenv("OCTLM_TEST_FRESH", "1")
        (tmp_path / name).mkdir()
        bin_dir = shim(tmp_path / name, "octlm")
        assert ("socket" in (bin_dir / "octlm").read_text()) == (name == "forked")
        results.append(run_block(block, tmp_path, shim_env(bin_dir)))
    forked, fresh = results
    assert forked.stdout == fresh.stdout and forked.stderr == fresh.stderr == ""
    lines = forked.stdout.splitlines()
    assert lines[0].startswith("OCTLM ") and lines[1] == "code 1"
    assert lines[2].startswith("octlm: error: missing does not exist")


def test_a_launchers_own_runs_start_through_the_client(tiny_dataset, tmp_path, monkeypatch):
    """verify-resume's (and sweep's, rl --verify-split's) runs: octlm/tools/subrun.py's command
    line becomes the shim client's, which forks them from its server; from a test's `octlm` and
    from a doc block's, the runs end identical as they do started fresh."""
    client = shim_server.client_path()
    assert client is not None and "socket" in Path(client).read_text()
    monkeypatch.setattr(subrun, "train_argv", subrun.train_argv)  # restored after the test
    plain = subrun.train_argv(tmp_path / "c.toml", tmp_path / "run", "--resume")
    octlm_process.launch_through(client)
    assert subrun.train_argv(tmp_path / "c.toml", tmp_path / "run", "--resume") == [
        client,
        *plain[3:],
    ]
    args = ["verify-resume", "--model", "tiny", "--data", str(tiny_dataset), "--steps", "4"]
    args += ["--warmup", "1"]
    args += ["--split", "2", "--context", "32", "--micro-batch", "2", "--accum", "1"]
    args += ["--dtype", "fp32", "--val-every", "0", "--workdir", str(tmp_path)]
    assert any(arg in octlm_process.LAUNCHERS for arg in args)
    forked = octlm(*args).stdout
    block = run_block(
        " ".join(["octlm", *args]) + "\n", tmp_path, shim_env(shim(tmp_path, "octlm"))
    )
    for out in (forked, block.stdout):
        assert out.splitlines()[2].rstrip().endswith("identical"), out
        assert out.splitlines()[-1].startswith("identical:"), out
