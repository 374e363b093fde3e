"""`octlm prepare` under faults a user meets, each caused for real on a running process: a worker
killed, Ctrl-C, a full disk (a small tmpfs), a missing optional dependency. Each is one line on
stderr, a non-zero exit, no traceback, nothing half-written, and the old dataset kept."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

OCTLM = [sys.executable, "-m", "octlm"]


@pytest.fixture(scope="module")
def big(corpus_docs, tiny_tokenizer, tmp_path_factory) -> tuple[Path, Path]:
    """~25 MB of JSON lines (the embedded corpus five times: seconds of encoding, so a fault
    lands mid-way) and a tokenizer file for it."""
    root = tmp_path_factory.mktemp("faults")
    corpus = root / "big.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for copy in range(5):
            for d in corpus_docs:
                f.write(json.dumps({"id": f"{copy}/{d.id}", "text": d.text}) + "\n")
    tokenizer = root / "tokenizer.json"
    tiny_tokenizer.save(tokenizer)
    return corpus, tokenizer


@pytest.fixture
def old(tmp_path, corpus_docs) -> tuple[Path, dict[str, bytes]]:
    """A finished small dataset at the --out the faulty run replaces (with --force)."""
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": d.text[:4000]}) + "\n" for d in corpus_docs))
    out = tmp_path / "data"
    done = run("prepare", str(small), "--out", str(out), "--vocab-size", "300", "--context", "16")
    assert done.returncode == 0, done.stderr
    return out, snapshot(out)


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*OCTLM, *args], capture_output=True, text=True, timeout=300, **kw)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def start(big: tuple[Path, Path], out: Path, *extra: str) -> subprocess.Popen:
    corpus, tokenizer = big
    argv = [*OCTLM, "prepare", str(corpus), "--out", str(out), "--tokenizer", str(tokenizer)]
    return subprocess.Popen(
        [*argv, "--force", "--context", "64", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a job
        # As a terminal's job has it: a runner started with `&` (nohup, some CI) passes SIGINT
        # ignored to its children, and Python then never turns it into KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_for_encoding(proc: subprocess.Popen, parent: Path) -> None:
    """Until the temporary dataset folder holds its first shard: encoding is under way."""
    deadline = time.monotonic() + 120
    while not any(p.is_dir() and (p / "train_000000.bin").exists() for p in _temps(parent)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _temps(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if ".tmp-" in p.name]


def workers_of(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = []
    for child in map(int, children):
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"octlm.prepare.pool" in cmdline:
            found.append(child)
    return found


def assert_clean_failure(out: Path, before: dict[str, bytes], stderr: str, expected: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], stderr
    assert "Traceback" not in stderr
    assert snapshot(out) == before
    assert [p.name for p in out.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name] == []


def test_a_killed_worker_is_one_line_and_keeps_the_old_dataset(big, old):
    out, before = old
    proc = start(big, out, "--workers", "2")
    wait_for_encoding(proc, out.parent)
    victims = workers_of(proc.pid)
    assert victims, "no worker process found"
    os.kill(victims[0], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert_clean_failure(out, before, stderr, "a worker process of `octlm prepare` died")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_while_encoding_is_one_line_and_keeps_the_old_dataset(big, old, workers):
    out, before = old
    proc = start(big, out, "--workers", workers)
    wait_for_encoding(proc, out.parent)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends the whole job
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert_clean_failure(out, before, stderr, "octlm: interrupted")


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_a_full_disk_is_one_line_and_leaves_nothing(big, tmp_path):
    corpus, tokenizer = big
    disk = tmp_path / "disk"
    disk.mkdir()
    prepare = " ".join(
        [*OCTLM, "prepare", str(corpus), "--out", f"{disk}/data", "--tokenizer", str(tokenizer)]
    )
    # A 2 MB tmpfs in a private mount namespace (no root needed where user namespaces are on).
    script = (
        f"mount -t tmpfs -o size=2m tmpfs {disk} || exit 99; "
        f"{prepare} --context 64 --workers 2; echo rc=$?; ls -A {disk}"
    )
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300
    )
    if done.returncode == 99 or "unshare failed" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert done.stdout.splitlines() == ["rc=1"], done.stdout  # and `ls -A` lists nothing
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0], done.stderr


def test_parquet_without_pyarrow_names_the_extra(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["a", "b"]}), path)
    code = (
        "import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None; "
        "from octlm.cli.main import main; "
        f"sys.exit(main(['prepare', {str(path)!r}, '--out', {str(tmp_path / 'd')!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"octlm: error: reading {path} needs the pyarrow package, which is not installed; "
        "install it with `pip install 'octlm[data]'`"
    ]
    assert not (tmp_path / "d").exists()
