"""`python -m octlm prepare` and `octlm tokenizer train` as a user runs them: real subprocesses.

Every bad input must exit non-zero with exactly one stderr line `octlm: error: ...` and no
traceback, and leave nothing at --out. Independent commands run concurrently: each process pays
the interpreter's start-up, and the test machine has few cores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from octlm.hashing import file_sha256
from tests import octlm_process

# Every test here reads the results of real `python -m octlm` subprocesses.
pytestmark = pytest.mark.slow

DOC = "Now is the winter of our discontent made glorious summer by this sun of York.\n"


def octlm(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return octlm_process.run([*map(str, args)], dict(os.environ), cwd=cwd, timeout=300)


def assert_one_error_line(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("octlm: error: "), lines[0]
    assert expected in lines[0], lines[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, corpus_docs) -> Path:
    """Inputs for every case: a folder of 10 small plays, a JSONL, and broken files."""
    root = tmp_path_factory.mktemp("cli")
    plays = root / "plays"
    plays.mkdir()
    for doc in sorted(corpus_docs, key=lambda d: d.id)[:10]:
        (plays / f"{doc.id}.txt").write_text(doc.text[:3000], encoding="utf-8")
    (root / "empty.txt").write_text("\n  \n")
    (root / "latin1.txt").write_bytes(b"hello\xffworld")
    (root / "one.txt").write_text(DOC * 50)
    (root / "bad.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    (root / "not_a_tokenizer.json").write_text("{]")
    (root / "existing").mkdir()
    (root / "existing" / "keep.txt").write_text("keep me")
    return root


BAD_INPUTS = {
    # name: (arguments, text the error line must contain)
    "missing_input": (["prepare", "nope.txt", "--out", "o_missing"], "input not found: nope.txt"),
    "empty_corpus": (["prepare", "empty.txt", "--out", "o_empty"], "the corpus is empty"),
    "non_utf8": (
        ["prepare", "latin1.txt", "--out", "o_latin1"],
        "latin1.txt is not UTF-8 (byte 0xff at offset 5)",
    ),
    "bad_jsonl_line": (["prepare", "bad.jsonl", "--out", "o_jsonl"], "bad.jsonl:2 is not valid"),
    "single_document": (["prepare", "one.txt", "--out", "o_one"], "needs at least 2"),
    "too_small_for_a_block": (
        ["prepare", "plays", "--vocab-size", "300", "--context", "5000", "--out", "o_small"],
        "one block of context 5000 needs 5001",
    ),
    "vocab_too_small": (
        ["prepare", "plays", "--vocab-size", "200", "--out", "o_vocab"],
        "--vocab-size 259 or more",
    ),
    "bad_tokenizer_file": (
        ["prepare", "plays", "--tokenizer", "not_a_tokenizer.json", "--out", "o_tok"],
        "not_a_tokenizer.json is not a tokenizer.json",
    ),
    "bad_val_fraction": (
        ["prepare", "plays", "--val-fraction", "1.5", "--out", "o_frac"],
        "not in (0, 1)",
    ),
    "existing_out_without_force": (
        ["prepare", "plays", "--vocab-size", "300", "--out", "existing"],
        "pass --force",
    ),
    "force_on_a_folder_that_is_not_a_dataset": (
        ["prepare", "plays", "--vocab-size", "300", "--out", "existing", "--force"],
        "holds no dataset",
    ),
    "tokenizer_vocab_too_small": (
        ["tokenizer", "train", "one.txt", "--vocab-size", "10", "--out", "t_small.json"],
        "vocabulary size 10 cannot hold",
    ),
}

GOOD = {
    "prepare": [
        "prepare",
        "plays",
        "--vocab-size",
        "300",
        "--context",
        "32",
        "--shard-tokens",
        "2000",
        "--out",
        "data",
    ],
    "tokenizer_a": ["tokenizer", "train", "plays", "--vocab-size", "300", "--out", "tok/a.json"],
    "tokenizer_b": ["tokenizer", "train", "plays", "--vocab-size", "300", "--out", "b.json"],
}


@pytest.fixture(scope="module")
def results(workdir) -> dict[str, subprocess.CompletedProcess[str]]:
    cases = {**{k: v[0] for k, v in BAD_INPUTS.items()}, **GOOD}
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(octlm, *args, cwd=workdir) for name, args in cases.items()}
        return {name: f.result() for name, f in futures.items()}


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", BAD_INPUTS, ids=BAD_INPUTS)
def test_bad_input_exits_with_one_error_line(results, case):
    assert_one_error_line(results[case], BAD_INPUTS[case][1])
    assert results[case].returncode == 1


def test_bad_input_leaves_no_partial_output(results, workdir):
    for args, _ in BAD_INPUTS.values():
        out = workdir / args[args.index("--out") + 1]
        if out.name != "existing":
            assert not out.exists(), out
    assert sorted(p.name for p in (workdir / "existing").iterdir()) == ["keep.txt"]
    assert (workdir / "existing" / "keep.txt").read_text() == "keep me"
    assert [p.name for p in workdir.iterdir() if ".tmp-" in p.name or ".old-" in p.name] == []


# -- prepare --------------------------------------------------------------------------------------
def test_prepare_prints_the_summary(results, workdir):
    result = results["prepare"]
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no progress bar when stderr is not a terminal
    out = result.stdout
    manifest = json.loads((workdir / "data" / "manifest.json").read_text())
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    assert out.startswith("dataset data  (source: ['plays'])\n")
    assert (train["documents"], val["documents"]) == (9, 1)
    for name, split in (("train", train), ("val", val)):
        bpt = split["text_bytes"] / (split["tokens"] - 2 * split["documents"])
        assert (
            f"  {name:5s} {split['documents']:>7,} documents {split['tokens']:>13,} tokens "
            f"{split['text_bytes']:>13,} bytes  {bpt:.3f} bytes/token"
        ) in out
        for shard in split["shards"][:3]:
            assert f"{Path('data') / shard['file']}  sha256 {shard['sha256'][:16]}" in out
    assert len(train["shards"]) > 3 and f"... {len(train['shards'])} shards in all" in out
    assert "vocabulary 300 (uint16 shards)" in out
    assert f"fingerprint {manifest['tokenizer']['fingerprint']}\n" in out
    assert f"dataset fingerprint {manifest['fingerprint']}\n" in out
    assert manifest["tokenizer"]["fingerprint"] == file_sha256(workdir / "data" / "tokenizer.json")
    assert re.search(r"MB/s; scan [\d.]+ s, tokenizer [\d.]+ s, encode [\d.]+ s\); 0 blank", out)
    assert re.search(r"  workers    \d+; peak RSS \d+ MB \(main\), \d+ MB", out)


def test_prepare_again_without_force_refuses_then_force_replaces(results, workdir):
    assert results["prepare"].returncode == 0
    before = (workdir / "data" / "manifest.json").read_bytes()
    args = ["prepare", "plays", "--vocab-size", "320", "--context", "32", "--out", "data"]
    assert_one_error_line(octlm(*args, cwd=workdir), "data already exists and is not empty")
    assert (workdir / "data" / "manifest.json").read_bytes() == before
    replaced = octlm(*args, "--force", cwd=workdir)
    assert replaced.returncode == 0, replaced.stderr
    assert "vocabulary 320 (uint16 shards)" in replaced.stdout
    manifest = json.loads((workdir / "data" / "manifest.json").read_text())
    assert manifest["tokenizer"]["vocab_size"] == 320
    assert [p.name for p in workdir.iterdir() if ".tmp-" in p.name or ".old-" in p.name] == []


# -- tokenizer train ------------------------------------------------------------------------------
def test_tokenizer_train_writes_the_file_and_prints_its_fingerprint(results, workdir):
    result = results["tokenizer_a"]
    assert result.returncode == 0, result.stderr
    path = workdir / "tok" / "a.json"
    fingerprint = file_sha256(path)
    assert result.stdout.splitlines() == [
        "trained on 10 documents (30,000 characters): vocabulary 300",
        f"wrote {Path('tok') / 'a.json'}  fingerprint {fingerprint}",
    ]


def test_tokenizer_train_is_reproducible_across_processes(results, workdir):
    assert results["tokenizer_a"].returncode == results["tokenizer_b"].returncode == 0
    assert (workdir / "tok" / "a.json").read_bytes() == (workdir / "b.json").read_bytes()


def test_tokenizer_train_again_without_force_refuses(results, workdir):
    assert results["tokenizer_b"].returncode == 0
    path = workdir / "b.json"
    before = path.read_bytes()
    args = ["tokenizer", "train", "one.txt", "--vocab-size", "300", "--out", "b.json"]
    assert_one_error_line(octlm(*args, cwd=workdir), "b.json already exists")
    assert path.read_bytes() == before
    forced = octlm(*args, "--force", cwd=workdir)
    assert forced.returncode == 0, forced.stderr
    assert path.read_bytes() != before
    assert f"fingerprint {file_sha256(path)}" in forced.stdout
