"""Corpus rules: the embedded works and their provenance hash, reading user files, and the
deterministic by-document train/validation split."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octlm.errors import DataError
from octlm.prepare.corpus import (
    CORPUS_SHA256,
    Document,
    embedded_bytes,
    read_documents,
    split_documents,
)

EMBEDDED_VAL_IDS = {"as_you_like_it", "henry_iv_part_1", "romeo_and_juliet", "sonnets"}


# -- the embedded corpus --------------------------------------------------------------------------
def test_embedded_corpus_has_42_works(corpus_docs):
    assert len(corpus_docs) == 42
    assert len({d.id for d in corpus_docs}) == 42
    assert all(d.text.strip() for d in corpus_docs)


def test_embedded_corpus_matches_its_provenance_hash():
    assert hashlib.sha256(embedded_bytes()).hexdigest() == CORPUS_SHA256


def test_embedded_corpus_has_no_first_folio_duplicates(corpus_docs):
    assert not [d.id for d in corpus_docs if d.id.endswith("_f")]
    assert {"hamlet", "sonnets", "tempest"} <= {d.id for d in corpus_docs}


def test_embedded_corpus_size(corpus_docs):
    chars = sum(len(d.text) for d in corpus_docs)
    assert chars == 5_057_239  # ~5.06 MB of text (all ASCII)
    assert len(embedded_bytes()) == 5_248_047  # the JSONL, with ids and titles


def test_embedded_texts_use_unix_newlines(corpus_docs):
    assert not [d.id for d in corpus_docs if "\r" in d.text]
    assert all(d.text.endswith("\n") and not d.text.endswith("\n\n") for d in corpus_docs)


def test_no_inputs_means_the_embedded_corpus(corpus_docs):
    assert read_documents([]) == corpus_docs


# -- the split ------------------------------------------------------------------------------------
def test_split_embedded_corpus_holds_out_4_works(corpus_docs):
    train, val = split_documents(corpus_docs)
    assert (len(train), len(val)) == (38, 4)
    assert {d.id for d in val} == EMBEDDED_VAL_IDS


def test_split_is_by_whole_document(corpus_docs):
    train, val = split_documents(corpus_docs)
    assert not {d.id for d in train} & {d.id for d in val}
    assert sorted(train + val, key=lambda d: d.id) == sorted(corpus_docs, key=lambda d: d.id)


def test_split_is_deterministic_and_independent_of_input_order(corpus_docs):
    train, val = split_documents(corpus_docs)
    shuffled = list(corpus_docs)
    random.Random(1).shuffle(shuffled)
    train2, val2 = split_documents(shuffled)
    assert {d.id for d in val2} == {d.id for d in val}
    assert {d.id for d in train2} == {d.id for d in train}


def test_split_keeps_input_order_within_each_split(corpus_docs):
    train, val = split_documents(corpus_docs)
    order = {d.id: i for i, d in enumerate(corpus_docs)}
    assert [order[d.id] for d in train] == sorted(order[d.id] for d in train)
    assert [order[d.id] for d in val] == sorted(order[d.id] for d in val)


def test_split_depends_only_on_ids_not_text():
    docs = [Document(f"doc{i}", f"text {i}") for i in range(20)]
    other = [Document(d.id, d.text.upper() * 3) for d in docs]
    assert [d.id for d in split_documents(docs)[1]] == [d.id for d in split_documents(other)[1]]


def test_split_validation_goes_to_smallest_id_hashes():
    docs = [Document(f"doc{i}", "x") for i in range(30)]
    _, val = split_documents(docs)
    ranked = sorted(docs, key=lambda d: hashlib.sha256(d.id.encode()).hexdigest())
    assert {d.id for d in val} == {d.id for d in ranked[:3]}


@pytest.mark.parametrize(
    ("n_docs", "fraction", "n_val"),
    [
        (2, 0.1, 1),
        (10, 0.1, 1),
        (14, 0.1, 1),
        (15, 0.1, 2),
        (42, 0.1, 4),
        (45, 0.1, 5),
        (100, 0.1, 10),
        (3, 0.5, 2),
        (2, 0.9, 1),
        (10, 0.99, 9),
    ],
)
def test_split_val_count_is_rounded_fraction_with_one_of_each(n_docs, fraction, n_val):
    docs = [Document(f"d{i}", "x") for i in range(n_docs)]
    train, val = split_documents(docs, fraction)
    assert (len(train), len(val)) == (n_docs - n_val, n_val)


@given(n_docs=st.integers(2, 300), fraction=st.floats(0.01, 0.99))
def test_split_always_has_train_and_val(n_docs, fraction):
    docs = [Document(f"d{i}", "x") for i in range(n_docs)]
    train, val = split_documents(docs, fraction)
    assert len(train) >= 1 and len(val) >= 1 and len(train) + len(val) == n_docs


def test_split_needs_two_documents():
    with pytest.raises(DataError, match="at least 2"):
        split_documents([Document("only", "text")])


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_split_fraction_outside_0_1_is_refused(fraction):
    docs = [Document(f"d{i}", "x") for i in range(5)]
    with pytest.raises(DataError, match="not in \\(0, 1\\)"):
        split_documents(docs, fraction)


# -- reading user files ---------------------------------------------------------------------------
def test_read_text_file_is_one_document(tmp_path):
    path = tmp_path / "play.txt"
    path.write_text("Enter Hamlet.\r\nHamlet: Words.\n", encoding="utf-8", newline="")
    assert read_documents([path]) == [Document("play.txt", "Enter Hamlet.\r\nHamlet: Words.\n")]


def test_read_folder_recursive_sorted_hidden_skipped(tmp_path):
    root = tmp_path / "texts"
    (root / "b" / "deep").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "z.txt").write_text("zed")
    (root / "a.txt").write_text("ay")
    (root / "b" / "deep" / "c.md").write_text("see")
    (root / ".hidden.txt").write_text("skip me")
    (root / ".git" / "config").write_text("skip me too")
    docs = read_documents([root])
    assert [d.id for d in docs] == ["texts/a.txt", "texts/b/deep/c.md", "texts/z.txt"]
    assert [d.text for d in docs] == ["ay", "see", "zed"]


def test_read_folder_with_only_hidden_files_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".DS_Store").write_text("x")
    with pytest.raises(DataError, match="holds no files"):
        read_documents([tmp_path / "empty"])


def test_read_jsonl_with_text_and_id(tmp_path):
    path = tmp_path / "docs.jsonl"
    lines = [{"id": "first", "text": "one"}, {"text": "two"}, {"id": 7, "text": "three"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n", encoding="utf-8")
    docs = read_documents([path])
    assert docs == [
        Document("first", "one"),
        Document("docs.jsonl:2", "two"),
        Document("7", "three"),
    ]


def test_read_jsonl_keeps_unicode_line_separators_inside_text(tmp_path):
    path = tmp_path / "docs.jsonl"
    text = "a\u2028b\u0085c\nd"
    path.write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert [d.text for d in read_documents([path])] == [text]


@pytest.mark.parametrize("field", ["text", "id"])
def test_read_jsonl_with_a_lone_surrogate_is_one_clear_error(tmp_path, field):
    path = tmp_path / "docs.jsonl"
    record = {"id": "a", "text": "fine"}
    record[field] = "half \ud800 of a pair"
    path.write_text('{"text": "ok"}\n' + json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"docs.jsonl:2 holds a lone surrogate \\ud800"):
        read_documents([path])
    pair = {"text": "a pair \ud83c\udfad is fine"}  # json.loads joins the halves
    path.write_text(json.dumps(pair) + "\n", encoding="utf-8")
    assert read_documents([path])[0].text == "a pair \U0001f3ad is fine"


def test_read_several_inputs_in_order(tmp_path):
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "a.jsonl").write_text('{"id": "x", "text": "ex"}\n')
    docs = read_documents([tmp_path / "b.txt", tmp_path / "a.jsonl"])
    assert [d.id for d in docs] == ["b.txt", "x"]


def test_read_missing_path_names_it(tmp_path):
    missing = tmp_path / "no_such_file.txt"
    with pytest.raises(DataError, match="input not found") as info:
        read_documents([missing])
    assert str(missing) in str(info.value)


@pytest.mark.parametrize("content", ["", "   \n\t\r\n  "], ids=["empty", "whitespace"])
def test_read_empty_corpus_is_refused(tmp_path, content):
    path = tmp_path / "blank.txt"
    path.write_text(content)
    with pytest.raises(DataError, match="the corpus is empty"):
        read_documents([path])


def test_read_jsonl_with_only_blank_texts_is_refused(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": ""}\n{"text": "  "}\n')
    with pytest.raises(DataError, match="the corpus is empty"):
        read_documents([path])


def test_blank_documents_are_dropped(tmp_path):
    (tmp_path / "a.txt").write_text("real text")
    (tmp_path / "b.txt").write_text("\n\n")
    assert [d.id for d in read_documents([tmp_path / "a.txt", tmp_path / "b.txt"])] == ["a.txt"]


def test_read_non_utf8_names_file_and_offset(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"hello\xffworld")
    with pytest.raises(DataError, match="offset 5") as info:
        read_documents([path])
    message = str(info.value)
    assert str(path) in message and "0xff" in message and "iconv" in message


def test_read_non_utf8_inside_folder_names_the_file(tmp_path):
    (tmp_path / "good.txt").write_text("fine")
    (tmp_path / "bad.txt").write_bytes("caf\u00e9".encode("latin-1"))
    with pytest.raises(DataError, match="offset 3") as info:
        read_documents([tmp_path])
    assert str(tmp_path / "bad.txt") in str(info.value)


def test_read_bad_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "fine"}\n\n{"text": broken}\n')
    with pytest.raises(DataError, match="is not valid JSON") as info:
        read_documents([path])
    assert f"{path}:3 " in str(info.value)


@pytest.mark.parametrize("line", ['{"body": "x"}', '{"text": 5}', '["text"]', '"text"'])
def test_read_jsonl_line_without_text_field_names_file_and_line(tmp_path, line):
    path = tmp_path / "docs.jsonl"
    path.write_text(f'{{"text": "ok"}}\n{line}\n')
    with pytest.raises(DataError, match="has no string field 'text'") as info:
        read_documents([path])
    assert f"{path}:2 " in str(info.value)


def test_read_duplicate_ids_are_refused(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "text": "one"}\n{"id": "a", "text": "two"}\n')
    with pytest.raises(DataError, match="share the id 'a'"):
        read_documents([path])


def test_read_same_file_name_in_two_folders_is_refused_naming_the_fix(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "play.txt").write_text(f"text of {folder}")
    with pytest.raises(DataError, match="share the id 'play.txt'") as info:
        read_documents([tmp_path / "a" / "play.txt", tmp_path / "b" / "play.txt"])
    assert "each input file a unique name" in str(info.value)
    # Passing the folders instead keeps their names apart.
    assert [d.id for d in read_documents([tmp_path / "a", tmp_path / "b"])] == [
        "a/play.txt",
        "b/play.txt",
    ]


def test_read_same_file_twice_is_refused(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("text")
    with pytest.raises(DataError, match="share the id"):
        read_documents([path, path])
