"""Shard rules: dtype, header layout, the stream is the documents in order, windows across shard
boundaries, manifest hashes, and every refusal when a dataset folder was damaged."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from octlm.data.shards import (
    HEADER_BYTES,
    MAGIC,
    MANIFEST_NAME,
    SHARD_VERSION,
    ShardDataset,
    TokenStream,
    dataset_fingerprint,
    read_shard,
    token_dtype,
    write_shard,
)
from octlm.errors import DataError
from octlm.hashing import file_sha256
from octlm.prepare.corpus import read_documents, split_documents
from octlm.tokenizer.core import Tokenizer


@pytest.fixture(scope="module")
def dataset(tiny_dataset) -> ShardDataset:
    return ShardDataset.open(tiny_dataset, verify_checksums=True)


@pytest.fixture(scope="module")
def expected_streams(tiny_dataset) -> dict[str, np.ndarray]:
    """What the streams must hold: [bos] + ids + [eos] per document of each split, in order."""
    manifest = json.loads((tiny_dataset / MANIFEST_NAME).read_text())
    tokenizer = Tokenizer.load(tiny_dataset / "tokenizer.json")
    train, val = split_documents(read_documents(manifest["source"]), manifest["val_fraction"])
    streams = {}
    for name, docs in (("train", train), ("val", val)):
        encoded = tokenizer.encode_batch([d.text for d in docs])
        streams[name] = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in encoded])
    return streams


@pytest.fixture
def copy(tiny_dataset, tmp_path):
    """A private, writable copy of the tiny dataset (without a `.lock`: a test that points a
    trainer's --out at the shared dataset to see it refused makes one for a moment)."""
    return shutil.copytree(tiny_dataset, tmp_path / "data", ignore=shutil.ignore_patterns(".lock"))


# -- dtype and format -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("vocab", "dtype"),
    [
        (259, np.uint16),
        (4096, np.uint16),
        (65536, np.uint16),
        (65537, np.uint32),
        (2**32, np.uint32),
    ],
)
def test_token_dtype_is_uint16_up_to_65536_else_uint32(vocab, dtype):
    assert token_dtype(vocab) == np.dtype(dtype)


def test_tiny_dataset_shards_are_uint16(dataset):
    assert dataset.manifest["dtype"] == "uint16"
    assert all(s.dtype == np.uint16 for s in dataset.train.shards + dataset.val.shards)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_write_shard_header_layout_and_round_trip(tmp_path, dtype):
    tokens = np.array([0, 5, 70_000 % (np.iinfo(dtype).max + 1), 1, 2], dtype=dtype)
    path = tmp_path / "s.bin"
    digest = write_shard(path, tokens)
    raw = path.read_bytes()
    assert digest == file_sha256(path)
    assert len(raw) == HEADER_BYTES + tokens.nbytes
    assert struct.unpack_from("<8sIIQ", raw) == (MAGIC, SHARD_VERSION, tokens.itemsize, 5)
    assert raw[24:HEADER_BYTES] == bytes(HEADER_BYTES - 24)
    back = read_shard(path)
    assert back.dtype == dtype and back.tolist() == tokens.tolist()


# -- the stream is the documents ------------------------------------------------------------------
@pytest.mark.parametrize("split", ["train", "val"])
def test_stream_is_bos_text_eos_of_each_document_in_order(dataset, expected_streams, split):
    stream: TokenStream = getattr(dataset, split)
    expected = expected_streams[split]
    assert len(stream) == len(expected) == dataset.manifest["splits"][split]["tokens"]
    assert np.array_equal(stream.window(0, len(stream)), expected)


def test_stream_decodes_back_to_the_exact_documents(tiny_dataset, dataset):
    manifest = dataset.manifest
    tokenizer = Tokenizer.load(dataset.tokenizer_path)
    train, _ = split_documents(read_documents(manifest["source"]), manifest["val_fraction"])
    tokens = dataset.train.window(0, len(dataset.train))
    bos = np.flatnonzero(tokens == tokenizer.bos_id)
    eos = np.flatnonzero(tokens == tokenizer.eos_id)
    assert len(bos) == len(eos) == len(train) == manifest["splits"]["train"]["documents"]
    assert bos[0] == 0 and eos[-1] == len(tokens) - 1
    assert np.array_equal(bos[1:], eos[:-1] + 1)  # documents are back to back
    for i in (0, len(train) // 2, len(train) - 1):
        assert tokenizer.decode(tokens[bos[i] + 1 : eos[i]]) == train[i].text


def test_small_shard_tokens_gives_several_shards(dataset):
    sizes = [e["tokens"] for e in dataset.manifest["splits"]["train"]["shards"]]
    assert len(sizes) > 1
    assert all(n == 200_000 for n in sizes[:-1]) and 0 < sizes[-1] <= 200_000
    assert [len(s) for s in dataset.train.shards] == sizes
    names = [e["file"] for e in dataset.manifest["splits"]["train"]["shards"]]
    assert names == [f"train_{i:06d}.bin" for i in range(len(names))]


@pytest.mark.parametrize(
    ("start", "length"),
    [(199_990, 20), (199_999, 2), (200_000, 5), (199_000, 202_000), (0, 200_000), (0, 1)],
)
def test_window_across_shard_boundaries_equals_array_slice(
    dataset, expected_streams, start, length
):
    window = dataset.train.window(start, length)
    assert window.dtype == np.int64
    assert np.array_equal(window, expected_streams["train"][start : start + length])


def test_window_at_the_end_and_outside(dataset):
    n = len(dataset.train)
    assert dataset.train.window(n - 3, 3).tolist() == dataset.train.shards[-1][-3:].tolist()
    assert dataset.train.window(n, 0).tolist() == []
    for start, length in [(n - 2, 3), (-1, 2), (0, n + 1), (5, -1)]:
        with pytest.raises(IndexError):
            dataset.train.window(start, length)


# -- the manifest ---------------------------------------------------------------------------------
def test_manifest_shard_hashes_equal_file_hashes(tiny_dataset, dataset):
    for split in ("train", "val"):
        for entry in dataset.manifest["splits"][split]["shards"]:
            assert file_sha256(tiny_dataset / entry["file"]) == entry["sha256"]


def test_manifest_token_counts_add_up(dataset):
    for split in ("train", "val"):
        info = dataset.manifest["splits"][split]
        assert info["tokens"] == sum(e["tokens"] for e in info["shards"])
        assert info["tokens"] == len(getattr(dataset, split))
    assert dataset.manifest["splits"]["train"]["documents"] == 11
    assert dataset.manifest["splits"]["val"]["documents"] == 1


def test_manifest_tokenizer_fingerprint_is_the_saved_file(tiny_dataset, dataset):
    assert dataset.tokenizer_fingerprint == file_sha256(tiny_dataset / "tokenizer.json")
    assert dataset.manifest["tokenizer"]["vocab_size"] == 512


def test_dataset_fingerprint_is_derived_from_the_manifest(dataset):
    assert dataset.fingerprint == dataset_fingerprint(dataset.manifest)
    changed = json.loads(json.dumps(dataset.manifest))
    changed["splits"]["val"]["shards"][0]["sha256"] = "0" * 64
    assert dataset_fingerprint(changed) != dataset.fingerprint


def test_open_without_checksums_reads_the_same(tiny_dataset, dataset):
    fast = ShardDataset.open(tiny_dataset)
    assert fast.fingerprint == dataset.fingerprint
    assert np.array_equal(fast.val.window(0, len(fast.val)), dataset.val.window(0, len(fast.val)))


# -- refusals -------------------------------------------------------------------------------------
def test_open_refuses_a_folder_without_manifest(tmp_path):
    with pytest.raises(DataError, match="not a prepared dataset") as info:
        ShardDataset.open(tmp_path)
    assert f"octlm prepare --out {tmp_path}" in str(info.value)


def test_open_refuses_a_truncated_shard(copy):
    shard = copy / "train_000001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(DataError, match="truncated or corrupt") as info:
        ShardDataset.open(copy)
    assert str(shard) in str(info.value)


def test_open_refuses_a_shard_without_header(copy):
    (copy / "val_000000.bin").write_bytes(b"OCTLM")
    with pytest.raises(DataError, match="truncated \\(no header\\)"):
        ShardDataset.open(copy)


def test_open_refuses_a_missing_shard(copy):
    (copy / "train_000002.bin").unlink()
    with pytest.raises(DataError, match="shard missing"):
        ShardDataset.open(copy)


def test_open_refuses_a_foreign_file_as_shard(copy):
    shard = copy / "val_000000.bin"
    data = bytearray(shard.read_bytes())
    data[:8] = b"NOTOCTLM"
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="not an octlm token shard"):
        ShardDataset.open(copy)


def test_corrupted_byte_is_caught_only_with_checksums(copy):
    shard = copy / "train_000000.bin"
    data = bytearray(shard.read_bytes())
    data[HEADER_BYTES + 1000] ^= 0xFF
    shard.write_bytes(bytes(data))
    ShardDataset.open(copy, verify_checksums=False)  # sizes still agree: loads
    with pytest.raises(DataError, match="fails its sha256 check") as info:
        ShardDataset.open(copy, verify_checksums=True)
    assert str(shard) in str(info.value)


def test_open_refuses_a_shard_whose_count_differs_from_the_manifest(copy):
    # A well-formed shard of the wrong length: header and size agree, the manifest does not.
    write_shard(copy / "val_000000.bin", np.zeros(10, dtype=np.uint16))
    with pytest.raises(DataError, match="the manifest says"):
        ShardDataset.open(copy)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["splits"]["train"]["shards"][0].update(tokens=1),
        lambda m: m["splits"]["val"]["shards"][0].update(sha256="0" * 64),
        lambda m: m["tokenizer"].update(fingerprint="f" * 64),
        lambda m: m.update(dtype="uint32"),
        lambda m: m["splits"]["train"]["shards"].pop(),
        lambda m: m.pop("tokenizer"),
        lambda m: m["splits"].pop("val"),
        lambda m: m.pop("fingerprint"),
    ],
    ids=[
        "tokens",
        "sha256",
        "tokenizer",
        "dtype",
        "shard-dropped",
        "no-tokenizer",
        "no-val",
        "no-fingerprint",
    ],
)
def test_open_refuses_an_edited_manifest(copy, edit):
    path = copy / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="was edited"):
        ShardDataset.open(copy)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not an octlm dataset manifest"),
        ('{"format": "octlm-dataset", "manifest_version": 99}', "of version 1"),
    ],
)
def test_open_refuses_a_malformed_manifest(copy, content, match):
    (copy / MANIFEST_NAME).write_text(content)
    with pytest.raises(DataError, match=match):
        ShardDataset.open(copy)


def test_open_refuses_another_tokenizer_and_names_the_fix(tiny_dataset, tiny_tokenizer):
    assert tiny_tokenizer.fingerprint != ShardDataset.open(tiny_dataset).tokenizer_fingerprint
    with pytest.raises(DataError, match="were written with tokenizer") as info:
        ShardDataset.open(tiny_dataset, tokenizer_fingerprint=tiny_tokenizer.fingerprint)
    message = str(info.value)
    assert str(tiny_dataset / "tokenizer.json") in message
    assert "octlm prepare --tokenizer" in message


def test_open_accepts_the_matching_tokenizer(tiny_dataset):
    fingerprint = file_sha256(tiny_dataset / "tokenizer.json")
    ShardDataset.open(tiny_dataset, tokenizer_fingerprint=fingerprint)
