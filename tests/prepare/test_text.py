"""prepare() rules: what it writes, that it is reproducible, `--tokenizer` reuse, and that every
failure (bad input, full disk, interrupted rename) leaves no partial folder and loses no old one."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

import octlm.prepare.folder as folder_module
from octlm.data.shards import MANIFEST_NAME, ShardDataset, ShardWriter
from octlm.errors import DataError, TokenizerError
from octlm.hashing import file_sha256
from octlm.prepare.split import SplitRule
from octlm.prepare.text import PrepareConfig, prepare, prepare_with_stats, summary_lines
from octlm.tokenizer.core import Tokenizer

VOCAB = 300
CONTEXT = 16
DOC_CHARS = 3000
HALF = SplitRule(val_fraction=0.5, val_tokens=None)


def write_jsonl(path: Path, docs: list[tuple[str, str]]) -> Path:
    path.write_text(
        "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs), encoding="utf-8"
    )
    return path


@pytest.fixture(scope="module")
def small_docs(corpus_docs) -> list[tuple[str, str]]:
    """Ten 3,000-character excerpts: big enough for a split and small enough to be instant."""
    return [(d.id, d.text[:DOC_CHARS]) for d in sorted(corpus_docs, key=lambda d: d.id)[:10]]


@pytest.fixture
def corpus(tmp_path, small_docs) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", small_docs)


def config(out: Path, *inputs: Path | str, **overrides) -> PrepareConfig:
    """One encoding process unless `workers` is given: the worker pool's start is most of a
    small prepare's time, and tests/prepare/test_workers.py checks that any number of workers
    writes the same bytes. The faults below strike with the pool running (`workers=2`)."""
    settings = {"vocab_size": VOCAB, "context": CONTEXT, "shard_tokens": 2000, "workers": 1}
    settings |= overrides
    return PrepareConfig(out=out, inputs=tuple(str(i) for i in inputs), **settings)


def run(cfg: PrepareConfig) -> dict:
    return prepare(cfg, progress=False)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


# -- what a prepare writes ------------------------------------------------------------------------
def test_prepare_writes_shards_manifest_and_tokenizer(tmp_path, corpus, small_docs):
    out = tmp_path / "data"
    manifest = run(config(out, corpus))
    assert json.loads((out / MANIFEST_NAME).read_text()) == manifest
    files = sorted(p.name for p in out.iterdir())
    shards = [e["file"] for s in ("train", "val") for e in manifest["splits"][s]["shards"]]
    assert files == sorted([MANIFEST_NAME, "tokenizer.json", *shards])
    assert len(manifest["splits"]["train"]["shards"]) > 1  # shard_tokens=2000 cuts the stream
    assert manifest["tokenizer"]["vocab_size"] == VOCAB
    assert manifest["tokenizer"]["fingerprint"] == file_sha256(out / "tokenizer.json")
    assert manifest["source"] == [str(corpus)]
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    assert (train["documents"], val["documents"]) == (9, 1)
    assert train["text_bytes"] + val["text_bytes"] == sum(len(t.encode()) for _, t in small_docs)
    ShardDataset.open(out, verify_checksums=True)
    assert leftovers(tmp_path) == []


def test_prepare_creates_missing_parent_folders(tmp_path, corpus):
    out = tmp_path / "a" / "b" / "data"
    run(config(out, corpus))
    assert (out / MANIFEST_NAME).is_file()


def test_prepare_into_an_existing_empty_folder_needs_no_force(tmp_path, corpus):
    out = tmp_path / "data"
    out.mkdir()
    run(config(out, corpus))
    assert (out / MANIFEST_NAME).is_file()


def test_prepare_is_reproducible(tmp_path, corpus):
    a = run(config(tmp_path / "a", corpus))
    b = run(config(tmp_path / "b", corpus))
    assert a["fingerprint"] == b["fingerprint"]
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")  # byte-identical folders


def test_different_inputs_give_a_different_dataset_fingerprint(tmp_path, corpus, small_docs):
    base = run(config(tmp_path / "a", corpus))["fingerprint"]
    changed_text = write_jsonl(
        tmp_path / "changed.jsonl", [*small_docs[:-1], (small_docs[-1][0], "Changed. " * 300)]
    )
    assert run(config(tmp_path / "b", changed_text))["fingerprint"] != base
    assert run(config(tmp_path / "c", corpus, vocab_size=VOCAB + 20))["fingerprint"] != base
    assert run(config(tmp_path / "d", corpus, shard_tokens=3000))["fingerprint"] != base


def test_summary_names_counts_shards_and_fingerprints(tmp_path, corpus):
    out = tmp_path / "data"
    manifest = run(config(out, corpus))
    text = "\n".join(summary_lines(manifest, out))
    train = manifest["splits"]["train"]
    assert f"{train['tokens']:>13,} tokens" in text
    bpt = train["text_bytes"] / (train["tokens"] - 2 * train["documents"])
    assert f"{bpt:.3f} bytes/token" in text
    assert f"vocabulary {VOCAB:,} (uint16 shards)" in text
    assert manifest["tokenizer"]["fingerprint"] in text
    assert manifest["fingerprint"] in text
    for split in ("train", "val"):
        shards = manifest["splits"][split]["shards"]
        for shard in shards[:3]:  # the first three by name, then a count
            assert f"{out / shard['file']}  sha256 {shard['sha256'][:16]}" in text
        assert len(shards) <= 3 or f"... {len(shards)} shards in all" in text


# -- --tokenizer ----------------------------------------------------------------------------------
def test_prepare_with_a_given_tokenizer_reuses_it(tmp_path, corpus, tiny_dataset):
    given = tiny_dataset / "tokenizer.json"
    out = tmp_path / "data"
    manifest = run(config(out, corpus, tokenizer=given, vocab_size=1000))  # vocab ignored
    assert manifest["tokenizer"]["fingerprint"] == file_sha256(given)
    assert manifest["tokenizer"]["vocab_size"] == 512
    assert (out / "tokenizer.json").read_bytes() == given.read_bytes()
    ShardDataset.open(out, tokenizer_fingerprint=file_sha256(given), verify_checksums=True)


def test_a_given_tokenizer_is_copied_byte_for_byte_whoever_wrote_it(tmp_path, corpus, tiny_dataset):
    # A tokenizer.json serialised another way (compact, as `json.dump` or another tool writes
    # it) keeps its own bytes in the dataset, so its fingerprint still matches the manifest.
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(json.loads((tiny_dataset / "tokenizer.json").read_text())))
    out = tmp_path / "data"
    manifest = run(config(out, corpus, tokenizer=compact))
    assert (out / "tokenizer.json").read_bytes() == compact.read_bytes()
    assert manifest["tokenizer"]["fingerprint"] == file_sha256(compact)
    assert Tokenizer.load(out / "tokenizer.json").fingerprint == file_sha256(compact)


def test_validation_short_of_its_token_limit_is_reported(tmp_path):
    # Text of one 48-character word repeated: its tokens are far longer than 8 characters.
    word = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV"
    docs = [(f"d{i}", " ".join([word] * 40)) for i in range(60)]
    cfg = config(
        tmp_path / "data",
        write_jsonl(tmp_path / "c.jsonl", docs),
        split=SplitRule(val_fraction=None, val_tokens=400),
        context=8,
        vocab_size=400,  # merges enough for the whole word to be one token
    )
    manifest, stats = prepare_with_stats(cfg, progress=False)
    assert stats.val_short and manifest["splits"]["val"]["tokens"] < 400
    assert "validation ran out of candidates" in "\n".join(summary_lines(manifest, cfg.out, stats))


def test_prepare_with_a_bad_tokenizer_file_is_refused(tmp_path, corpus):
    bad = tmp_path / "tok.json"
    bad.write_text("not json")
    out = tmp_path / "data"
    with pytest.raises(TokenizerError, match="is not a tokenizer.json"):
        run(config(out, corpus, tokenizer=bad))
    assert not out.exists() and leftovers(tmp_path) == []


# -- bad input: an error, and nothing left behind -------------------------------------------------
def test_prepare_missing_input_is_refused(tmp_path):
    out = tmp_path / "data"
    with pytest.raises(DataError, match="input not found"):
        run(config(out, tmp_path / "missing.txt"))
    assert not out.exists() and leftovers(tmp_path) == []


def test_prepare_empty_corpus_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n")
    out = tmp_path / "data"
    with pytest.raises(DataError, match="the corpus is empty"):
        run(config(out, tmp_path / "empty.txt"))
    assert not out.exists() and leftovers(tmp_path) == []


def test_prepare_non_utf8_file_is_refused(tmp_path):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("fine " * 100)
    (tmp_path / "texts" / "b.txt").write_bytes(b"hello\xffworld")
    out = tmp_path / "data"
    with pytest.raises(DataError, match="offset 5"):
        run(config(out, tmp_path / "texts"))
    assert not out.exists() and leftovers(tmp_path) == []


def test_prepare_single_document_is_refused(tmp_path):
    (tmp_path / "one.txt").write_text("a single document " * 100)
    out = tmp_path / "data"
    with pytest.raises(DataError, match="at least 2"):
        run(config(out, tmp_path / "one.txt"))
    assert not out.exists() and leftovers(tmp_path) == []


def test_prepare_corpus_too_small_for_a_validation_block_says_how_many_tokens(tmp_path, corpus):
    out = tmp_path / "data"
    with pytest.raises(DataError, match="the val split has [0-9,]+ tokens") as info:
        run(config(out, corpus, context=5000))
    assert "needs 5001" in str(info.value)
    assert not out.exists() and leftovers(tmp_path) == []


def test_prepare_train_split_too_small_advises_lowering_val_fraction(tmp_path):
    docs = [(f"d{i}", f"Document number {i}. " * 5) for i in range(4)]
    out = tmp_path / "data"
    with pytest.raises(DataError, match="the train split has") as info:
        run(config(out, write_jsonl(tmp_path / "c.jsonl", docs), context=500, split=HALF))
    assert "lower the validation share (--val-fraction" in str(info.value)
    assert not out.exists() and leftovers(tmp_path) == []


def test_prepare_val_split_too_small_advises_raising_val_fraction(tmp_path, corpus):
    with pytest.raises(DataError, match="raise the validation share"):
        run(config(tmp_path / "data", corpus, context=5000))


def test_prepare_vocab_too_small_is_refused(tmp_path, corpus):
    out = tmp_path / "data"
    with pytest.raises(TokenizerError, match="--vocab-size 259 or more"):
        run(config(out, corpus, vocab_size=100))
    assert not out.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("setting", "match"),
    [({"shard_tokens": 0}, "--shard-tokens 0"), ({"context": 0}, "--context 0")],
)
def test_prepare_non_positive_sizes_are_refused(tmp_path, corpus, setting, match):
    out = tmp_path / "data"
    with pytest.raises(DataError, match=match):
        run(config(out, corpus, **setting))
    assert not out.exists() and leftovers(tmp_path) == []


def test_prepare_out_that_is_a_file_is_refused(tmp_path, corpus):
    out = tmp_path / "data"
    out.write_text("keep me")
    with pytest.raises(DataError, match="is a file"):
        run(config(out, corpus, force=True))
    assert out.read_text() == "keep me" and leftovers(tmp_path) == []


# -- existing --out, --force ----------------------------------------------------------------------
@pytest.fixture
def existing(tmp_path, corpus) -> tuple[Path, dict[str, bytes]]:
    """A complete dataset at tmp_path/data and a snapshot of its bytes."""
    out = tmp_path / "data"
    run(config(out, corpus))
    return out, snapshot(out)


def test_existing_out_without_force_is_refused_and_untouched(existing, corpus):
    out, before = existing
    with pytest.raises(DataError, match="pass --force"):
        run(config(out, corpus, vocab_size=VOCAB + 10))
    assert snapshot(out) == before and leftovers(out.parent) == []


def test_force_replaces_the_old_dataset(existing, corpus):
    out, before = existing
    manifest = run(config(out, corpus, vocab_size=VOCAB + 10, force=True))
    assert manifest["tokenizer"]["vocab_size"] == VOCAB + 10
    assert json.loads((out / MANIFEST_NAME).read_text())["fingerprint"] == manifest["fingerprint"]
    assert snapshot(out) != before
    ShardDataset.open(out, verify_checksums=True)
    assert leftovers(out.parent) == []


def test_force_with_a_failing_prepare_keeps_the_old_dataset(existing, corpus):
    out, before = existing
    with pytest.raises(DataError, match="needs 5001"):
        run(config(out, corpus, context=5000, force=True))
    assert snapshot(out) == before and leftovers(out.parent) == []


def test_force_does_not_replace_a_folder_that_is_not_a_dataset(tmp_path, corpus):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("not a dataset")
    with pytest.raises(DataError, match="holds no dataset"):
        run(config(out, corpus, force=True))
    assert snapshot(out) == {"notes.txt": b"not a dataset"} and leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "fault",
    [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), KeyboardInterrupt()],
    ids=["disk-full", "ctrl-c"],
)
def test_fault_while_writing_shards_keeps_the_old_dataset(existing, corpus, monkeypatch, fault):
    out, before = existing
    real_start = ShardWriter.start_shard
    calls = []

    def failing_start(writer):
        calls.append(writer.split)
        if len(calls) == 2:  # the second shard hits the fault
            raise fault
        return real_start(writer)

    monkeypatch.setattr(ShardWriter, "start_shard", failing_start)
    with pytest.raises(type(fault)):
        run(config(out, corpus, vocab_size=VOCAB + 10, force=True, workers=2))
    assert len(calls) == 2
    assert snapshot(out) == before and leftovers(out.parent) == []


def test_failed_rename_into_place_puts_the_old_dataset_back(existing, corpus, monkeypatch):
    # Renaming the finished temp folder onto --out failing is a fault a test cannot cause.
    out, before = existing
    real_replace = os.replace

    def replace(src, dst):
        if ".tmp-" in Path(src).name and Path(dst) == out:
            raise OSError(errno.EIO, "simulated rename failure")
        return real_replace(src, dst)

    monkeypatch.setattr(folder_module.os, "replace", replace)
    with pytest.raises(OSError, match="simulated"):
        run(config(out, corpus, vocab_size=VOCAB + 10, force=True))
    monkeypatch.undo()
    assert snapshot(out) == before and leftovers(out.parent) == []


def test_a_blank_line_is_a_separator_and_an_empty_one_is_not() -> None:
    """`--split-on $'\\n\\n'` cuts text at blank lines (it was refused as "empty", whitespace
    being stripped as for a path); '' and a NUL stay refused in one line."""
    from octlm.errors import DataError
    from octlm.prepare.sources import ReadOptions
    from octlm.prepare.text import check_read_options

    check_read_options(ReadOptions(split_on="\n\n"))
    check_read_options(ReadOptions(split_on=" "))
    for bad in ("", "\0"):
        with pytest.raises(DataError, match="--split-on .* must be a non-empty string"):
            check_read_options(ReadOptions(split_on=bad))
