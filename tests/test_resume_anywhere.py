"""A resumed run's identity (issue 62, kind 4): a run started in folder A with its source, data
and output given relative to A resumes from folder B (every path now relative to B) and ends on
the straight run's weights (`octlm hash`), for `octlm rl` and for `octlm train --init-from`.
Controls: the path typed in A, typed again in B, names another folder there, and another run
given as the source: each refused in one line naming both sources in full, nothing changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.helpers import octlm
from tests.rl.helpers import chat_source
from tests.test_bad_input import tree

pytestmark = pytest.mark.slow  # real subprocesses

RL = ("--task", "addition:1", "--steps", "2", "--prompts", "4", "--samples", "4")
RL += ("--max-new-tokens", "6", "--eval-every", "0", "--ckpt-every", "1", "--no-progress")
TRAIN = ("--context", "64", "--micro-batch", "8", "--accum", "1", "--steps", "2", "--warmup", "1")
TRAIN += ("--val-every", "0", "--ckpt-every", "1", "--dtype", "fp32", "--no-progress")


@pytest.fixture(scope="module")
def source(tiny_tokenizer, tmp_path_factory) -> Path:
    return chat_source(tiny_tokenizer, tmp_path_factory)


def rel(path: Path, cwd: Path) -> str:
    return os.path.relpath(path, cwd)


def weights_hash(run: Path) -> str:
    return octlm("hash", str(run)).stdout.split()[0]


def folders(tmp_path: Path) -> tuple[Path, Path]:
    """A and B at different depths, so a relative path typed in A names another place in B."""
    a, b = tmp_path / "a", tmp_path / "deeper" / "b"
    a.mkdir()
    b.mkdir(parents=True)
    return a, b


def refused(args: list[str], cwd: Path, *says: str) -> None:
    before = tree(cwd.parent.parent)
    proc = octlm(*args, cwd=cwd, check=False)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(s in lines[0] for s in says), lines[0]
    assert tree(cwd.parent.parent) == before


def test_an_rl_run_resumes_from_another_folder(source, tmp_path) -> None:
    a, b = folders(tmp_path)
    octlm("rl", rel(source, a), *RL, "--out", "straight", cwd=a)
    octlm("rl", rel(source, a), *RL, "--out", "split", "--stop-at", "1", cwd=a)
    resume = [*RL, "--out", rel(a / "split", b), "--resume"]
    file = f"{source.resolve()}/checkpoints/step_000030.safetensors (given as {rel(source, a)})"
    # Controls: A's spelling in B (another place), and another run as the source.
    refused(["rl", rel(source, a), *resume], b, file, f"not {(b / rel(source, a)).resolve()}")
    refused(["rl", rel(a / "straight", b), *resume], b, file, f"not {a / 'straight'}")
    octlm("rl", rel(source, b), *resume, cwd=b)
    assert weights_hash(a / "split") == weights_hash(a / "straight")
    assert weights_hash(a / "split") != weights_hash(source)  # the run moved the weights


def test_a_training_run_from_init_from_resumes_from_another_folder(source, tmp_path) -> None:
    a, b = folders(tmp_path)
    data = source.parent / "data"

    def train(cwd: Path, init: Path | str, out: str, *extra: str) -> list[str]:
        init = init if isinstance(init, str) else rel(init, cwd)
        return [
            "train",
            "--init-from",
            init,
            "--data",
            rel(data, cwd),
            *TRAIN,
            "--out",
            out,
            *extra,
        ]

    octlm(*train(a, source, "straight"), cwd=a)
    octlm(*train(a, source, "split", "--stop-at", "1"), cwd=a)
    split = rel(a / "split", b)
    file = f"{source.resolve()}/checkpoints/step_000030.safetensors (given as {rel(source, a)})"
    says = f"the run in {split} started from --init-from {file}"
    refused(train(b, rel(source, a), split, "--resume"), b, says, "resume with --init-from")
    refused(train(b, a / "straight", split, "--resume"), b, says, f"not {a / 'straight'}")
    octlm(*train(b, source, split, "--resume"), cwd=b)
    assert weights_hash(a / "split") == weights_hash(a / "straight")
    assert weights_hash(a / "split") != weights_hash(source)
