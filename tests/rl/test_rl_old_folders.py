"""RL run folders written before RL's settings joined the one settings system and its loop the
one lifecycle (commit 7cbaa24) resume exactly with today's code: the old code, from the
repository's history, runs a straight RL run and one stopped at step 2 on this machine; today's
`octlm rl --resume` finishes the stopped one on the old straight run's bits. Control: a resume
with another seed is refused in one line, not continued."""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.config.rl import EXACT_KERNEL
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


def old_rl_runs(commit: str, source: Path, factory, name: str, *flags: str) -> Path:
    """`commit`'s straight RL run and its run stopped at step 2 (`straight`, `split`), built
    once per session."""

    def build(root: Path) -> None:
        tree = extract(commit, root / "code")
        for run, extra in (("straight", ()), ("split", ("--stop-at", "2"))):
            out = str(root / run)
            run_old(tree, "-m", "octlm", "rl", str(source), *RL, *flags, "--out", out, *extra)

    return shared(factory, name, build)


@pytest.fixture(scope="module")
def old_runs(source, tmp_path_factory) -> Path:
    return old_rl_runs(BEFORE, source, tmp_path_factory, "rl-old-runs")


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


KERNEL_1 = "aea8c42"
"""The last commit whose exact path had one product kernel (MKL's tiles of 2 rows, today's
kernel 1), recorded by no key."""


@pytest.fixture(scope="module")
def old_exact_runs(source, tmp_path_factory) -> Path:
    """That code's on-policy RL runs (exact sampler, exact update)."""
    return old_rl_runs(KERNEL_1, source, tmp_path_factory, "rl-old-exact-runs", "--on-policy")


def test_an_old_exact_rl_run_resumes_on_its_own_kernel(old_exact_runs, source, tmp_path):
    """An on-policy run that sampled with the exact path's first kernel resumes on it, to the
    old straight run's bits; asking it for kernel 2, or leaving out its --on-policy, is refused
    in one line; a new run records the newest kernel (kernel 2's products differ from kernel
    1's on `tiny`'s shapes, tests/model/test_exact_products.py, and kernel 3's attention from
    both, tests/model/test_exact_blocks.py)."""
    import shutil

    from octlm.trainer import checkpoint as ckpt

    split = tmp_path / "split"
    shutil.copytree(old_exact_runs / "split", split)
    resume = ("rl", str(source), *RL, "--out", str(split), "--resume")
    refused = octlm(*resume, "--on-policy", "--exact-kernel", "2", check=False)
    assert refused.returncode == 1 and "--exact-kernel 1 -> 2" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    # A key the run recorded is not dropped by leaving its flag out either.
    dropped = octlm(*resume, check=False)
    assert dropped.returncode == 1 and "--on-policy True -> False" in dropped.stderr
    octlm(*resume, "--on-policy")
    assert end_hash(split) == end_hash(old_exact_runs / "straight")
    old, _ = ckpt.load_checkpoint(*ckpt.find_checkpoint(split))
    assert "exact_kernel" not in old.as_written()["trajectory"]
    octlm("rl", str(source), *RL, "--on-policy", "--out", str(tmp_path / "new"))
    new, _ = ckpt.load_checkpoint(*ckpt.find_checkpoint(tmp_path / "new"))
    assert new.as_written()["trajectory"]["exact_kernel"] == EXACT_KERNEL
