"""Reading corpus files: every format gives the same documents, ids are stable, and each kind of
bad input is one clear error naming the file (and line or byte offset)."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import zstandard

import octlm.prepare.sources as sources_module
from octlm.errors import DataError
from octlm.prepare.scan import documents, scan_corpus
from octlm.prepare.sources import ReadOptions, find_sources

SEP = "<|endoftext|>"
STORIES = [f"Once upon a time {i} there was a story number {i}.\nThe end." for i in range(40)]
COMPRESS = {
    ".gz": gzip.compress,
    ".xz": lzma.compress,
    ".bz2": bz2.compress,
    ".zst": lambda data: zstandard.ZstdCompressor().compress(data),
}


def read(*paths: Path, **options) -> list[tuple[str, str]]:
    return [(d.id, d.text) for d in documents(find_sources(paths), ReadOptions(**options))]


def jsonl_bytes(texts: list[str], field: str = "text") -> bytes:
    return "".join(json.dumps({field: t}) + "\n" for t in texts).encode("utf-8")


# -- text -----------------------------------------------------------------------------------------
def test_a_text_file_is_one_document_named_by_the_file(tmp_path):
    (tmp_path / "a.txt").write_text("hello world")
    assert read(tmp_path / "a.txt") == [("a.txt", "hello world")]


def test_split_on_cuts_a_text_file_into_numbered_documents(tmp_path):
    path = tmp_path / "stories.txt"
    path.write_text(SEP.join(STORIES) + SEP)  # a trailing separator leaves a blank last piece
    docs = read(path, split_on=SEP)
    assert docs == [(f"stories.txt:{i + 1}", t) for i, t in enumerate(STORIES)]


def test_a_separator_cut_by_a_read_boundary_is_still_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sources_module, "_READ_BYTES", 64)
    texts = ["x" * n for n in (10, 59, 60, 61, 62, 63, 64, 65, 127, 1)]
    path = tmp_path / "s.txt"
    path.write_text(SEP.join(texts))
    assert [t for _, t in read(path, split_on=SEP)] == texts


def test_a_character_cut_by_a_read_boundary_decodes(tmp_path, monkeypatch):
    monkeypatch.setattr(sources_module, "_READ_BYTES", 7)
    text = "café — naïve 日本語 🎭 " * 20
    (tmp_path / "u.txt").write_text(text, encoding="utf-8")
    assert read(tmp_path / "u.txt") == [("u.txt", text)]


def test_a_separator_never_found_in_a_long_file_says_it_would_be_one_document(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(sources_module, "MAX_DOCUMENT_CHARS", 5000)
    monkeypatch.setattr(sources_module, "_READ_BYTES", 1000)
    path = tmp_path / "big.txt"
    path.write_text("no separator here. " * 1000)
    with pytest.raises(DataError, match="does not occur in the first 5,000 characters") as info:
        read(path, split_on=SEP)
    assert "it would be one document" in str(info.value) and str(path) in str(info.value)


def test_a_separator_in_none_of_the_inputs_is_refused(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("text without the separator " * 10)
    with pytest.raises(DataError, match="occurs in none of the text inputs"):
        scan_corpus(find_sources([tmp_path]), ReadOptions(split_on=SEP), workers=1)


def test_a_single_text_file_without_split_on_advises_it(tmp_path):
    (tmp_path / "tiny_stories.txt").write_text(SEP.join(STORIES))
    with pytest.raises(DataError, match="the corpus is one document") as info:
        scan_corpus(find_sources([tmp_path / "tiny_stories.txt"]), ReadOptions(), workers=1)
    assert "--split-on" in str(info.value)


def test_blank_documents_are_skipped_and_counted(tmp_path):
    (tmp_path / "s.txt").write_text(SEP.join(["a story", "", "  \n", "another"]))
    scan = scan_corpus(find_sources([tmp_path / "s.txt"]), ReadOptions(split_on=SEP), workers=1)
    assert (len(scan.keys), scan.empty) == (2, 2)
    assert read(tmp_path / "s.txt", split_on=SEP) == [
        ("s.txt:1", "a story"),
        ("s.txt:4", "another"),
    ]


# -- JSON lines -----------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".ndjson"])
def test_json_lines_under_any_common_suffix(tmp_path, suffix):
    path = tmp_path / f"docs{suffix}"
    path.write_bytes(jsonl_bytes(STORIES[:3]))
    assert read(path) == [(f"docs{suffix}:{i + 1}", t) for i, t in enumerate(STORIES[:3])]


def test_text_field_names_the_field(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(jsonl_bytes(["a", "b"], field="content"))
    assert [t for _, t in read(path, text_field="content")] == ["a", "b"]


def test_a_missing_text_field_names_the_line(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n{"body": "c"}\n')
    with pytest.raises(DataError, match=r"docs.jsonl:3 has no string field 'text'") as info:
        read(path)
    assert "--text-field" in str(info.value)


def test_a_json_array_file_is_refused_with_the_conversion(tmp_path):
    path = tmp_path / "docs.json"
    path.write_text(json.dumps([{"text": "a"}, {"text": "b"}]))
    with pytest.raises(DataError, match="holds a JSON array, not JSON lines") as info:
        read(path)
    assert "jq -c" in str(info.value)


def test_a_null_text_is_a_blank_document(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "a"}\n{"text": null}\n{"text": "c"}\n')
    assert read(path) == [("docs.jsonl:1", "a"), ("docs.jsonl:3", "c")]


# -- compressed -----------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_compressed_files_read_as_their_plain_twins(tmp_path, suffix):
    plain = tmp_path / "plain" / "docs.jsonl"
    plain.parent.mkdir()
    plain.write_bytes(jsonl_bytes(STORIES))
    packed = tmp_path / "packed" / f"docs.jsonl{suffix}"
    packed.parent.mkdir()
    packed.write_bytes(COMPRESS[suffix](plain.read_bytes()))
    text = tmp_path / f"stories.txt{suffix}"
    text.write_bytes(COMPRESS[suffix](SEP.join(STORIES).encode()))
    assert [t for _, t in read(packed)] == [t for _, t in read(plain)] == STORIES
    assert [t for _, t in read(text, split_on=SEP)] == STORIES


def test_zstd_frames_back_to_back_are_one_stream(tmp_path):
    data = jsonl_bytes(STORIES)
    half = len(data) // 2
    cut = data.index(b"\n", half) + 1
    z = zstandard.ZstdCompressor()
    (tmp_path / "d.jsonl.zst").write_bytes(z.compress(data[:cut]) + z.compress(data[cut:]))
    assert [t for _, t in read(tmp_path / "d.jsonl.zst")] == STORIES


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_a_truncated_compressed_file_is_one_error(tmp_path, suffix):
    blob = COMPRESS[suffix](jsonl_bytes(STORIES * 20))
    path = tmp_path / f"docs.jsonl{suffix}"
    path.write_bytes(blob[: len(blob) * 2 // 3])
    with pytest.raises(DataError, match="is truncated or corrupt") as info:
        read(path)
    assert str(path) in str(info.value)


def test_invalid_utf8_inside_a_compressed_file_names_file_and_offset(tmp_path):
    data = jsonl_bytes(STORIES)
    at = data.index(b"story number 7")
    bad = data[:at] + b"\xff" + data[at + 1 :]
    path = tmp_path / "docs.jsonl.gz"
    path.write_bytes(gzip.compress(bad))
    with pytest.raises(
        DataError, match=rf"not UTF-8 \(byte 0xff at offset {at} of its uncompressed"
    ):
        read(path)


def test_invalid_utf8_in_a_text_file_names_the_offset(tmp_path, monkeypatch):
    monkeypatch.setattr(sources_module, "_READ_BYTES", 100)
    data = ("é" * 300).encode()
    at = 301  # the second byte of a character, after a read boundary at 300
    path = tmp_path / "t.txt"
    path.write_bytes(data[:at] + b"\x41" + data[at + 1 :])
    with pytest.raises(DataError, match=r"t.txt is not UTF-8 \(byte 0xc3 at offset 300\)"):
        read(path)


def test_a_compressed_parquet_is_refused(tmp_path):
    (tmp_path / "a.parquet.gz").write_bytes(gzip.compress(b"x"))
    with pytest.raises(DataError, match="compressed .parquet file"):
        find_sources([tmp_path / "a.parquet.gz"])


# -- Parquet and Arrow ----------------------------------------------------------------------------
def test_parquet_rows_with_ids_from_the_id_column(tmp_path):
    path = tmp_path / "fineweb.parquet"
    table = pa.table(
        {"id": [f"<urn:{i}>" for i in range(5)], "text": STORIES[:5], "score": range(5)}
    )
    pq.write_table(table, path, row_group_size=2)
    assert read(path) == [(f"<urn:{i}>", STORIES[i]) for i in range(5)]


def test_parquet_without_ids_numbers_its_rows(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"content": STORIES[:3]}), path)
    assert read(path, text_field="content") == [
        (f"p.parquet:{i + 1}", STORIES[i]) for i in range(3)
    ]


def test_parquet_without_the_column_lists_its_columns(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"content": ["a"], "url": ["u"]}), path)
    with pytest.raises(DataError, match=r"has no column 'text' \(columns: content, url\)") as info:
        read(path)
    assert "--text-field" in str(info.value)


def test_parquet_with_a_non_string_column_is_refused(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), path)
    with pytest.raises(DataError, match="holds int64, not strings"):
        read(path)


def test_a_truncated_parquet_file_is_one_error(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": STORIES}), path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(DataError, match="is not a readable parquet file"):
        read(path)


@pytest.mark.parametrize("layout", ["file", "stream"])
def test_arrow_ipc_files_and_streams(tmp_path, layout):
    table = pa.table({"text": STORIES[:4]})
    path = tmp_path / "data.arrow"
    with pa.OSFile(str(path), "wb") as sink:
        writer = (ipc.new_file if layout == "file" else ipc.new_stream)(sink, table.schema)
        writer.write_table(table, max_chunksize=3)
        writer.close()
    assert read(path) == [(f"data.arrow:{i + 1}", STORIES[i]) for i in range(4)]


def test_mixed_folder_reads_every_format_in_sorted_order(tmp_path):
    folder = tmp_path / "mix"
    folder.mkdir()
    (folder / "a.txt").write_text("plain text")
    (folder / "b.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(["gz line"])))
    pq.write_table(pa.table({"text": ["parquet row"]}), folder / "c.parquet")
    (folder / ".hidden.txt").write_text("skipped")
    assert read(folder) == [
        ("mix/a.txt", "plain text"),
        ("mix/b.jsonl.gz:1", "gz line"),
        ("mix/c.parquet:1", "parquet row"),
    ]


def test_progress_counts_every_byte_of_each_file(tmp_path):
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(STORIES * 50)))
    pq.write_table(pa.table({"text": STORIES}), tmp_path / "b.parquet", row_group_size=7)
    sources = find_sources([tmp_path])
    seen = []
    list(documents(sources, ReadOptions(), seen.append))
    assert sum(seen) == sum(s.size for s in sources) and all(n > 0 for n in seen)
