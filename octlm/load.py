"""A trained run opened for use: its model, weights, tokenizer and dataset.

Every command that uses a run after training (eval, generate, hash, export, analyze) opens it
here, from a run folder (its newest listed checkpoint), a checkpoint file or a weights-only
snapshot, and finds its tokenizer and dataset through the fingerprints the checkpoint records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from octlm.data.dataset_tokenizer import dataset_tokenizer
from octlm.data.shards import TOKENIZER_NAME, ShardDataset
from octlm.device import resolve_device
from octlm.errors import OctlmError
from octlm.hashing import file_sha256
from octlm.model import GPT, ModelConfig
from octlm.tokenizer.core import Tokenizer
from octlm.train import checkpoint as ckpt


def load_weights(run_or_ckpt: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(metadata, model weights under octlm's names) of a run, checkpoint or snapshot file.

    The metadata gains "path": the file the weights came from."""
    path, checksum = ckpt.find_checkpoint(run_or_ckpt)
    meta, tensors = ckpt.load_checkpoint(path, checksum)
    if "model_config" not in meta:
        raise ckpt.CheckpointError(f"{path} holds no model config", "name an octlm checkpoint")
    meta["path"] = str(path)
    return meta, ckpt.model_weights(tensors)


def load_model(run_or_ckpt: str | Path, device: str = "cpu") -> tuple[GPT, dict[str, Any]]:
    """The model of a run folder, a checkpoint or a snapshot file, in eval mode on `device`."""
    meta, weights = load_weights(run_or_ckpt)
    model = GPT(ModelConfig.from_dict(meta["model_config"]))
    model.load_state_dict(weights)
    model.to(resolve_device(device)).eval()
    return model, meta


def run_dataset(meta: dict[str, Any], data: str | Path | None = None) -> ShardDataset:
    """The dataset a checkpoint trained on (or `data`), checked against its tokenizer."""
    folder = Path(data or meta.get("data_dir") or "")
    expected = (meta.get("fingerprints") or {}).get("tokenizer")
    return ShardDataset.open(folder, tokenizer_fingerprint=expected)


def run_tokenizer(meta: dict[str, Any], data: str | Path | None = None) -> Tokenizer:
    """The tokenizer of the dataset a checkpoint trained on (or of `data`)."""
    return dataset_tokenizer(run_dataset(meta, data))


def tokenizer_file(meta: dict[str, Any], tokenizer: str | Path | None = None) -> Path:
    """The run's tokenizer.json (or `tokenizer`), checked against the checkpoint's fingerprint."""
    expected = (meta.get("fingerprints") or {}).get("tokenizer")
    if expected is None:
        raise ckpt.CheckpointError(
            f"{meta['path']} records no tokenizer fingerprint", "name an octlm checkpoint"
        )
    path = Path(tokenizer) if tokenizer else Path(meta.get("data_dir", "")) / TOKENIZER_NAME
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
