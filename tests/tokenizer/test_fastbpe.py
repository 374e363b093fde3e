"""The fast encoder gives `Tokenizer.encode_batch`'s ids exactly: on the whole embedded corpus, on
random Unicode, with a vocabulary where rank-based BPE (tiktoken) gives other ids, and through
`octlm prepare`, whose shards are byte-identical with the fast path on and off."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, normalizers, pre_tokenizers

from octlm.data.shards import ShardDataset
from octlm.errors import DataError
from octlm.prepare.corpus import read_documents, split_documents
from octlm.prepare.text import PrepareConfig, prepare
from octlm.tokenizer.core import SPECIAL_TOKENS, Tokenizer
from octlm.tokenizer.fastbpe import ENCODER_ENV, DocumentEncoder, Splitter, use_fast_path

GPT2_SPLIT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PROPERTY = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
FRAGMENTS = [
    "'s", "'S", "'ll", "''", " '", "don't", "  ", "\t", "\n\n", "\r\n", " \u00a0", "\u3000",
    "\u2028", "\x85", "12", " 3.5", "½", "Ⅻ", "日本語", "e\u0301", "🎭", "<|eos|>", "\x00",
]  # fmt: skip


def ids_of(arrays: list[np.ndarray]) -> list[list[int]]:
    return [a.tolist() for a in arrays]


def stream(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    return [i for ids in tokenizer.encode_batch(texts) for i in ids]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    lines = (json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(texts))
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def encoder(tiny_tokenizer) -> DocumentEncoder:
    return DocumentEncoder(tiny_tokenizer)


# -- (a) the whole corpus -------------------------------------------------------------------------
@pytest.mark.slow  # the whole corpus through both tokenizers: 5 s
def test_fast_ids_equal_hf_ids_on_every_document_of_the_embedded_corpus(
    tiny_tokenizer, corpus_docs
):
    texts = [d.text for d in corpus_docs]
    fresh = DocumentEncoder(tiny_tokenizer)
    fast = fresh.encode_batch(texts)
    assert fresh.note() == {"piecewise": len(texts), "hf": 0}  # no document fell back
    for doc, ids, expected in zip(
        corpus_docs, fast, tiny_tokenizer.encode_batch(texts), strict=True
    ):
        assert ids.tolist() == expected, doc.id


@PROPERTY
@given(st.lists(st.one_of(st.text(max_size=30), st.sampled_from(FRAGMENTS)), max_size=12))
def test_fast_ids_equal_hf_ids_on_random_unicode(encoder, tiny_tokenizer, parts):
    text = "".join(parts)
    assert ids_of(encoder.encode_batch([text])) == tiny_tokenizer.encode_batch([text])


def test_a_character_hf_refuses_sends_its_document_to_hf(encoder):
    # A lone surrogate (possible from JSONL "\ud800"): HF's encode_batch decides what happens.
    assert encoder._splitter.split("ok \ud800 ok") is None
    assert encoder._splitter.split("ok \u00e9 ok") == ["ok", " \u00e9", " ok"]


# -- (b) a vocabulary where rank-based BPE differs ------------------------------------------------
@pytest.fixture(scope="module")
def crafted(tmp_path_factory) -> Path:
    """Merges (b,c) then (a,b) then (ab,c), in id order. Merge-list BPE turns "abc" into a + bc
    and stops ((a, bc) is no merge); rank-based BPE also joins a + bc, since "abc" is a token."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *alphabet, "bc", "ab", "abc"])}
    bpe = models.BPE(vocab=vocab, merges=[("b", "c"), ("a", "b"), ("ab", "c")])
    hf = tokenizers.Tokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(list(SPECIAL_TOKENS))
    path = tmp_path_factory.mktemp("crafted") / "tokenizer.json"
    hf.save(str(path))
    return path


CRAFTED_TEXTS = [f"abc abcd {i} xabc ab bc cabc abcabc\n" * 40 for i in range(6)]


def rank_bpe(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """tiktoken's algorithm: merge the adjacent pair whose concatenation has the lowest rank."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while True:
        pairs = [
            (ranks[x + y], i)
            for i, (x, y) in enumerate(zip(parts, parts[1:], strict=False))
            if x + y in ranks
        ]
        if not pairs:
            return [ranks[p] for p in parts]
        _, i = min(pairs)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def test_crafted_vocabulary_is_one_where_rank_based_bpe_gives_other_ids(crafted):
    tokenizer = Tokenizer.load(crafted)
    ranks = {}
    for i in range(3, tokenizer.vocab_size):
        text = tokenizer.decode([i])
        if text.isascii():  # every ASCII byte, and the three merges
            ranks[text.encode()] = i
    a = ranks[b"a"]
    assert tokenizer.encode("abc", add_special_tokens=False) == [a, ranks[b"bc"]]
    assert rank_bpe(b"abc", ranks) == [ranks[b"abc"]]
    try:  # tiktoken itself, where it is installed (it is not an octlm dependency)
        import tiktoken
    except ImportError:
        return
    enc = tiktoken.Encoding("crafted", pat_str=GPT2_SPLIT, mergeable_ranks=ranks, special_tokens={})
    assert enc.encode_ordinary("abc") == [ranks[b"abc"]]
    assert enc.encode_ordinary(CRAFTED_TEXTS[0]) != tokenizer.encode(
        CRAFTED_TEXTS[0], add_special_tokens=False
    )


def test_prepare_writes_hf_ids_with_the_crafted_vocabulary(tmp_path, crafted):
    source = write_jsonl(tmp_path / "docs.jsonl", CRAFTED_TEXTS)
    cfg = PrepareConfig(out=tmp_path / "data", inputs=(str(source),), tokenizer=crafted, context=8)
    manifest = prepare(cfg, progress=False)
    assert manifest["encoder"] == {"piecewise": len(CRAFTED_TEXTS), "hf": 0}
    dataset = ShardDataset.open(cfg.out, verify_checksums=True)
    tokenizer = Tokenizer.load(crafted)
    train, val = split_documents(read_documents([source]), cfg.split.val_fraction)
    for docs, got in ((train, dataset.train), (val, dataset.val)):
        assert got.window(0, len(got)).tolist() == stream(tokenizer, [d.text for d in docs])


# -- (c) prepare: fast path on and off ------------------------------------------------------------
@pytest.mark.slow  # two prepares of the corpus: 6-10 s
def test_prepare_shards_are_byte_identical_with_the_fast_path_on_and_off(
    tmp_path, monkeypatch, embedded_4096
):
    # The fast path's dataset is the session's (tests/conftest.py: the embedded corpus at vocab
    # 4096, the encoder setting unset, so auto); the same settings again here with it off.
    folders = {"auto": embedded_4096, "hf": tmp_path / "hf"}
    manifests = {"auto": json.loads((embedded_4096 / "manifest.json").read_text())}
    monkeypatch.setenv(ENCODER_ENV, "hf")
    manifests["hf"] = prepare(PrepareConfig(out=folders["hf"], vocab_size=4096), progress=False)
    assert manifests["auto"]["encoder"] == {"piecewise": 42, "hf": 0}
    assert manifests["hf"]["encoder"] == {
        "piecewise": 0,
        "hf": 42,
        "hf_because": "OCTLM_ENCODER=hf",
    }
    assert manifests["auto"]["fingerprint"] == manifests["hf"]["fingerprint"]
    shards = sorted(p.name for p in folders["auto"].glob("*.bin"))
    assert shards == sorted(p.name for p in folders["hf"].glob("*.bin")) and shards
    for name in [*shards, "tokenizer.json"]:
        assert (folders["auto"] / name).read_bytes() == (folders["hf"] / name).read_bytes(), name


def test_encoder_setting_is_auto_hf_or_an_error(monkeypatch):
    for value, fast in (("", True), ("auto", True), ("hf", False), ("HF", False)):
        monkeypatch.setenv(ENCODER_ENV, value)
        assert use_fast_path() is fast
    monkeypatch.setenv(ENCODER_ENV, "tiktoken")
    with pytest.raises(DataError, match="OCTLM_ENCODER='tiktoken' is not 'auto' or 'hf'"):
        use_fast_path()


# -- tokenizers of another shape use HF throughout ------------------------------------------------
def lowercase(hf: tokenizers.Tokenizer) -> None:
    hf.normalizer = normalizers.Lowercase()


def prefix_space(hf: tokenizers.Tokenizer) -> None:
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)


def added_word(hf: tokenizers.Tokenizer) -> None:
    hf.add_tokens(["winter"])  # not special: HF cuts it out of the text before splitting


def truncating(hf: tokenizers.Tokenizer) -> None:
    hf.enable_truncation(max_length=5)


@pytest.mark.parametrize("change", [lowercase, prefix_space, added_word, truncating])
def test_a_tokenizer_of_another_shape_is_encoded_by_hf(tmp_path, tiny_tokenizer, change):
    hf = tokenizers.Tokenizer.from_str(tiny_tokenizer.hf.to_str())
    change(hf)
    hf.save(str(tmp_path / "tokenizer.json"))
    tokenizer = Tokenizer.load(tmp_path / "tokenizer.json")
    fallback = DocumentEncoder(tokenizer)
    texts = ["Now is the WINTER of our discontent", "made glorious summer"]
    assert ids_of(fallback.encode_batch(texts)) == tokenizer.encode_batch(texts)
    assert fallback.note()["piecewise"] == 0 and fallback.hf_because


def test_splitter_matches_hf_pre_tokenizer_on_its_witness_and_edge_cases(tiny_tokenizer):
    pre = tiny_tokenizer.hf.pre_tokenizer
    splitter = Splitter(pre)
    assert splitter.ok
    for text in ["", " ", "a", "  x", "x  ", "a\n\n b", "it's 'Tis", "\u00e9\u00e9 \u00e9"]:
        assert splitter.split(text) == [text[a:b] for _, (a, b) in pre.pre_tokenize_str(text)]
