"""`octlm train --init-from`: a new run starting from an octlm run or a Hugging Face Llama folder.

Round trips with real processes and real transformers: octlm run -> `octlm export` -> init-from
gives the source's weights bit for bit; a random `LlamaForCausalLM` -> init-from gives
transformers' logits; an init-from run stopped and resumed ends on the straight run's bits (the
source is not read again), and the same run without --init-from ends elsewhere. Bad sources
are one error line with nothing written.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from octlm.cli import main
from octlm.config_files import make_config
from octlm.data.shards import ShardDataset
from octlm.load import load_model
from octlm.runlog import read_log
from octlm.train.run import build_run
from tests.e2e.helpers import QUICK_CONTEXT, QUICK_RUN, end_hash, octlm

pytestmark = pytest.mark.slow
os.environ["HF_HUB_OFFLINE"] = "1"  # loading must never reach the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"
CONTEXT, RUN = QUICK_CONTEXT, QUICK_RUN


def train(data: Path, out: Path, *extra: str, check: bool = True):
    return octlm("train", "--data", str(data), "--out", str(out), *RUN, *extra, check=check)


def header(run: Path) -> dict:
    return read_log(run / "log.jsonl")[0]


@pytest.fixture(scope="module")
def source(tiny_dataset: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("init") / "source"
    train(tiny_dataset, out, "--model", "micro", "--steps", "6")
    return out


@pytest.fixture(scope="module")
def hf_dir(source: Path) -> Path:
    out = source.parent / "hf"
    octlm("export", str(source), str(out))
    return out


@pytest.fixture(scope="module")
def val_batch(tiny_dataset: Path) -> torch.Tensor:
    val = ShardDataset.open(tiny_dataset).val
    return torch.stack([torch.from_numpy(val.window(s, CONTEXT)) for s in (0, len(val) // 2)])


def step0_model(data: Path, init_from: Path, out: Path):
    """The model a new --init-from run starts its first step with (built in this process)."""
    cfg = make_config(data=str(data), out=str(out), init_from=str(init_from), context=CONTEXT)
    return build_run(cfg.replace(dtype="fp32", device="cpu")).model.eval()


def test_export_round_trip_starts_on_the_source_weights(
    source, hf_dir, tiny_dataset, val_batch, tmp_path
) -> None:
    ours = load_model(source)[0]
    model = step0_model(tiny_dataset, hf_dir, tmp_path / "built")
    with torch.no_grad():
        assert torch.equal(model(val_batch), ours(val_batch))  # bitwise, fp32 CPU
    out = tmp_path / "from-hf"
    train(tiny_dataset, out, "--init-from", str(hf_dir), "--steps", "2")
    record = header(out)["init_from"]
    assert record["kind"] == "hf" and record["path"] == str(hf_dir)
    assert record["weights_sha256"] == end_hash(source)  # the source run's final weights


@pytest.fixture(scope="module")
def random_llama(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("llama") / "random"
    model.save_pretrained(folder)
    return model, folder


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_random_transformers_llama_gives_its_logits(
    random_llama, tiny_dataset, val_batch, tmp_path, attn
) -> None:
    hf, folder = random_llama
    hf.set_attn_implementation(attn)
    model = step0_model(tiny_dataset, folder, tmp_path / "built")
    with torch.no_grad():
        diff = (model(val_batch) - hf(val_batch).logits).abs().max().item()
    print(f"max |logit difference| octlm vs transformers ({attn}): {diff:.3g}")
    assert diff < 1e-5


def test_resumed_init_from_run_is_bit_exact_and_differs_from_a_fresh_one(
    source, tiny_dataset, tmp_path
) -> None:
    args = ("--model", "micro", "--steps", "6")
    straight = tmp_path / "straight"
    train(tiny_dataset, straight, *args, "--init-from", str(source))
    record = header(straight)["init_from"]
    assert record["kind"] == "octlm" and record["weights_sha256"] == end_hash(source)
    # The split run starts from a copy that is gone by the resume: the resume reads only its
    # own checkpoint, which records the source.
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    split = tmp_path / "split"
    train(tiny_dataset, split, *args, "--init-from", str(copy), "--stop-at", "3")
    shutil.rmtree(copy)
    proc = train(tiny_dataset, split, *args, "--init-from", str(copy), "--resume")
    assert "it wins, --init-from" in proc.stderr
    assert end_hash(split) == end_hash(straight)
    fresh = tmp_path / "fresh"
    train(tiny_dataset, fresh, *args)
    assert end_hash(fresh) != end_hash(straight)
    assert header(fresh)["fingerprints"]["config"] != header(straight)["fingerprints"]["config"]


class _MakesAFile:
    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))  # unpickling this would create the file


def _bad_sources(tmp: Path, random_folder: Path) -> dict[str, tuple[Path, str]]:
    pickled = tmp / "model.bin"
    pickled.write_bytes(pickle.dumps(_MakesAFile(tmp / "unpickled")))
    corrupt = tmp / "corrupt.safetensors"
    corrupt.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    bin_only = tmp / "bin_only"
    bin_only.mkdir()
    (bin_only / "config.json").write_text((random_folder / "config.json").read_text())
    shutil.copy(pickled, bin_only / "pytorch_model.bin")
    cases = {"missing": (tmp / "nope", "does not exist"), "pickle": (pickled, "pickle file")}
    cases |= {"corrupt": (corrupt, "not a readable"), "bin_only": (bin_only, "pickle file")}
    for name, change, expected in [
        ("untied", {"tie_word_embeddings": False}, "tie_word_embeddings=False"),
        ("bias", {"attention_bias": True}, "attention_bias=True"),
        ("mistral", {"model_type": "mistral"}, "model_type='mistral'"),
        ("scaling", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
        ("vocab", {"vocab_size": 300}, "vocabulary of 300 tokens"),
    ]:
        folder = tmp / name
        shutil.copytree(random_folder, folder)
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **change}))
        cases[name] = (folder, expected)
    return cases


def test_bad_sources_are_one_error_line_and_write_nothing(
    random_llama, source, tiny_dataset, tmp_path, capsys
) -> None:
    cases = _bad_sources(tmp_path, random_llama[1])
    cases["preset"] = (source, "--model tiny contradicts")
    for name, (path, expected) in cases.items():
        out = tmp_path / f"out-{name}"
        model = ("--model", "tiny") if name == "preset" else ()
        argv = ["train", "--data", str(tiny_dataset), "--out", str(out), *RUN, *model]
        assert main([*argv, "--init-from", str(path)]) == 1, name
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("octlm: error: "), (name, lines)
        assert expected in lines[0], (name, lines[0])
        assert not out.exists(), name
    assert not (tmp_path / "unpickled").exists()  # the pickle was never opened as one
