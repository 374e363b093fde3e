"""RL run folders written before RL's settings joined the one settings system and its loop the
one lifecycle (commit 7cbaa24) resume exactly with today's code: the old code, from the
repository's history, runs a straight RL run and one stopped at step 2 on this machine; today's
`octlm rl --resume` finishes the stopped one on the old straight run's bits. Control: a resume
with another seed is refused in one line, not continued."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import end_hash, octlm
from tests.old_code import extract, run_old
from tests.rl.helpers import RL, chat_source
from tests.shared import shared

pytestmark = pytest.mark.slow
BEFORE = "7cbaa24"
"""The last commit with rl/settings.py, cli/rl.py's own flag builder and rl/loop.py's own
lifecycle."""


@pytest.fixture(scope="module")
def source(tiny_tokenizer, tmp_path_factory) -> Path:
    return chat_source(tiny_tokenizer, tmp_path_factory)


@pytest.fixture(scope="module")
def old_runs(source, tmp_path_factory) -> Path:
    """The old code's straight RL run and its run stopped at step 2 (`straight`, `split`)."""

    def build(root: Path) -> None:
        tree = extract(BEFORE, root / "code")
        for name, extra in (("straight", ()), ("split", ("--stop-at", "2"))):
            out = str(root / name)
            run_old(tree, "-m", "octlm", "rl", str(source), *RL, "--out", out, *extra)

    return shared(tmp_path_factory, "rl-old-runs", build)


def test_an_old_stopped_rl_run_resumes_to_the_old_straight_runs_bits(old_runs, source, tmp_path):
    import shutil

    split = tmp_path / "split"
    shutil.copytree(old_runs / "split", split)
    octlm("rl", str(source), *RL, "--out", str(split), "--resume")
    assert end_hash(split) == end_hash(old_runs / "straight")
    # Control: today's straight run from the same source lands there too (nothing moved).
    octlm("rl", str(source), *RL, "--out", str(tmp_path / "today"))
    assert end_hash(tmp_path / "today") == end_hash(old_runs / "straight")


def test_an_old_rl_run_with_other_settings_is_refused_not_continued(old_runs, source, tmp_path):
    import shutil

    split = tmp_path / "split"
    shutil.copytree(old_runs / "split", split)
    proc = octlm(
        "rl", str(source), *RL, "--out", str(split), "--resume", "--seed", "1", check=False
    )
    assert proc.returncode == 1 and "--seed 0 -> 1" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_an_old_rl_run_keeps_sampling_on_the_plain_path(old_runs, source, tmp_path):
    """Runs written before exact decoding sampled on the plain path: a resume keeps it (its
    trajectory records no sampler) and refuses another; a new run samples exactly."""
    import shutil

    from octlm.trainer import checkpoint as ckpt

    split = tmp_path / "split"
    shutil.copytree(old_runs / "split", split)
    refused = octlm("rl", str(source), *RL, "--out", str(split), "--resume", "--sampler",
                    "exact", check=False)  # fmt: skip
    assert refused.returncode == 1 and "sampler" in refused.stderr
    octlm("rl", str(source), *RL, "--out", str(split), "--resume")
    old, _ = ckpt.load_checkpoint(*ckpt.find_checkpoint(split))
    assert "sampler" not in old.as_written()["trajectory"]
    octlm("rl", str(source), *RL, "--out", str(tmp_path / "new"))
    new, _ = ckpt.load_checkpoint(*ckpt.find_checkpoint(tmp_path / "new"))
    assert new.as_written()["trajectory"]["sampler"] == "exact"
