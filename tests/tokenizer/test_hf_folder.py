"""A Hugging Face tokenizer folder: its BOS/EOS/PAD from its config files (and their order of
precedence), the same ids and framing as transformers, bytes per token for both kinds of token
string, the fast encoder only where it is exact, and one-line errors for a bad folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octlm.data.dataset_tokenizer import tokenizer_entry
from octlm.errors import TokenizerError
from octlm.tokenizer.core import OCTLM_SPECIALS, Specials
from octlm.tokenizer.fastbpe import DocumentEncoder
from octlm.tokenizer.hf_folder import open_tokenizer
from tests.hf_folders import VARIED, byte_level_folder, corpus_texts, llama_folder

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory) -> Path:
    return byte_level_folder(tmp_path_factory.mktemp("hf") / "byte-level")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return llama_folder(tmp_path_factory.mktemp("hf") / "llama")


def copy_folder(src: Path, dst: Path, edit: dict[str, dict | None] | None = None) -> Path:
    """`src` copied to `dst`, with each named JSON file replaced (None: removed)."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    for name, content in (edit or {}).items():
        if content is None:
            (dst / name).unlink(missing_ok=True)
        else:
            (dst / name).write_text(json.dumps(content), encoding="utf-8")
    return dst


def test_byte_level_specials_at_the_end_of_the_vocabulary(byte_level) -> None:
    tok = open_tokenizer(byte_level / "tokenizer.json")
    eos = tok.hf.token_to_id("</s>")
    assert eos == tok.vocab_size - 1 and eos not in (0, 1, 2)
    # No post-processor: transformers adds no BOS, so documents start with none; no PAD: EOS.
    assert tok.specials == Specials(bos=None, eos=eos, pad=eos)
    assert open_tokenizer(byte_level).specials == tok.specials  # the folder itself


def test_llama_specials(llama) -> None:
    tok = open_tokenizer(llama)
    assert tok.specials == Specials(bos=1, eos=2, pad=2)  # Llama has no PAD: EOS pads


@pytest.mark.parametrize("kind", ["byte_level", "llama"])
def test_document_framing_is_transformers_encoding_plus_eos(kind, request) -> None:
    folder = request.getfixturevalue(kind)
    ours = open_tokenizer(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in [VARIED, *corpus_texts(5, seed=1)]:
        assert ours.encode(text) == theirs(text).input_ids + [ours.eos_id]
        plain = theirs(text, add_special_tokens=False).input_ids
        assert ours.encode(text, add_special_tokens=False) == plain
        assert ours.decode(ours.encode(text)) == theirs.decode(plain)


@pytest.mark.parametrize(("kind", "prefix"), [("byte_level", 0), ("llama", 1)])
def test_token_bytes_add_up_to_the_text(kind, prefix, request) -> None:
    """ByteLevel: one byte per character of a token; Metaspace: "▁" is one byte (so the one it
    prepends to a text counts one byte the text lacks), `<0xNN>` one byte, specials none."""
    tok = open_tokenizer(request.getfixturevalue(kind))
    texts = [VARIED, VARIED[::-1], "x", " leading space", *corpus_texts(3, seed=2)]
    for text in texts:
        ids = tok.encode(text)
        added = 0 if text.startswith(" ") else prefix  # Metaspace prepends none before a space
        assert sum(tok.token_bytes(i) for i in ids) == len(text.encode("utf-8")) + added
    for idx in {tok.bos_id, tok.eos_id, tok.pad_id} - {None}:
        assert tok.token_bytes(idx) == 0
    if kind == "llama":
        assert tok.id_to_token(3 + 0x0A) == "<0x0A>" and tok.token_bytes(3 + 0x0A) == 1
        assert tok.token_bytes(0) == 0  # <unk>: an added special token


def test_octlm_tokenizer_is_unchanged(tiny_tokenizer, tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    tiny_tokenizer.save(path)
    tok = open_tokenizer(path)
    assert tok.specials == OCTLM_SPECIALS and tok.fingerprint == tiny_tokenizer.fingerprint
    assert "specials" not in tokenizer_entry(tok)  # old manifests, old fingerprints
    assert (tok.token_bytes_table == tiny_tokenizer.token_bytes_table).all()
    # An `octlm export` folder says add_bos_token false for transformers: still octlm's own.
    config = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "add_bos_token": False}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    assert open_tokenizer(tmp_path).specials == OCTLM_SPECIALS


def test_special_tokens_map_wins_over_tokenizer_config(llama, tmp_path) -> None:
    config = json.loads((llama / "tokenizer_config.json").read_text(encoding="utf-8"))
    folder = copy_folder(
        llama,
        tmp_path / "f",
        {
            "special_tokens_map.json": {"eos_token": {"content": "<unk>"}, "pad_token": "<unk>"},
            "tokenizer_config.json": {**config, "add_bos_token": False},
        },
    )
    assert open_tokenizer(folder).specials == Specials(bos=None, eos=0, pad=0)


def test_model_config_ids_fill_the_gaps(byte_level, tmp_path) -> None:
    """No token names anything: config.json, then generation_config.json (a list: its first)."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    folder = copy_folder(
        byte_level,
        tmp_path / "f",
        {
            "tokenizer_config.json": config,
            "config.json": {"pad_token_id": 7},
            "generation_config.json": {"eos_token_id": [300, 5], "pad_token_id": 9},
        },
    )
    assert open_tokenizer(folder).specials == Specials(bos=None, eos=300, pad=7)


def test_folder_without_tokenizer_json_is_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(TokenizerError, match="holds no tokenizer.json"):
        open_tokenizer(tmp_path)


def test_no_eos_is_refused(byte_level, tmp_path) -> None:
    folder = copy_folder(byte_level, tmp_path / "f", {"tokenizer_config.json": {}})
    with pytest.raises(TokenizerError, match="no EOS token .* tokenizer_config.json"):
        open_tokenizer(folder / "tokenizer.json")


def test_a_token_the_tokenizer_lacks_is_refused(byte_level, tmp_path) -> None:
    folder = copy_folder(
        byte_level, tmp_path / "f", {"tokenizer_config.json": {"eos_token": "<end>"}}
    )
    with pytest.raises(TokenizerError, match="eos_token .<end>., which tokenizer.json does not"):
        open_tokenizer(folder)


def test_an_id_outside_the_vocabulary_is_refused(byte_level, tmp_path) -> None:
    folder = copy_folder(
        byte_level,
        tmp_path / "f",
        {"tokenizer_config.json": {}, "config.json": {"eos_token_id": 10**6}},
    )
    with pytest.raises(TokenizerError, match="eos id 1000000 is outside"):
        open_tokenizer(folder)


@pytest.mark.parametrize("kind", ["byte_level", "byte_level_bare", "llama"])
def test_fast_encoder_matches_or_steps_aside(kind, byte_level, llama, tmp_path) -> None:
    """Split-and-dedupe only for octlm's shape (here: transformers' post-processor removed, as
    octlm's files have none); the ids are HF's either way, with no BOS in front."""
    folder = llama if kind == "llama" else byte_level
    if kind == "byte_level_bare":
        spec = json.loads((byte_level / "tokenizer.json").read_text(encoding="utf-8"))
        folder = copy_folder(
            byte_level, tmp_path / "f", {"tokenizer.json": {**spec, "post_processor": None}}
        )
    tok = open_tokenizer(folder)
    encoder = DocumentEncoder(tok)
    texts = [VARIED, *corpus_texts(20, seed=3)]
    got = [ids.tolist() for ids in encoder.encode_batch(texts)]
    assert got == tok.encode_batch(texts) and got[0][-1] == tok.eos_id
    if kind == "byte_level_bare":
        assert encoder.hf_because is None and encoder.counts["piecewise"] > 0
    else:  # a post-processor (TemplateProcessing) / Metaspace: HF encodes every document
        assert encoder.hf_because is not None and encoder.counts["piecewise"] == 0
