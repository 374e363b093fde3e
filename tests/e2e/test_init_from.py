"""`octlm train --init-from`: a new run starting from an octlm run or a Hugging Face Llama folder.

Round trips with real processes and real transformers: octlm run -> `octlm export` -> init-from
gives the source's weights bit for bit; a random `LlamaForCausalLM` -> init-from gives
transformers' logits; an init-from run stopped and resumed ends on the straight run's bits (the
source is not read again), and the same run without --init-from ends elsewhere. Bad sources
are one error line with nothing written.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from octlm.cli.main import main
from octlm.config.files import make_config
from octlm.data.shards import ShardDataset
from octlm.generation.trained import load_model
from octlm.runlog.reader import read_log
from octlm.trainer.run import build_run
from tests.e2e.helpers import QUICK_CONTEXT, QUICK_RUN, end_hash, octlm
from tests.hf_folders import DROP, config_variant, corpus_texts
from tests.hf_folders import random_llama as random_llama_folder

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
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("llama") / "random"
    return random_llama_folder(folder), folder  # vocabulary 512: tiny_dataset's


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
    # A --model flag is checked against the checkpoint the resume loads (the source is gone).
    other = ("--model", "tiny", "--steps", "6", "--init-from", str(copy), "--resume")
    refused = train(tiny_dataset, split, *other, check=False)
    lines = refused.stderr.splitlines()
    assert refused.returncode == 1 and len(lines) == 1, refused.stderr  # no traceback
    assert lines[0].startswith("octlm: error: --model tiny contradicts --init-from"), lines
    assert end_hash(split) == end_hash(straight)  # the refused resume changed nothing
    fresh = tmp_path / "fresh"
    train(tiny_dataset, fresh, *args)
    assert end_hash(fresh) != end_hash(straight)
    assert header(fresh)["fingerprints"]["config"] != header(straight)["fingerprints"]["config"]


class _MakesAFile:
    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))  # unpickling this would create the file


# config.json changes octlm's model cannot hold -> what the one error line must say. The base
# is transformers 5's own config.json of `random_llama` (rope_parameters, no top-level rope_theta).
CONFIG_CASES: dict[str, tuple[dict | str, str]] = {
    "heads-missing": ({"num_attention_heads": DROP}, "config.json gives no num_attention_heads"),
    "heads-zero": ({"num_attention_heads": 0}, "num_attention_heads=0 must be a positive integer"),
    "heads-negative": ({"num_attention_heads": -4}, "num_attention_heads=-4 must be a positive"),
    "heads-float": ({"num_attention_heads": 4.0}, "num_attention_heads=4.0 must be a positive"),
    "heads-string": ({"num_attention_heads": "4"}, "num_attention_heads='4' must be a positive"),
    "heads-bool": ({"num_attention_heads": True}, "num_attention_heads=True must be a positive"),
    "kv-heads-zero": ({"num_key_value_heads": 0}, "num_key_value_heads=0 must be a positive"),
    "kv-heads-negative": ({"num_key_value_heads": -2}, "num_key_value_heads=-2 must be a positive"),
    "kv-heads-not-dividing": (
        {"num_key_value_heads": 3},
        "num_attention_heads 4 is not divisible by num_key_value_heads 3",
    ),
    "kv-heads-null-is-heads": (  # transformers reads null as num_attention_heads: 4, not 2
        {"num_key_value_heads": None},
        "layers.0.attention.wk.weight has shape (16, 32), the model (32, 32)",
    ),
    "width-not-divisible": (
        {"hidden_size": 30, "head_dim": DROP},
        "hidden_size 30 is not divisible by num_attention_heads 4",
    ),
    "head-dim-not-the-split": ({"head_dim": 16}, "head_dim=16 x 4 heads is not hidden_size=32"),
    "head-dim-odd": (
        {"hidden_size": 36, "head_dim": DROP},
        "the head size hidden_size / num_attention_heads = 9 is odd",
    ),
    "vocab-missing": ({"vocab_size": DROP}, "config.json gives no vocab_size"),
    "vocab-zero": ({"vocab_size": 0}, "vocab_size=0 must be a positive integer"),
    "vocab-float": ({"vocab_size": 512.0}, "vocab_size=512.0 must be a positive integer"),
    "vocab-string": ({"vocab_size": "512"}, "vocab_size='512' must be a positive integer"),
    "vocab-absurd": ({"vocab_size": 10**12}, "the model (1000000000000, 32)"),
    "vocab-not-the-weights": ({"vocab_size": 300}, "tok_embeddings.weight has shape (512, 32)"),
    "width-zero": ({"hidden_size": 0}, "hidden_size=0 must be a positive integer"),
    "width-null": ({"hidden_size": None}, "config.json gives no hidden_size"),
    "width-absurd": ({"hidden_size": 2**40, "head_dim": DROP}, "sizes fit no model"),
    "layers-negative": ({"num_hidden_layers": -2}, "num_hidden_layers=-2 must be a positive"),
    "layers-bool": ({"num_hidden_layers": True}, "num_hidden_layers=True must be a positive"),
    "layers-fewer": ({"num_hidden_layers": 1}, "num_hidden_layers=1, but the weights hold 2"),
    "layers-absurd": ({"num_hidden_layers": 10**9}, "=1000000000, but the weights hold 2 layers"),
    "ffn-string": ({"intermediate_size": "64"}, "intermediate_size='64' must be a positive"),
    "ffn-absurd": ({"intermediate_size": 10**12}, "1000000000000)"),
    "context-zero": ({"max_position_embeddings": 0}, "max_position_embeddings=0 must be"),
    "context-float": ({"max_position_embeddings": 64.5}, "max_position_embeddings=64.5 must be"),
    "rope-scaling-linear": (
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        "rope_scaling has rope_type 'linear', which octlm cannot reproduce",
    ),
    "rope-scaling-dynamic": (
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        "rope_scaling has rope_type 'dynamic'",
    ),
    "rope-scaling-llama3": (
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}},
        "rope_scaling has rope_type 'llama3'",
    ),
    "rope-scaling-yarn": (
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
        "rope_scaling has rope_type 'yarn'",
    ),
    "rope-scaling-unknown": ({"rope_scaling": {"rope_type": "zigzag"}}, "rope_type 'zigzag'"),
    "rope-scaling-untyped": ({"rope_scaling": {"factor": 2.0}}, "rope_scaling has no rope_type"),
    "rope-scaling-string": ({"rope_scaling": "linear"}, "rope_scaling='linear' must be null or"),
    "rope-parameters-llama3": (
        {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}},
        "rope_parameters has rope_type 'llama3'",
    ),
    "rope-parameters-per-layer": (
        {"rope_parameters": {"full_attention": {"rope_type": "default"}}},
        "rope_parameters is given per layer type",
    ),
    "rope-partial-rotary": ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    "rope-theta-zero": (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
        "rope_parameters.rope_theta=0 must be positive and finite",
    ),
    "rope-theta-negative": (
        {"rope_theta": -1.0, "rope_parameters": None},
        "rope_theta=-1.0 must be positive and finite",
    ),
    "rope-theta-nan": ({"rope_theta": math.nan}, "rope_theta=nan must be positive and finite"),
    "rope-theta-infinite": ({"rope_theta": math.inf}, "rope_theta=inf must be positive and"),
    "rope-theta-string": ({"rope_theta": "1e4", "rope_parameters": DROP}, "rope_theta='1e4'"),
    "rope-theta-disagrees": ({"rope_theta": 5e5}, "rope_parameters.rope_theta=10000.0 disagree"),
    "untied": ({"tie_word_embeddings": False}, "tie_word_embeddings=False"),
    "tie-missing": ({"tie_word_embeddings": DROP}, "tie_word_embeddings=False"),
    "tie-string": ({"tie_word_embeddings": "true"}, "tie_word_embeddings='true'"),
    "bias": ({"attention_bias": True}, "attention_bias=True"),
    "mistral": ({"model_type": "mistral"}, "model_type='mistral'"),
    "architectures-other": ({"architectures": ["MistralForCausalLM"]}, "['MistralForCausalLM']"),
    "architectures-string": ({"architectures": "LlamaForCausalLM"}, "architectures='Llama"),
    "gelu": ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    "eps-zero": ({"rms_norm_eps": 0}, "rms_norm_eps=0 must be positive and finite"),
    "not-json": ("{not json", "config.json is not readable JSON"),
    "empty-file": ("", "config.json is not readable JSON"),
    "not-an-object": ("[1, 2]", "config.json is not a JSON object"),
}


def _damaged_copy(source: Path, tmp: Path, name: str) -> Path:
    """A copy of the octlm run `source`: its newest checkpoint with one bit flipped
    ("bad-checksum"), its checkpoint list garbled ("latest-corrupt"), or its checkpoints gone
    (only the log left: "no-checkpoint")."""
    copy = tmp / name
    shutil.copytree(source, copy)
    newest = sorted((copy / "checkpoints").glob("step_*.safetensors"))[-1]
    if name == "bad-checksum":
        data = bytearray(newest.read_bytes())
        data[-1] ^= 1
        newest.write_bytes(bytes(data))
    elif name == "latest-corrupt":
        (copy / "checkpoints" / "latest.json").write_text("{oops")
    else:
        shutil.rmtree(copy / "checkpoints")
    return copy


def _hf_weights_only(random_folder: Path, tmp: Path, name: str) -> Path:
    """Hugging Face weights without their config.json: the folder ("weights-no-config"), the
    file, or a shard index naming shards outside the folder or missing."""
    folder = tmp / name
    folder.mkdir()
    shutil.copy(random_folder / "model.safetensors", folder / "model-00001-of-00001.safetensors")
    if name == "weights-no-config":
        (folder / "model-00001-of-00001.safetensors").rename(folder / "model.safetensors")
        return folder
    if name == "weights-file-no-config":
        return folder / "model-00001-of-00001.safetensors"
    shutil.copy(random_folder / "config.json", folder / "config.json")
    shard = {"index-outside": "../random/model.safetensors", "index-missing": "model-2.safetensors"}
    weight_map = ["a"] if name == "index-not-a-map" else {"model.norm.weight": shard[name]}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def _pickles(tmp: Path, name: str) -> Path:
    """A pickle that would create a file if unpickled, alone or in a folder, with or without a
    config.json ("pickle-file", "only-pytorch_model.bin", "only-model.pt", ...)."""
    pickled = tmp / "model.bin"
    pickled.write_bytes(pickle.dumps(_MakesAFile(tmp / "unpickled")))
    if name == "pickle-file":
        return pickled
    folder = tmp / name
    folder.mkdir()
    shutil.copy(pickled, folder / name.removeprefix("only-"))
    return folder


SOURCE_CASES = {
    "missing": "does not exist; name an octlm run folder or checkpoint, or a LlamaForCausalLM",
    "empty-string": "--init-from '' must be a non-empty path",
    "text-file": "text.txt is not a readable checkpoint",
    "corrupt-safetensors": "corrupt.safetensors is not a readable checkpoint",
    "empty-folder": "holds no checkpoints/ (an octlm run) and no config.json",
    "pickle-file": "model.bin is a pickle file: octlm never unpickles (it could run code); "
    "convert it to safetensors",
    "only-pytorch_model.bin": "pytorch_model.bin is a pickle file",
    "only-model.pt": "model.pt is a pickle file",
    "only-model.pth": "model.pth is a pickle file",
    "only-last.ckpt": "last.ckpt is a pickle file",
    "bin-with-config": "pytorch_model.bin is a pickle file",
    "weights-no-config": "holds Hugging Face weights but no config.json",
    "weights-file-no-config": "is a safetensors file without octlm's header",
    "index-not-a-map": "weight_map must map tensor names to shard files in its folder",
    "index-outside": "weight_map must map tensor names to shard files in its folder",
    "index-missing": "model-2.safetensors is missing",
    "no-checkpoint": "holds no checkpoint; name a checkpoint file of the run",
    "bad-checksum": "fails its checksum (it is damaged); name another checkpoint of the run",
    "latest-corrupt": "latest.json is corrupt; name a checkpoint file of the run",
    "vocab": "has a vocabulary of 300 tokens, the data's tokenizer 512",
    "tokenizer": "the data's tokenizer (",
    "preset": "--model tiny contradicts",
}
GOLDEN_RUN = Path(__file__).parents[1] / "golden" / "v1-micro" / "run"  # vocabulary 300


def _source_case(name: str, tmp: Path, random_folder: Path, source: Path) -> str:
    if name in ("missing", "empty-string", "text-file", "corrupt-safetensors", "empty-folder"):
        (tmp / "text.txt").write_text("not a checkpoint")
        (tmp / "corrupt.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
        (tmp / "empty-folder").mkdir()
        paths = {"missing": "nope", "empty-string": "", "text-file": "text.txt"}
        paths |= {"corrupt-safetensors": "corrupt.safetensors", "empty-folder": "empty-folder"}
        return str(tmp / paths[name]) if paths[name] else ""
    if name == "pickle-file" or name.startswith("only-"):
        return str(_pickles(tmp, name))
    if name == "bin-with-config":
        folder = _pickles(tmp, "only-pytorch_model.bin")
        shutil.copy(random_folder / "config.json", folder / "config.json")
        return str(folder)
    if name.startswith(("weights-", "index-")):
        return str(_hf_weights_only(random_folder, tmp, name))
    if name in ("no-checkpoint", "bad-checksum", "latest-corrupt"):
        return str(_damaged_copy(source, tmp, name))
    if name == "tokenizer":  # a tokenizer.json beside the weights that is not the data's
        folder = config_variant(random_folder, tmp / name, {})
        shutil.copy(GOLDEN_RUN.parent / "data" / "tokenizer.json", folder / "tokenizer.json")
        return str(folder)
    return str(GOLDEN_RUN if name == "vocab" else source)


def assert_refused(argv: list[str], out: Path, expected: str, capsys) -> None:
    """The command exits 1 with one line, `octlm: error: ...` holding `expected`, no traceback,
    and --out is not created."""
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("octlm: error: "), lines
    assert expected in lines[0], lines[0]
    assert "Traceback" not in err and not out.exists()


def train_argv(data: Path, out: Path, source: str, *extra: str) -> list[str]:
    return ["train", "--data", str(data), "--out", str(out), *RUN, *extra, "--init-from", source]


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_config_json_octlm_cannot_hold_is_one_error_line(
    case, random_llama, tiny_dataset, tmp_path, capsys
) -> None:
    change, expected = CONFIG_CASES[case]
    folder = config_variant(random_llama[1], tmp_path / case, change)
    out = tmp_path / "out"
    assert_refused(train_argv(tiny_dataset, out, str(folder)), out, expected, capsys)


@pytest.mark.parametrize("case", list(SOURCE_CASES))
def test_bad_sources_are_one_error_line_and_write_nothing(
    case, random_llama, source, tiny_dataset, tmp_path, capsys
) -> None:
    path = _source_case(case, tmp_path, random_llama[1], source)
    out = tmp_path / "out"
    model = ("--model", "tiny") if case == "preset" else ()
    assert_refused(train_argv(tiny_dataset, out, path, *model), out, SOURCE_CASES[case], capsys)
    assert not (tmp_path / "unpickled").exists()  # a pickle is never opened as one


def test_a_config_files_preset_yields_to_the_source(source, tiny_dataset, tmp_path) -> None:
    """`--config tiny` (a preset among the settings the user wants) with a micro source: the
    source decides the shape. Only a `--model` flag that contradicts the source is refused."""
    out = tmp_path / "tuned"
    quick = ("--context", str(CONTEXT), "--steps", "2", "--warmup", "1", "--val-every", "0")
    quick += ("--ckpt-every", "0", "--no-progress")
    octlm("train", "--config", "tiny", "--data", str(tiny_dataset), "--out", str(out), *quick,
          "--init-from", str(source))  # fmt: skip
    first = header(out)
    assert first["config"]["model"] == "tiny" and first["config"]["lr"] == 3e-3  # the config's
    source_shape = header(source)["model_config"]
    assert first["model_config"] == {**source_shape, "context": CONTEXT}
    assert first["init_from"]["weights_sha256"] == end_hash(source)


def test_a_sweep_checks_a_model_flag_against_the_source_once(
    source, tiny_dataset, tmp_path, capsys
) -> None:
    """A sweep's runs read a config file whose preset yields to the source, so the sweep checks
    a `--model` flag itself, before any run starts."""
    out = tmp_path / "sw"
    args = ["sweep", "--data", str(tiny_dataset), "--out", str(out), *RUN, "--model", "tiny"]
    args += ["--init-from", str(source), "--grid", "lr=1e-3,3e-3"]
    assert_refused(args, out, "--model tiny contradicts --init-from", capsys)


def pairs_jsonl(path: Path, n: int) -> Path:
    """`n` short prompt/completion pairs (a few words each: they fit a 32-token context)."""
    words = [text.split()[:6] for text in corpus_texts(n, seed=1)]
    rows = [{"prompt": " ".join(w[:3]) + "\n", "completion": " ".join(w[3:])} for w in words]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_verify_resume_verifies_a_fine_tune_of_a_source_of_another_shape(
    source, tiny_dataset, tmp_path, capsys
) -> None:
    """The flagship check on a fine-tune: masked prompt/completion data, --init-from a micro
    run (not the default preset's shape). Its runs read a config file naming a preset, which
    yields to the source; a contradicting --model flag is still one error line, before any run."""
    sft = tmp_path / "sft"
    octlm("prepare", str(pairs_jsonl(tmp_path / "pairs.jsonl", 300)), "--format",
          "prompt-completion", "--tokenizer", str(tiny_dataset / "tokenizer.json"),
          "--context", str(CONTEXT), "--out", str(sft))  # fmt: skip
    args = ["verify-resume", "--data", str(sft), "--init-from", str(source), *RUN, "--steps", "4"]
    args += ["--order", "epoch", "--split", "2", "--workdir", str(tmp_path)]
    proc = octlm(*args)
    lines = proc.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[1:3]] == ["straight", "split@2"]
    assert lines[2].rstrip().endswith("identical") and lines[-1].startswith("identical:")
    refused = "--model tiny contradicts --init-from"
    assert_refused([*args, "--model", "tiny"], tmp_path / "none", refused, capsys)
    assert not any(p.name.startswith("octlm-verify-") for p in tmp_path.iterdir())


def test_an_exported_safetensors_folder_is_a_source(source, tmp_path) -> None:
    """`octlm export --format safetensors RUN OUT` writes OUT/model.safetensors with octlm's
    header and no config.json: OUT is read as that snapshot."""
    from octlm.trainer.init_from import read_source

    octlm("export", str(source), str(tmp_path / "weights"), "--format", "safetensors")
    read = read_source(str(tmp_path / "weights"))
    assert read.record["kind"] == "octlm" and read.record["weights_sha256"] == end_hash(source)
