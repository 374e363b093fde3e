"""`octlm export`: a real tiny run exported by the CLI and loaded back by `transformers` offline.

The Hugging Face folder must give octlm's logits and greedy ids and tokenize like octlm; the
plain safetensors file must round-trip to the same weights_sha256. Bad input is one error line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from octlm.config.shape import ModelConfig
from octlm.data.shards import ShardDataset
from octlm.errors import OctlmError
from octlm.generation.sampling import generate
from octlm.generation.trained import load_model
from octlm.hashing import file_sha256, weights_sha256
from octlm.model.gpt import GPT
from octlm.tokenizer.core import Tokenizer
from octlm.tools.export import export
from tests import octlm_process
from tests.cli_in_process import main
from tests.tools.helpers import EXPORT_CONTEXT, assert_one_error_line, export_run_args

# Every test here starts a process (or reads the run a fixture trained with `python -m octlm`).
pytestmark = pytest.mark.slow

# Loading must never reach the network; the hub reads these when transformers is imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

CONTEXT = EXPORT_CONTEXT
HF_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


def octlm(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OCTLM_CACHE": "/nonexistent-octlm-cache"}  # never prepare implicitly
    proc = octlm_process.run([*map(str, args)], env, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"octlm {' '.join(map(str, args))} failed:\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def run(tiny_dataset: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "run"
    octlm(*export_run_args(tiny_dataset, out))
    return out


@pytest.fixture(scope="module")
def hf_dir(run: Path) -> Path:
    out = run.parent / "hf"
    proc = octlm("export", run, "--format", "hf", out)
    assert proc.stdout.startswith(f"wrote {out}"), proc.stdout
    return out


@pytest.fixture(scope="module")
def ours(run: Path) -> GPT:
    return load_model(run)[0]


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def val_batch(tiny_dataset: Path) -> torch.Tensor:
    """Two windows of real validation tokens, (2, CONTEXT)."""
    val = ShardDataset.open(tiny_dataset).val
    return torch.stack([torch.from_numpy(val.window(s, CONTEXT)) for s in (0, len(val) // 2)])


def test_hf_folder_holds_llama_config_and_names(hf_dir: Path, run: Path, tiny_dataset) -> None:
    assert {p.name for p in hf_dir.iterdir()} == HF_FILES
    cfg = json.loads((hf_dir / "config.json").read_text())
    model = ModelConfig.from_dict(load_model(run)[1].model_config)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["max_position_embeddings"]) == (
        model.d_model,
        model.n_layers,
        CONTEXT,
    )
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (0, 1, 2)
    with safe_open(str(hf_dir / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())  # noqa: SIM118
    assert "lm_head.weight" not in names  # tied: transformers rebuilds it from embed_tokens
    assert {"model.embed_tokens.weight", "model.norm.weight"} <= names
    assert "model.layers.3.mlp.gate_proj.weight" in names and len(names) == 2 + 9 * 4
    assert file_sha256(hf_dir / "tokenizer.json") == file_sha256(tiny_dataset / "tokenizer.json")
    gen = json.loads((hf_dir / "generation_config.json").read_text())
    assert gen["do_sample"] is False and gen["eos_token_id"] == 1


def hf_model(transformers, hf_dir: Path, attn: str):
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation=attn)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    return model.eval()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_logits_match_octlm(transformers, hf_dir, ours, val_batch, attn) -> None:
    model = hf_model(transformers, hf_dir, attn)
    with torch.no_grad():
        expected, got = ours(val_batch), model(val_batch).logits
    diff = (expected - got).abs().max().item()
    print(f"max |logit diff| ({attn}): {diff:.3g}")
    assert diff < 1e-4

    # Control: Meta's interleaved q/k layout (what HF's Llama converter permutes away) must
    # show up, so the match above proves no permutation was needed.
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                w = proj.weight
                heads = w.shape[0] // model.config.head_dim
                w.copy_(w.view(heads, 2, -1, w.shape[1]).transpose(1, 2).reshape(w.shape))
        control = (expected - model(val_batch).logits).abs().max().item()
    print(f"control, interleaved q/k ({attn}): {control:.3g}")
    assert control > 0.1


def test_greedy_generation_matches_octlm(transformers, hf_dir, ours, val_batch) -> None:
    model = hf_model(transformers, hf_dir, "sdpa")
    for row in val_batch:
        prompt = [0, *row[:15].tolist()]  # BOS + text, as `octlm generate` prompts
        expected = generate(ours, prompt, 32, stop_id=1)
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=32,
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
        )
        assert out.sequences[0, len(prompt) :].tolist() == expected
        # The step logits come from transformers' KV cache; octlm's from one full forward pass.
        with torch.no_grad():
            full = ours(out.sequences[:, :-1])[0, len(prompt) - 1 :]
        assert (torch.cat(out.logits) - full).abs().max().item() < 1e-4


def test_tokenizer_encodes_and_decodes_like_octlm(transformers, hf_dir, corpus_docs) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(hf_dir)
    tok = Tokenizer.load(hf_dir / "tokenizer.json")
    assert (hf.bos_token, hf.eos_token, hf.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (0, 1, 2)
    texts = [d.text[1000:2500] for d in corpus_docs[:4]]
    texts.append("ROMEO:  a literal <|eos|> and <|bos|><|pad|> stay text\n\n\tcafé ☃ 😀 ")
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert hf(text).input_ids == ids  # no BOS/EOS added by default
        assert hf(text, add_special_tokens=False).input_ids == ids
        assert hf.decode(ids) == tok.decode(ids) == text
        framed = [0, *ids, 1]
        assert hf.decode(framed, skip_special_tokens=True) == tok.decode(framed) == text
    # A literal special token in text is bytes, never the special id (split_special_tokens).
    literal = hf("<|eos|>").input_ids
    assert len(literal) > 1 and not set(literal) & {0, 1, 2}
    assert literal == tok.encode("<|eos|>", add_special_tokens=False)


def test_safetensors_round_trips(run: Path, ours: GPT, capsys) -> None:
    expected = weights_sha256(ours.state_dict())
    file_out, dir_out = run.parent / "weights.safetensors", run.parent / "plain"
    octlm("export", run, "--format", "safetensors", file_out)
    assert main(["export", str(run), "--format", "safetensors", str(dir_out)]) == 0
    for path in (file_out, dir_out / "model.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()["octlm"])
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        model = GPT(ModelConfig.from_dict(meta["model_config"]))
        model.load_state_dict(tensors)
        assert weights_sha256(model.state_dict()) == expected
        assert meta["fingerprints"] == load_model(run)[1].fingerprints
    # The header makes the file an octlm snapshot, so the run commands accept it.
    capsys.readouterr()
    assert main(["hash", str(file_out)]) == 0
    assert capsys.readouterr().out.split()[0] == expected


def test_bad_input_is_one_error_line(run, tiny_dataset, tmp_path, capsys) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("keep me")
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    other_tok = tmp_path / "tokenizer.json"  # the same vocabulary, but other bytes
    other_tok.write_text((tiny_dataset / "tokenizer.json").read_text() + "\n")
    cases = [
        ((run, busy), "already exists and is not empty"),
        ((run, busy, "--format", "safetensors"), "already exists and is not empty"),
        ((tmp_path / "nope", tmp_path / "o1"), "does not exist"),
        ((foreign, tmp_path / "o2"), "has no octlm metadata"),
        ((run, tmp_path / "o3", "--tokenizer", other_tok), "not the tokenizer"),
    ]
    capsys.readouterr()
    for args, expected in cases:
        assert main(["export", *map(str, args)]) == 1
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("octlm: error: ") and expected in err[0], err
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 4))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left

    with pytest.raises(OctlmError, match="unknown export format 'onnx'; use one of: hf"):
        export(run, "onnx", tmp_path / "o4")
    # Usage errors (argparse) are one line too, with exit status 2.
    proc = octlm("export", run, tmp_path / "o4", "--format", "onnx", check=False)
    assert_one_error_line(proc, "invalid choice: 'onnx'")
    assert proc.returncode == 2 and not (tmp_path / "o4").exists()

    # --force writes into the busy folder, replacing only its own files.
    assert main(["export", str(run), str(busy), "--force"]) == 0
    assert {p.name for p in busy.iterdir()} == HF_FILES | {"keep.txt"}


def test_export_never_imports_transformers() -> None:
    code = "import sys, octlm.tools.export, octlm.cli.main; sys.exit('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
