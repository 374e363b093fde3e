"""`octlm prepare --tokenizer` with a Hugging Face folder, end to end in real processes.

Both kinds of folder (`tests/hf_folders.py`), given as DIR/tokenizer.json and as DIR: every
document in the shards is transformers' encoding of its text (BOS only where transformers adds
one) followed by EOS, the manifest records the ids, and a short run trains on the data. Then a
random `LlamaForCausalLM` saved with the Llama-style tokenizer -> prepare -> `train --init-from`
-> `generate` decodes text. Bad folders are one error line, with nothing written at --out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from octlm.data.shards import ShardDataset
from tests.e2e.helpers import QUICK_CONTEXT, QUICK_RUN, octlm
from tests.hf_folders import VARIED, byte_level_folder, corpus_texts, llama_folder

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow
os.environ["HF_HUB_OFFLINE"] = "1"  # loading must never reach the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"
CONTEXT, RUN = QUICK_CONTEXT, QUICK_RUN
TEXTS = [VARIED, *corpus_texts(60, seed=7)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    lines = (json.dumps({"id": f"d{i:03d}", "text": t}) for i, t in enumerate(TEXTS))
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {
        "byte_level": byte_level_folder(root / "byte-level"),
        "llama": llama_folder(root / "llama"),
    }


def prepare(corpus: Path, tokenizer: Path, out: Path, check: bool = True):
    args = ("prepare", str(corpus), "--tokenizer", str(tokenizer), "--out", str(out))
    return octlm(*args, "--context", str(CONTEXT), "--val-docs", "8", check=check)


def documents(dataset: ShardDataset, eos: int) -> list[list[int]]:
    """Every document of both splits, each ending in EOS."""
    docs = []
    for stream in (dataset.train, dataset.val):
        tokens = stream.window(0, len(stream)).tolist()
        ends = [i for i, t in enumerate(tokens) if t == eos]
        assert ends and ends[-1] == len(tokens) - 1
        docs += [tokens[a + 1 : b + 1] for a, b in zip([-1, *ends], ends, strict=False)]
    return docs


@pytest.mark.parametrize("kind", ["byte_level", "llama"])
def test_prepare_with_a_hugging_face_folder(kind, corpus, folders, tmp_path) -> None:
    folder = folders[kind]
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    eos = theirs.eos_token_id
    a, b = tmp_path / "file", tmp_path / "folder"
    prepare(corpus, folder / "tokenizer.json", a)
    prepare(corpus, folder, b)
    manifest = json.loads((a / "manifest.json").read_text(encoding="utf-8"))
    bos = 1 if kind == "llama" else None  # transformers adds <s> for the Llama-style one only
    assert manifest["tokenizer"]["specials"] == {"bos": bos, "eos": eos, "pad": eos}
    assert manifest == json.loads((b / "manifest.json").read_text(encoding="utf-8"))
    assert (a / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    dataset = ShardDataset.open(a, verify_checksums=True)
    expected = [theirs(t).input_ids + [eos] for t in TEXTS]
    assert sorted(documents(dataset, eos)) == sorted(expected)
    assert all((d[0] == bos) == (bos is not None) for d in expected)
    # A short run on it: the vocabulary comes from the data's tokenizer.
    run = tmp_path / "run"
    octlm("train", "--model", "micro", "--data", str(a), "--out", str(run), "--steps", "3", *RUN)
    end = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()][-1]
    assert end["type"] == "end" and np.isfinite(end.get("loss", 0.0))


@pytest.fixture(scope="module")
def llama_model(tmp_path_factory) -> Path:
    """A random Llama saved with the Llama-style tokenizer in one folder, as on the Hub."""
    folder = llama_folder(tmp_path_factory.mktemp("model") / "llama")
    vocab = transformers.AutoTokenizer.from_pretrained(str(folder)).vocab_size
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_init_from_a_llama_folder_with_its_tokenizer(llama_model, corpus, tmp_path) -> None:
    data, run = tmp_path / "data", tmp_path / "run"
    prepare(corpus, llama_model / "tokenizer.json", data)
    train = ("train", "--init-from", str(llama_model), "--data", str(data), "--out", str(run))
    octlm(*train, "--steps", "3", *RUN)
    out = octlm("generate", str(run), "--prompt", "The quick", "--max-new-tokens", "8").stdout
    assert out.startswith("The quick") and len(out) > len("The quick")
    exported = tmp_path / "exported"
    octlm("export", str(run), str(exported))
    config = json.loads((exported / "config.json").read_text(encoding="utf-8"))
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
    hf = transformers.AutoTokenizer.from_pretrained(str(exported))
    assert (hf.bos_token, hf.eos_token, hf.pad_token) == ("<s>", "</s>", "</s>")


def test_a_folder_without_tokenizer_json_is_refused(corpus, tmp_path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}", encoding="utf-8")
    proc = prepare(corpus, folder, tmp_path / "out", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "holds no tokenizer.json" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_without_eos_is_refused(corpus, folders, tmp_path) -> None:
    folder = tmp_path / "no-eos"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((folders["byte_level"] / "tokenizer.json").read_bytes())
    (folder / "tokenizer_config.json").write_text('{"bos_token": "<s>"}', encoding="utf-8")
    proc = prepare(corpus, folder / "tokenizer.json", tmp_path / "out", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "no EOS token" in proc.stderr
    assert not (tmp_path / "out").exists()
