"""octlm.generation.trained, a trained run opened for use: the model of a run folder, a
checkpoint file or a weights-only snapshot gives the trained model's logits exactly; its
tokenizer and dataset are found through the checkpoint's data folder and checked by
fingerprint; bad input is one line.

The run is made in-process: a micro model's weights written with `save_checkpoint` and
`save_snapshot`, as the trainer writes them, next to the shared tiny dataset.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from octlm.cli.main import main
from octlm.config.shape import preset
from octlm.data.shards import ShardDataset
from octlm.errors import OctlmError
from octlm.generation.trained import (
    load_model,
    load_weights,
    run_dataset,
    run_tokenizer,
    tokenizer_file,
)
from octlm.hashing import weights_sha256
from octlm.model.gpt import GPT
from octlm.trainer.checkpoint import (
    CheckpointError,
    parse_info,
    save_checkpoint,
    save_snapshot,
    snapshot_header,
)

STEP = 3


@pytest.fixture(scope="module")
def trained(tiny_dataset: Path, tmp_path_factory) -> tuple[GPT, Path]:
    """A micro model with perturbed weights (nothing in it is at its initial value), and the
    run folder that holds its checkpoint and snapshot."""
    torch.manual_seed(7)
    model = GPT(preset("micro", vocab_size=512)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    run = tmp_path_factory.mktemp("load") / "run"
    dataset = ShardDataset.open(tiny_dataset)
    meta = {
        "model_config": model.config.to_dict(),
        "fingerprints": {"tokenizer": dataset.tokenizer_fingerprint},
        "data_dir": str(tiny_dataset),
        "train_state": {"step": STEP},
    }
    weights = model.state_dict()
    tensors = {f"model.{k}": v for k, v in weights.items()}
    tensors["optim.0.exp_avg"] = torch.ones(4)
    save_checkpoint(run, STEP, meta, tensors)
    save_snapshot(run, STEP, weights, snapshot_header(meta))
    return model, run


def sources(run: Path) -> dict[str, Path]:
    name = f"step_{STEP:06d}.safetensors"
    return {
        "folder": run,
        "checkpoint": run / "checkpoints" / name,
        "snapshot": run / "snapshots" / name,
    }


@pytest.mark.parametrize("kind", ["folder", "checkpoint", "snapshot"])
def test_the_loaded_model_gives_the_trained_logits(trained, kind: str) -> None:
    model, run = trained
    source = sources(run)[kind]
    loaded, meta = load_model(source)
    x = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert not loaded.training and next(loaded.parameters()).device.type == "cpu"
    expected = sources(run)["checkpoint"] if kind == "folder" else source
    assert meta.path == expected and meta.step == STEP


def test_weights_come_back_under_the_model_names_only(trained) -> None:
    model, run = trained
    _, weights = load_weights(run)
    assert weights.keys() == model.state_dict().keys()  # no "model." prefix, no optimizer
    assert weights_sha256(weights) == weights_sha256(model.state_dict())


def test_tokenizer_and_dataset_are_found_through_the_data_folder(trained, tiny_dataset) -> None:
    meta = load_weights(trained[1])[0]
    dataset = run_dataset(meta)
    assert dataset.root == tiny_dataset
    tokenizer = run_tokenizer(meta)
    assert tokenizer.fingerprint == meta.fingerprints["tokenizer"]
    assert tokenizer_file(meta) == tiny_dataset / "tokenizer.json"
    assert run_dataset(meta, data=tiny_dataset).root == tiny_dataset  # --data names it too


def test_a_wrong_or_missing_tokenizer_is_one_line(trained, tiny_dataset, tmp_path) -> None:
    meta = load_weights(trained[1])[0]
    other = tmp_path / "tokenizer.json"  # the same vocabulary, other bytes
    other.write_text((tiny_dataset / "tokenizer.json").read_text() + "\n")
    with pytest.raises(OctlmError) as info:
        tokenizer_file(meta, other)
    assert "is not the tokenizer the run trained with" in info.value.message
    assert "\n" not in info.value.message
    with pytest.raises(OctlmError, match="is missing"):
        tokenizer_file(meta, tmp_path / "nope.json")
    with pytest.raises(CheckpointError, match="records no tokenizer fingerprint"):
        tokenizer_file(parse_info(meta.path, {**meta.as_written(), "fingerprints": {}}))
    # trained on other ids
    other_ids = {**meta.as_written(), "fingerprints": {"tokenizer": "0" * 64}}
    other_run = parse_info(meta.path, other_ids)
    with pytest.raises(OctlmError, match="were written with tokenizer"):
        run_dataset(other_run)


def test_what_is_not_a_trained_run_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        load_model(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope")
    save_snapshot(tmp_path, 1, {"w": torch.zeros(2)}, {"format": "octlm-snapshot"})
    with pytest.raises(CheckpointError, match="holds no model config"):
        load_model(tmp_path / "snapshots" / "step_000001.safetensors")


def test_hash_eval_and_generate_open_the_run_through_load(trained, capsys) -> None:
    model, run = trained
    assert main(["hash", str(run)]) == 0
    assert capsys.readouterr().out.split() == [
        weights_sha256(model.state_dict()),
        str(sources(run)["checkpoint"]),
    ]
    assert main(["eval", str(run), "--batches", "1", "--micro-batch", "2"]) == 0
    out = capsys.readouterr().out
    assert f"step {STEP}  val: loss " in out and "(128 tokens)" in out
    assert main(["generate", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")
