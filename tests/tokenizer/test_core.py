"""Tokenizer rules: special-token framing, exact round trips, byte accounting, determinism,
and one-line errors for bad settings and bad files."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from octlm.errors import TokenizerError
from octlm.hashing import file_sha256
from octlm.tokenizer.core import BOS, EOS, MIN_VOCAB_SIZE, PAD, SPECIAL_TOKENS, Tokenizer

SPECIAL_IDS = {0, 1, 2}
# Fixtures are session-scoped, so hypothesis may reuse them across examples.
PROPERTY = settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])

SMALL_TEXTS = [
    "The quick brown fox jumps over the lazy dog.\n" * 20,
    "To be, or not to be, that is the question:\n" * 10,
    "Héllo wörld, ünïcödé text; 日本語 and emoji 🎭.\n" * 5,
]

EDGE_CASES = {
    "empty": "",
    "emoji": "a 👋🏽 b 🎭🏳️‍🌈",
    "cjk": "日本語のテキストと中文",
    "combining_marks": "e\u0301 a\u0308 n\u0303\u0323",
    "crlf": "line one\r\nline two\r\n",
    "tabs": "\tindented\t\tcolumns\t",
    "leading_spaces": "   three spaces first",
    "nul": "a\x00b\x00",
    "max_code_point": "\U0010ffff\ufffe",
    "line_separator": "a\u2028b\u2029c",
}


def test_special_token_ids_are_0_1_2(tiny_tokenizer):
    assert (tiny_tokenizer.bos_id, tiny_tokenizer.eos_id, tiny_tokenizer.pad_id) == (0, 1, 2)
    assert [tiny_tokenizer.id_to_token(i) for i in range(3)] == [BOS, EOS, PAD]


def test_encode_wraps_text_in_bos_eos(tiny_tokenizer):
    text = "My lord, I came to see your father's funeral."
    plain = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert plain  # non-empty text gives tokens
    assert tiny_tokenizer.encode(text) == [0, *plain, 1]
    assert not SPECIAL_IDS & set(plain)


def test_encode_empty_text_is_just_bos_eos(tiny_tokenizer):
    assert tiny_tokenizer.encode("") == [0, 1]
    assert tiny_tokenizer.encode("", add_special_tokens=False) == []


def test_encode_batch_equals_encode(tiny_tokenizer):
    texts = ["one", "", "two words", "日本"]
    assert tiny_tokenizer.encode_batch(texts) == [tiny_tokenizer.encode(t) for t in texts]
    assert tiny_tokenizer.encode_batch(texts, add_special_tokens=False) == [
        tiny_tokenizer.encode(t, add_special_tokens=False) for t in texts
    ]


@pytest.mark.parametrize("text", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_decode_encode_round_trips_edge_cases(tiny_tokenizer, text):
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text)) == text
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text, add_special_tokens=False)) == text


@PROPERTY
@given(text=st.text())
def test_decode_encode_round_trips_any_text(tiny_tokenizer, text):
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text)) == text


def test_decode_round_trips_the_corpus(tiny_tokenizer, corpus_docs):
    # A work the tokenizer was not trained on (the tiny tokenizer saw the first 6 ids only).
    doc = sorted(corpus_docs, key=lambda d: d.id)[-1]
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(doc.text)) == doc.text


@pytest.mark.parametrize("literal", SPECIAL_TOKENS)
def test_special_token_literal_in_user_text_is_plain_text(tiny_tokenizer, literal):
    text = f"before {literal} after{literal}{literal}"
    ids = tiny_tokenizer.encode(text)
    assert ids[0] == 0 and ids[-1] == 1
    assert not SPECIAL_IDS & set(ids[1:-1])
    assert tiny_tokenizer.decode(ids) == text
    assert tiny_tokenizer.decode(ids, skip_special_tokens=False) == f"{BOS}{text}{EOS}"


def test_special_token_literal_alone_is_plain_text(tiny_tokenizer):
    ids = tiny_tokenizer.encode(EOS, add_special_tokens=False)
    assert len(ids) > 1 and not SPECIAL_IDS & set(ids)
    assert tiny_tokenizer.decode(ids) == EOS


def test_special_token_literal_is_plain_text_after_reload(tiny_tokenizer, tmp_path):
    path = tmp_path / "t.json"
    tiny_tokenizer.save(path)
    reloaded = Tokenizer.load(path)
    assert not SPECIAL_IDS & set(reloaded.encode("x<|eos|>y", add_special_tokens=False))


def test_token_bytes_of_specials_is_zero(tiny_tokenizer):
    assert [tiny_tokenizer.token_bytes(i) for i in range(3)] == [0, 0, 0]


def test_token_bytes_matches_decoded_length(tiny_tokenizer):
    checked = 0
    for token_id in range(3, tiny_tokenizer.vocab_size):
        text = tiny_tokenizer.decode([token_id])
        if "\ufffd" in text:  # a partial UTF-8 sequence does not decode on its own
            continue
        assert tiny_tokenizer.token_bytes(token_id) == len(text.encode("utf-8")), token_id
        checked += 1
    assert checked > 300  # ASCII bytes and the learned merges of English text


def test_token_bytes_of_every_single_byte_token_is_one(tiny_tokenizer):
    singles = [
        i for i in range(3, tiny_tokenizer.vocab_size) if len(tiny_tokenizer.id_to_token(i)) == 1
    ]
    assert len(singles) == 256
    assert {tiny_tokenizer.token_bytes(i) for i in singles} == {1}


@PROPERTY
@given(text=st.text())
def test_token_bytes_sum_to_utf8_length(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert sum(tiny_tokenizer.token_bytes(i) for i in ids) == len(text.encode("utf-8"))


def test_token_bytes_sum_to_utf8_length_on_edge_cases(tiny_tokenizer):
    for text in EDGE_CASES.values():
        ids = tiny_tokenizer.encode(text)
        assert sum(tiny_tokenizer.token_bytes(i) for i in ids) == len(text.encode("utf-8"))


def test_training_is_deterministic():
    a = Tokenizer.train(SMALL_TEXTS, 300)
    b = Tokenizer.train(SMALL_TEXTS, 300)
    assert a.fingerprint == b.fingerprint
    assert a.encode(SMALL_TEXTS[2]) == b.encode(SMALL_TEXTS[2])


def test_different_vocab_size_gives_different_fingerprint():
    a = Tokenizer.train(SMALL_TEXTS, 300)
    b = Tokenizer.train(SMALL_TEXTS, 320)
    assert a.fingerprint != b.fingerprint


def test_different_texts_give_different_fingerprint():
    a = Tokenizer.train(SMALL_TEXTS, 300)
    b = Tokenizer.train(SMALL_TEXTS[:2], 300)
    assert a.fingerprint != b.fingerprint


def test_trained_vocab_size_is_the_requested_size(tiny_tokenizer):
    assert tiny_tokenizer.vocab_size == 512
    assert Tokenizer.train(SMALL_TEXTS, MIN_VOCAB_SIZE).vocab_size == MIN_VOCAB_SIZE


def test_save_load_keeps_fingerprint_and_encodings(tmp_path):
    trained = Tokenizer.train(SMALL_TEXTS, 300)
    path = tmp_path / "tokenizer.json"
    trained.save(path)
    assert file_sha256(path) == trained.fingerprint
    loaded = Tokenizer.load(path)
    assert loaded.fingerprint == trained.fingerprint
    for text in [*SMALL_TEXTS, *EDGE_CASES.values()]:
        assert loaded.encode(text) == trained.encode(text)
    assert (loaded.token_bytes_table == trained.token_bytes_table).all()
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write cleaned up after itself


def test_loaded_fingerprint_is_file_sha256(tiny_tokenizer, tmp_path):
    path = tmp_path / "t.json"
    tiny_tokenizer.save(path)
    assert tiny_tokenizer.fingerprint == file_sha256(path)


def test_vocab_size_below_minimum_is_refused():
    assert MIN_VOCAB_SIZE == 259
    with pytest.raises(TokenizerError, match="--vocab-size 259 or more") as info:
        Tokenizer.train(SMALL_TEXTS, 258)
    assert "258" in str(info.value)


def test_load_missing_file_is_refused(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(TokenizerError, match="not found") as info:
        Tokenizer.load(missing)
    assert str(missing) in str(info.value)


def test_load_non_json_file_is_refused(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text("this is not json\n")
    with pytest.raises(TokenizerError, match="is not a tokenizer.json"):
        Tokenizer.load(path)


def test_load_json_that_is_not_a_tokenizer_is_refused(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"hello": "world"}')
    with pytest.raises(TokenizerError, match="is not a tokenizer.json"):
        Tokenizer.load(path)


def test_load_tokenizer_without_octlm_specials_is_refused(tiny_tokenizer, tmp_path):
    src = tmp_path / "good.json"
    tiny_tokenizer.save(src)
    data = json.loads(src.read_text(encoding="utf-8"))
    # Rename the specials: a valid tokenizer.json, but ids 0-2 are not octlm's tokens.
    renames = {BOS: "<s>", EOS: "</s>", PAD: "<pad>"}
    for added in data["added_tokens"]:
        added["content"] = renames[added["content"]]
    vocab = data["model"]["vocab"]
    for old, new in renames.items():
        vocab[new] = vocab.pop(old)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(TokenizerError, match="special tokens"):
        Tokenizer.load(bad)


def test_failed_save_leaves_no_temp_file(tiny_tokenizer, tmp_path):
    target = tmp_path / "tokenizer.json"
    target.mkdir()  # a folder where the file should go: the final rename fails
    with pytest.raises(OSError):
        tiny_tokenizer.save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]
    assert target.is_dir() and not any(target.iterdir())
