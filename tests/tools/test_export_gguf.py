"""`octlm export RUN OUT.gguf --format gguf`: a real tiny run exported by the CLI, read back by
the `gguf` package's GGUFReader (tensors, metadata, tokenizer), and, where `llama-cpp-python`
is installed, run by llama.cpp against octlm's logits and greedy text. Refusals are one line.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from octlm.cli.main import main
from octlm.config.shape import ModelConfig, preset
from octlm.data.chat_format import JINJA_TEMPLATE
from octlm.data.shards import MANIFEST_NAME
from octlm.errors import OctlmError
from octlm.generation.sampling import generate
from octlm.generation.trained import load_model
from octlm.hashing import file_sha256
from octlm.model.gpt import GPT
from octlm.tokenizer.core import Tokenizer
from octlm.tools.export import export
from octlm.trainer import checkpoint as ckpt
from tests.e2e import helpers
from tests.tools.helpers import EXPORT_CONTEXT, assert_one_error_line, export_run_args

gguf = pytest.importorskip("gguf", reason="the gguf package (pip install 'octlm[gguf]')")
pytestmark = pytest.mark.slow  # the exports start `python -m octlm`

CONTEXT = EXPORT_CONTEXT
LOGIT_TOLERANCE = 1e-4
"""llama.cpp's logits against octlm's, f32 weights and an f32 key/value cache (3.8e-6 measured;
llama.cpp's default f16 cache read 1.0e-3)."""
"""llama.cpp (f32 file, CPU) against octlm's fp32 logits: both fp32, summed in other orders."""


def octlm(*args: object, check: bool = True):
    return helpers.octlm(*map(str, args), check=check, timeout=300)


@pytest.fixture(scope="module")
def run(tiny_dataset: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "run"
    octlm(*export_run_args(tiny_dataset, out))
    return out


@pytest.fixture(scope="module")
def ours(run: Path) -> GPT:
    return load_model(run)[0]


def exported(run: Path, outtype: str) -> Path:
    out = run.parent / f"model-{outtype}.gguf"
    if not out.exists():
        proc = octlm("export", run, out, "--format", "gguf", "--outtype", outtype)
        assert proc.stdout.startswith(f"wrote {out} (gguf)"), proc.stdout
    return out


def field(reader, key: str):
    return reader.fields[key].contents()


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's adjacent RoPE pairs back to octlm's half-split layout (per head)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def octlm_weights(reader, config: ModelConfig) -> dict[str, np.ndarray]:
    """The file's tensors under octlm's names, dequantized, q/k back in octlm's layout."""
    from octlm.tools.gguf_export import gguf_name

    names = {gguf_name(n): n for n in GPT(config).state_dict()}
    out = {}
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        name = names[t.name]
        if name.endswith("attention.wq.weight") and not config.qk_norm:
            data = unpermute(data, config.n_heads)
        if name.endswith("attention.wk.weight") and not config.qk_norm:
            data = unpermute(data, config.n_kv_heads)
        out[name] = data
    return out


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_tensors_are_the_models(run: Path, ours: GPT, outtype: str) -> None:
    reader = gguf.GGUFReader(exported(run, outtype))
    config = ours.config
    state = ours.state_dict()
    got = octlm_weights(reader, config)
    assert set(got) == set(state)  # no `output`: tied, as convert writes a tied model
    for name, weight in state.items():
        w = weight.numpy()
        if outtype == "f32" or w.ndim == 1:
            np.testing.assert_array_equal(got[name], w, err_msg=name)
        elif outtype == "f16":
            np.testing.assert_array_equal(got[name], w.astype(np.float16).astype(np.float32))
        else:  # q8_0: blocks of 32, a step d = absmax / 127 kept in f16 (2^-11 relative)
            step = np.abs(w.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
            err = np.abs(got[name] - w).reshape(-1, 32)
            assert (err <= step * (0.5 + 127 * 2**-11)).all(), name
    want = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0"}[outtype]
    by_name = {t.name: t.tensor_type.name for t in reader.tensors}
    assert by_name["blk.0.attn_q.weight"] == by_name["token_embd.weight"] == want
    assert by_name["blk.0.attn_norm.weight"] == by_name["output_norm.weight"] == "F32"
    assert field(reader, "general.file_type") == {"f32": 0, "f16": 1, "q8_0": 7}[outtype]


def test_metadata_and_tokenizer(run: Path, ours: GPT, tiny_dataset: Path) -> None:
    reader = gguf.GGUFReader(exported(run, "f32"))
    c = ours.config
    assert field(reader, "general.architecture") == "llama"
    expected = {
        "context_length": CONTEXT,
        "embedding_length": c.d_model,
        "block_count": c.n_layers,
        "feed_forward_length": c.d_ff,
        "attention.head_count": c.n_heads,
        "attention.head_count_kv": c.n_kv_heads,
        "attention.key_length": c.head_dim,
        "rope.dimension_count": c.head_dim,
        "vocab_size": c.vocab_size,
    }
    for key, value in expected.items():
        assert field(reader, f"llama.{key}") == value, key
    assert field(reader, "llama.rope.freq_base") == pytest.approx(c.rope_base)
    assert field(reader, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(c.norm_eps)
    tok = Tokenizer.load(tiny_dataset / "tokenizer.json")
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "gpt-2"
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert tokens == [tok.id_to_token(i) for i in range(tok.vocab_size)]
    types = field(reader, "tokenizer.ggml.token_type")
    assert types[:3] == [3, 3, 3] and set(types[3:]) == {1}  # the specials are control tokens
    tok_json = json.loads((tiny_dataset / "tokenizer.json").read_text())
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
    assert field(reader, "tokenizer.ggml.merges") == merges and len(merges) > 100
    ids = ("bos_token_id", "eos_token_id", "padding_token_id")
    assert [field(reader, f"tokenizer.ggml.{k}") for k in ids] == [0, 1, 2]
    assert field(reader, "tokenizer.ggml.add_bos_token") is True
    assert "tokenizer.chat_template" not in reader.fields  # not trained on chat data


def snapshot(folder: Path, weights: dict[str, torch.Tensor], config: ModelConfig, data: Path):
    meta = {"model_config": config.to_dict(), "data_dir": str(data)}
    meta["fingerprints"] = {"tokenizer": file_sha256(data / "tokenizer.json")}
    tensors = {name: t.detach().contiguous() for name, t in weights.items()}
    return ckpt.save_snapshot(folder, 0, tensors, ckpt.snapshot_header(meta))


def test_chat_run_carries_the_template(ours: GPT, tiny_dataset: Path, tmp_path: Path) -> None:
    """A model whose dataset is in the chat format (its manifest says so, as `prepare --format
    chat` writes it) gets the chat format's Jinja template."""
    data = tmp_path / "chat-data"
    shutil.copytree(tiny_dataset, data)
    manifest = json.loads((data / MANIFEST_NAME).read_text())
    manifest["chat_template"] = {"version": 1}
    (data / MANIFEST_NAME).write_text(json.dumps(manifest))
    snap = snapshot(tmp_path / "ft", ours.state_dict(), ours.config, data)
    out = tmp_path / "chat.gguf"
    assert main(["export", str(snap), str(out), "--format", "gguf", "--outtype", "f32"]) == 0
    reader = gguf.GGUFReader(out)
    assert field(reader, "tokenizer.chat_template") == JINJA_TEMPLATE


def test_qk_norm_model_is_qwen3_unpermuted(tiny_dataset: Path, tmp_path: Path) -> None:
    """--qk-norm: arch qwen3 (NEOX RoPE, llama.cpp's rotate_half), q/k as they are, the norms
    as attn_q_norm / attn_k_norm."""
    vocab = Tokenizer.load(tiny_dataset / "tokenizer.json").vocab_size
    config = preset("micro", vocab_size=vocab, qk_norm=True, context=CONTEXT, init_std=0.1)
    model = GPT(config)
    model.init_weights(torch.Generator().manual_seed(0))
    with torch.no_grad():
        for name, w in model.named_parameters():
            if name.endswith("norm.weight"):
                w.uniform_(0.5, 2.0)
    snap = snapshot(tmp_path / "qk", model.state_dict(), config, tiny_dataset)
    out = tmp_path / "qwen3.gguf"
    assert main(["export", str(snap), str(out), "--format", "gguf", "--outtype", "f32"]) == 0
    reader = gguf.GGUFReader(out)
    assert field(reader, "general.architecture") == "qwen3"
    assert field(reader, "qwen3.attention.key_length") == config.head_dim
    names = {t.name: t for t in reader.tensors}
    assert names["blk.0.attn_q_norm.weight"].data.shape == (config.head_dim,)
    got = octlm_weights(reader, config)
    for name, weight in model.state_dict().items():
        np.testing.assert_array_equal(got[name], weight.numpy(), err_msg=name)
    ids = torch.randint(3, vocab, (CONTEXT,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model.eval()(ids[None])[0]
        diff = (ggml_logits(out, ids.tolist(), "neox") - expected).abs().max().item()
        control = (ggml_logits(out, ids.tolist(), "norm") - expected).abs().max().item()
    print(f"max |logit diff| qwen3 graph vs octlm: {diff:.3g}, control {control:.3g}")
    assert diff < 1e-4 and control > 0.1
    if importlib.util.find_spec("llama_cpp") is not None:  # llama.cpp itself on the file
        theirs = llama_cpp_logits(out, ids.tolist())
        diff = (theirs - expected).abs().max().item()
        print(f"max |logit diff| llama.cpp (qwen3) vs octlm: {diff:.3g}")
        assert diff < LOGIT_TOLERANCE


def test_rope_permutation_is_converts() -> None:
    """`rope_interleaved` is llama.cpp's convert_hf_to_gguf.py `permute` (written out here as
    it is there, in numpy), and pairs (j, j + d/2) of each head become (2j, 2j + 1)."""
    from octlm.tools.gguf_export import rope_interleaved

    def permute(weights: np.ndarray, n_head: int) -> np.ndarray:
        return (
            weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape)
        )

    w = torch.arange(4 * 8 * 3, dtype=torch.float32).reshape(4 * 8, 3)
    ours = rope_interleaved(w, 4).numpy()
    np.testing.assert_array_equal(ours, permute(w.numpy(), 4))
    head, d = 1, 8
    for j in range(d // 2):
        np.testing.assert_array_equal(ours[head * d + 2 * j], w[head * d + j].numpy())
        np.testing.assert_array_equal(ours[head * d + 2 * j + 1], w[head * d + j + d // 2].numpy())
    np.testing.assert_array_equal(unpermute(ours, 4), w.numpy())


def rope(x: torch.Tensor, base: float, mode: str) -> torch.Tensor:
    """ggml_rope on (T, H, D): mode "norm" (llama.cpp's llama) rotates adjacent pairs (2i, 2i+1),
    "neox" (its qwen3) pairs (i, i + D/2); pair i turns by position * base^(-2i/D)."""
    t, _, d = x.shape
    angle = torch.arange(t)[:, None] * base ** (-torch.arange(0, d, 2) / d)
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    if mode == "norm":
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)
    x0, x1 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1)


def ggml_logits(path: Path, ids: list[int], mode: str) -> torch.Tensor:
    """Logits of a GGUF file's model as llama.cpp's llama/qwen3 graph computes them, from the
    file alone (its tensors by GGUF name, its metadata), with `mode`'s RoPE."""
    reader = gguf.GGUFReader(path)
    arch = field(reader, "general.architecture")
    hp = {k.split(".", 1)[1]: field(reader, k) for k in reader.fields if k.startswith(arch)}
    w = {t.name: torch.from_numpy(np.array(t.data, dtype=np.float32)) for t in reader.tensors}
    heads, kv = hp["attention.head_count"], hp["attention.head_count_kv"]
    eps = hp["attention.layer_norm_rms_epsilon"]

    def norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, gain.shape, gain, eps)

    x = w["token_embd.weight"][ids]
    t = len(ids)
    for b in range(hp["block_count"]):
        p = f"blk.{b}."
        h = norm(x, w[p + "attn_norm.weight"])
        q = (h @ w[p + "attn_q.weight"].T).view(t, heads, -1)
        k = (h @ w[p + "attn_k.weight"].T).view(t, kv, -1)
        v = (h @ w[p + "attn_v.weight"].T).view(t, kv, -1)
        if p + "attn_q_norm.weight" in w:
            q, k = norm(q, w[p + "attn_q_norm.weight"]), norm(k, w[p + "attn_k_norm.weight"])
        q, k = rope(q, hp["rope.freq_base"], mode), rope(k, hp["rope.freq_base"], mode)
        k, v = (z.repeat_interleave(heads // kv, dim=1) for z in (k, v))
        att = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
        )
        x = x + att.transpose(0, 1).reshape(t, -1) @ w[p + "attn_output.weight"].T
        h = norm(x, w[p + "ffn_norm.weight"])
        gate = torch.nn.functional.silu(h @ w[p + "ffn_gate.weight"].T)
        x = x + (gate * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    return norm(x, w["output_norm.weight"]) @ w["token_embd.weight"].T


def test_llama_cpp_graph_on_the_file_gives_octlms_logits(run, ours, tiny_dataset) -> None:
    """llama.cpp's computation (in torch, from the file alone) with llama's adjacent-pair RoPE
    gives octlm's logits: the q/k permutation is the one that rotation needs. Control: the same
    file with the other rotation is far off."""
    tok = Tokenizer.load(tiny_dataset / "tokenizer.json")
    ids = [0, *tok.encode("ROMEO:\nWhat light through yonder window breaks?", False)][:CONTEXT]
    with torch.no_grad():
        expected = ours(torch.tensor([ids]))[0]
        got = ggml_logits(exported(run, "f32"), ids, "norm")
        control = ggml_logits(exported(run, "f32"), ids, "neox")
    diff, off = ((x - expected).abs().max().item() for x in (got, control))
    print(f"max |logit diff| llama graph vs octlm: {diff:.3g}, control {off:.3g}")
    assert diff < 1e-4 and off > 0.1


def test_refusals_are_one_line_and_write_nothing(run: Path, ours, tiny_dataset, tmp_path) -> None:
    capped = dataclasses.replace(ours.config, logit_softcap=30.0)
    snap_cap = snapshot(tmp_path / "cap", ours.state_dict(), capped, tiny_dataset)
    vres = dataclasses.replace(ours.config, value_residual=True)
    snap_vres = snapshot(tmp_path / "vres", ours.state_dict(), vres, tiny_dataset)
    taken = tmp_path / "taken.gguf"
    taken.write_bytes(b"keep me")
    (tmp_path / "afile").write_text("x")
    cases = [
        ((snap_cap, tmp_path / "o1.gguf"), "--logit-softcap 30, which no llama.cpp architecture"),
        ((snap_vres, tmp_path / "o2.gguf"), "--value-residual"),
        ((run, taken), "already exists; choose another OUT, or --force"),
        ((run, tmp_path / "o3.bin"), "does not end in .gguf"),
        ((run, tmp_path / "afile" / "o4.gguf"), "which is a file"),
        ((run, run / "inside.gguf"), "run folder"),
        ((tmp_path / "nope", tmp_path / "o5.gguf"), "does not exist"),
    ]
    for args, expected in cases:
        proc = octlm("export", *args, "--format", "gguf", check=False)
        assert_one_error_line(proc, expected)
    proc = octlm("export", run, tmp_path / "o6", "--outtype", "f16", check=False)
    assert_one_error_line(proc, "--outtype is for --format gguf, not hf")
    assert taken.read_bytes() == b"keep me"
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {"cap", "vres", "taken.gguf", "afile"}, left  # no OUT, no temporary file
    assert not list(run.glob("*.gguf"))
    # --force replaces the file, atomically.
    assert main(["export", str(run), str(taken), "--format", "gguf", "--force"]) == 0
    assert gguf.GGUFReader(taken).fields["general.architecture"].contents() == "llama"


def test_llama_cpp_logits_and_greedy_text(run: Path, ours: GPT, tiny_dataset: Path) -> None:
    pytest.importorskip(
        "llama_cpp", reason="llama.cpp is not installed: pip install 'octlm[llama]' compiles it"
    )
    llm = llama(exported(run, "f32"))
    tok = Tokenizer.load(tiny_dataset / "tokenizer.json")
    prompt = "ROMEO:\nWhat light"
    ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
    assert ids == [0, *tok.encode(prompt, add_special_tokens=False)]
    theirs = llama_cpp_logits(llm, ids)
    with torch.no_grad():
        expected = ours(torch.tensor([ids]))[0]
    diff = (theirs - expected).abs().max().item()
    print(f"max |logit diff| llama.cpp vs octlm: {diff:.3g}")
    assert diff < LOGIT_TOLERANCE
    greedy = generate(ours, ids, 24, stop_id=1)
    out = llm(prompt, max_tokens=24, temperature=0.0, top_k=1)["choices"][0]["text"]
    assert out == tok.decode(greedy)


def llama(path: Path):
    """llama.cpp's model of the file (llama-cpp-python), with an f32 key/value cache: llama.cpp
    keeps f16 by default, which alone moves logits by 1e-3."""
    import llama_cpp

    f32 = llama_cpp.GGML_TYPE_F32
    return llama_cpp.Llama(
        str(path), n_ctx=CONTEXT, logits_all=True, verbose=False, type_k=f32, type_v=f32
    )


def llama_cpp_logits(model_or_path, ids: list[int]) -> torch.Tensor:
    """llama.cpp's logits (T, V) of `ids` from one evaluation of the whole sequence."""
    llm = llama(model_or_path) if isinstance(model_or_path, Path) else model_or_path
    llm.reset()
    llm.eval(ids)
    return torch.tensor(np.array(llm.scores[: len(ids)]))


def test_without_the_gguf_package_one_line_names_the_extra(run, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    out = tmp_path / "m.gguf"
    with pytest.raises(OctlmError, match=r"pip install 'octlm\[gguf\]'"):
        export(run, "gguf", out)
    assert not out.exists()
