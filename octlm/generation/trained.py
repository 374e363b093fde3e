"""A trained run opened for use: its model, weights, tokenizer and dataset.

Every command that uses a run after training (eval, generate, hash, export, analyze) opens it
here, from a run folder (its newest listed checkpoint), a checkpoint file or a weights-only
snapshot, and finds its tokenizer and dataset through the fingerprints the checkpoint records.
"""

from __future__ import annotations

from pathlib import Path

import torch

from octlm.config.shape import ModelConfig
from octlm.data.dataset_tokenizer import dataset_tokenizer
from octlm.data.shards import TOKENIZER_NAME, ShardDataset
from octlm.device import resolve_device
from octlm.errors import OctlmError
from octlm.hashing import file_sha256
from octlm.model.exact_kept import keep_packed
from octlm.model.gpt import GPT
from octlm.tokenizer.core import Tokenizer
from octlm.trainer import checkpoint as ckpt


def load_weights(run_or_ckpt: str | Path) -> tuple[ckpt.CheckpointInfo, dict[str, torch.Tensor]]:
    """(what the file says, model weights under octlm's names) of a run, checkpoint or
    snapshot file."""
    path, checksum = ckpt.find_checkpoint(run_or_ckpt)
    info, tensors = ckpt.load_checkpoint(path, checksum)
    if info.model_config is None:
        raise ckpt.CheckpointError(f"{path} holds no model config", "name an octlm checkpoint")
    return info, ckpt.model_weights(tensors)


def load_model(run_or_ckpt: str | Path, device: str = "cpu") -> tuple[GPT, ckpt.CheckpointInfo]:
    """The model of a run folder, a checkpoint or a snapshot file, in eval mode on `device`,
    its exact packings kept across calls (`octlm/model/exact_kept.py`)."""
    info, weights = load_weights(run_or_ckpt)
    model = GPT(ModelConfig.from_dict(info.model_config))  # type: ignore[arg-type]
    model.load_state_dict(weights)
    model.to(resolve_device(device)).eval()
    keep_packed(model)
    return model, info


def merged_last(info: ckpt.CheckpointInfo) -> Path | None:
    """The newest file a merge (`octlm merge`) was made of, to compare it with; None for a
    model that is not a merge, or whose sources are gone."""
    if not info.merged_from:
        return None
    newest = info.merged_from[-1]
    return newest if newest.is_file() else None


def run_dataset(info: ckpt.CheckpointInfo, data: str | Path | None = None) -> ShardDataset:
    """The dataset a checkpoint trained on (or `data`), checked against its tokenizer."""
    folder = Path(data or info.data_dir or "")
    expected = info.fingerprints.get("tokenizer")
    return ShardDataset.open(folder, tokenizer_fingerprint=expected)


def run_tokenizer(info: ckpt.CheckpointInfo, data: str | Path | None = None) -> Tokenizer:
    """The tokenizer of the dataset a checkpoint trained on (or of `data`)."""
    return dataset_tokenizer(run_dataset(info, data))


def tokenizer_file(info: ckpt.CheckpointInfo, tokenizer: str | Path | None = None) -> Path:
    """The run's tokenizer.json (or `tokenizer`), checked against the checkpoint's fingerprint."""
    expected = info.fingerprints.get("tokenizer")
    if expected is None:
        raise ckpt.CheckpointError(
            f"{info.path} records no tokenizer fingerprint", "name an octlm checkpoint"
        )
    path = Path(tokenizer) if tokenizer else Path(info.data_dir or "") / TOKENIZER_NAME
    if not path.is_file():
        raise OctlmError(
            f"the run's tokenizer {path} is missing",
            "pass --tokenizer PATH to the tokenizer.json it trained with",
        )
    if file_sha256(path) != expected:
        raise OctlmError(
            f"{path} is not the tokenizer the run trained with (fingerprint {expected[:12]})",
            "pass --tokenizer PATH to the tokenizer.json it trained with",
        )
    return path
