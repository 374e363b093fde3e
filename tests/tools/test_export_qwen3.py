"""`octlm export` of a model with --qk-norm: a Qwen3ForCausalLM folder, loaded back by
`transformers` offline and read back by `--init-from`; a model with --logit-softcap is refused.

The models are built here (micro shape, vocabulary 512) with every norm gain drawn far from 1,
so a q/k norm that is missing, left at 1, or on the wrong side shows in the logits; each is
written as an octlm snapshot and exported by the CLI. A Qwen3 config.json octlm cannot hold is
one error line naming its key.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from octlm.cli.main import main
from octlm.config.files import make_config
from octlm.config.shape import ModelConfig, preset
from octlm.data.shards import ShardDataset
from octlm.hashing import file_sha256, weights_sha256
from octlm.model.gpt import GPT
from octlm.trainer import checkpoint as ckpt
from octlm.trainer.init_from import read_source
from octlm.trainer.run import build_run
from tests.e2e.helpers import QUICK_RUN, octlm
from tests.hf_folders import DROP, config_variant, random_qwen3

pytestmark = pytest.mark.slow  # the exports start `python -m octlm`
os.environ["HF_HUB_OFFLINE"] = "1"  # loading must never reach the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

CONTEXT = 64
# init_std 0.1: logits of a few units, so the controls' differences are far from rounding.
QK = preset("micro", vocab_size=512, init_std=0.1, qk_norm=True)


def random_model(config: ModelConfig, seed: int = 0) -> GPT:
    """`config`'s model with normal weights and every norm gain drawn in [0.5, 2] (seeded)."""
    model = GPT(config).eval()
    generator = torch.Generator().manual_seed(seed)
    model.init_weights(generator)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("norm.weight"):
                weight.uniform_(0.5, 2.0, generator=generator)
    return model


def snapshot(folder: Path, weights: dict[str, torch.Tensor], config: ModelConfig, data: Path):
    """An octlm snapshot of `weights` as a run on `data` would write it (its tokenizer's
    fingerprint, its data_dir), so `octlm export` finds the run's tokenizer."""
    meta = {"model_config": config.to_dict(), "data_dir": str(data)}
    meta["fingerprints"] = {"tokenizer": file_sha256(data / "tokenizer.json")}
    tensors = {name: t.detach().contiguous() for name, t in weights.items()}
    return ckpt.save_snapshot(folder, 0, tensors, ckpt.snapshot_header(meta))


@pytest.fixture(scope="module")
def ours() -> GPT:
    return random_model(QK)


@pytest.fixture(scope="module")
def qwen_dir(ours: GPT, tiny_dataset: Path, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("qwen3")
    snap = snapshot(root / "run", ours.state_dict(), QK, tiny_dataset)
    octlm("export", str(snap), str(root / "hf"))
    return root / "hf"


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def val_batch(tiny_dataset: Path) -> torch.Tensor:
    """Two windows of real validation tokens, (2, CONTEXT)."""
    val = ShardDataset.open(tiny_dataset).val
    return torch.stack([torch.from_numpy(val.window(s, CONTEXT)) for s in (0, len(val) // 2)])


def test_qwen3_folder_holds_qwen3_config_and_norms(qwen_dir: Path) -> None:
    cfg = json.loads((qwen_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert (cfg["head_dim"], cfg["hidden_size"], cfg["num_attention_heads"]) == (8, 32, 4)
    assert cfg["num_key_value_heads"] == 2 and cfg["max_position_embeddings"] == CONTEXT
    assert cfg["attention_bias"] is False and cfg["tie_word_embeddings"] is True
    assert cfg["use_sliding_window"] is False and cfg["sliding_window"] is None
    assert cfg["layer_types"] == ["full_attention"] * QK.n_layers
    assert (cfg["rope_theta"], cfg["rms_norm_eps"]) == (QK.rope_base, QK.norm_eps)
    assert "mlp_bias" not in cfg  # Qwen3's MLP has no such option
    with safe_open(str(qwen_dir / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())  # noqa: SIM118
    assert "lm_head.weight" not in names and len(names) == 2 + 11 * QK.n_layers
    for i in range(QK.n_layers):
        for norm in ("q_norm", "k_norm"):
            assert f"model.layers.{i}.self_attn.{norm}.weight" in names


def qwen3_model(transformers, folder: Path, attn: str):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation=attn)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.dtype == torch.float32
    return model.eval()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_logits_match_octlm(transformers, qwen_dir, ours, val_batch, attn) -> None:
    model = qwen3_model(transformers, qwen_dir, attn)
    with torch.no_grad():
        expected, got = ours(val_batch), model(val_batch).logits
    diff = (expected - got).abs().max().item()
    print(f"max |logit diff| ({attn}): {diff:.3g}; logits up to {expected.abs().max():.3g}")
    assert diff < 1e-4

    # Controls: the q and k gains swapped, then both at 1 (a norm without its gain), must show.
    attns = [layer.self_attn for layer in model.model.layers]
    with torch.no_grad():
        for a in attns:
            q, k = a.q_norm.weight.clone(), a.k_norm.weight.clone()
            a.q_norm.weight.copy_(k), a.k_norm.weight.copy_(q)
        swapped = (expected - model(val_batch).logits).abs().max().item()
        for a in attns:
            a.q_norm.weight.fill_(1.0), a.k_norm.weight.fill_(1.0)
        unit = (expected - model(val_batch).logits).abs().max().item()
    print(f"controls ({attn}): q/k gains swapped {swapped:.3g}, gains at 1 {unit:.3g}")
    assert swapped > 0.1 and unit > 0.1


def test_the_same_weights_without_the_norms_do_not_match(
    transformers, ours, tiny_dataset, val_batch, tmp_path
) -> None:
    """Control: the weights exported without their q/k norms (a Llama folder) give other logits,
    so the match above is the norms' doing."""
    plain = dataclasses.replace(QK, qk_norm=False)
    weights = {
        n: t for n, t in ours.state_dict().items() if "q_norm" not in n and "k_norm" not in n
    }
    octlm(
        "export",
        str(snapshot(tmp_path / "run", weights, plain, tiny_dataset)),
        str(tmp_path / "hf"),
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        diff = (ours(val_batch) - model(val_batch).logits).abs().max().item()
    print(f"control, q/k norms dropped: {diff:.3g}")
    assert diff > 0.1


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ({"logit_softcap": 15.0}, "uses --logit-softcap 15, which no Hugging Face architecture"),
        ({"value_residual": True}, "uses --value-residual (each block attends with the mean"),
    ],
    ids=["softcap", "value-residual"],
)
def test_a_model_no_architecture_computes_is_refused_in_one_line(
    tiny_dataset, tmp_path, option, says
) -> None:
    capped = dataclasses.replace(QK, qk_norm=False, **option)
    snap = snapshot(tmp_path / "run", random_model(capped).state_dict(), capped, tiny_dataset)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("keep me")
    for out, extra in ((tmp_path / "hf", ()), (busy, ("--force",))):
        proc = octlm("export", str(snap), str(out), *extra, check=False)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("octlm: error: "), proc.stderr
        assert says in lines[0]
        assert "export a model trained without it" in lines[0]
    assert not (tmp_path / "hf").exists() and [p.name for p in busy.iterdir()] == ["keep.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    # octlm's own format holds any model.
    assert (
        main(["export", str(snap), "--format", "safetensors", str(tmp_path / "w.safetensors")]) == 0
    )


def step0_model(data: Path, init_from: Path, out: Path) -> GPT:
    """The model a new --init-from run starts its first step with (built in this process)."""
    cfg = make_config(data=str(data), out=str(out), init_from=str(init_from), context=CONTEXT)
    return build_run(cfg.replace(dtype="fp32", device="cpu")).model.eval()


def test_init_from_the_export_starts_on_the_same_model(
    qwen_dir, ours, tiny_dataset, val_batch, tmp_path
) -> None:
    source = read_source(str(qwen_dir))
    assert source.shape == QK.to_dict() and source.record["kind"] == "hf"
    assert source.record["weights_sha256"] == weights_sha256(ours.state_dict())
    model = step0_model(tiny_dataset, qwen_dir, tmp_path / "built")
    assert model.config.qk_norm is True
    with torch.no_grad():
        assert torch.equal(model(val_batch), ours(val_batch))  # bitwise, fp32 CPU


@pytest.fixture(scope="module")
def random_qwen(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("qwen3") / "random"
    return random_qwen3(folder), folder  # vocabulary 512: tiny_dataset's


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_random_transformers_qwen3_gives_its_logits(
    random_qwen, tiny_dataset, val_batch, tmp_path, attn
) -> None:
    hf, folder = random_qwen
    hf.set_attn_implementation(attn)
    model = step0_model(tiny_dataset, folder, tmp_path / "built")
    assert model.config.qk_norm is True
    with torch.no_grad():
        diff = (model(val_batch) - hf(val_batch).logits).abs().max().item()
    print(f"max |logit difference| octlm vs transformers Qwen3 ({attn}): {diff:.3g}")
    assert diff < 1e-5


# Qwen3 config.json changes octlm's model cannot hold -> what the one error line must say. The
# base is transformers' own config.json of `random_qwen3`.
QWEN3_CASES: dict[str, tuple[dict, str]] = {
    "untied": ({"tie_word_embeddings": False}, "tie_word_embeddings=False (octlm's model needs"),
    "tie-missing": ({"tie_word_embeddings": DROP}, "tie_word_embeddings=False"),
    "sliding-window": ({"use_sliding_window": True}, "use_sliding_window=True"),
    "sliding-layers": (
        {"layer_types": ["full_attention", "sliding_attention"]},
        "layer_types=['full_attention', 'sliding_attention']",
    ),
    "bias": ({"attention_bias": True}, "attention_bias=True"),
    "head-dim-not-the-split": ({"head_dim": 16}, "head_dim=16 x 4 heads is not hidden_size=32"),
    "head-dim-missing": (
        {"head_dim": DROP},
        "gives no head_dim, and Qwen3's default 128 x 4 heads is not hidden_size=32",
    ),
    "model-type-llama": (
        {"model_type": "llama"},
        "model_type='llama' (octlm's model needs 'qwen3')",
    ),
    "gelu": ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    "architectures-other": ({"architectures": ["Qwen2ForCausalLM"]}, "['Qwen2ForCausalLM'] is not"),
}


def assert_refused(data: Path, folder: Path, out: Path, expected: str, capsys) -> None:
    """`octlm train --init-from folder` exits 1 with one line holding `expected`, writing no
    --out."""
    argv = ["train", "--data", str(data), "--out", str(out), *QUICK_RUN]
    assert main([*argv, "--init-from", str(folder)]) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("octlm: error: "), lines
    assert expected in lines[0], lines[0]
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("case", list(QWEN3_CASES))
def test_a_qwen3_config_octlm_cannot_hold_is_one_error_line(
    case, random_qwen, tiny_dataset, tmp_path, capsys
) -> None:
    change, expected = QWEN3_CASES[case]
    folder = config_variant(random_qwen[1], tmp_path / case, change)
    assert_refused(tiny_dataset, folder, tmp_path / "out", expected, capsys)


def test_qwen3_weights_without_their_norms_are_one_error_line(
    random_qwen, tiny_dataset, tmp_path, capsys
) -> None:
    folder = config_variant(random_qwen[1], tmp_path / "no-norms", {})
    weights = load_file(folder / "model.safetensors")
    kept = {n: t for n, t in weights.items() if "q_norm" not in n and "k_norm" not in n}
    save_file(kept, str(folder / "model.safetensors"), metadata={"format": "pt"})
    expected = "the Qwen3 weights do not fit the model (extra [], missing ['model.layers.0.self"
    assert_refused(tiny_dataset, folder, tmp_path / "out", expected, capsys)
