"""What a run reads, built from its config: the in-memory blocks (--blocks), the training
sampler (its data order, --order) and the fixed validation set."""

from __future__ import annotations

from typing import Any

import numpy as np

from octlm.config import TrainConfig
from octlm.data.blocks import TokenBlocks, make_blocks
from octlm.data.corpus import read_documents
from octlm.data.order import Sampler, validation_starts
from octlm.data.packed import PackedWindows
from octlm.data.packing import LOSS_MASK_VERSION
from octlm.data.shards import ShardDataset
from octlm.errors import OctlmError
from octlm.evaluate import ValidationSet
from octlm.tokenizer.core import Tokenizer
from octlm.train.distributed import DistInfo


def train_blocks(cfg: TrainConfig, tokenizer: Tokenizer) -> TokenBlocks | None:
    """The first seed's in-memory path (--blocks): PAD-masked blocks of one text, or None."""
    if not cfg.blocks:
        return None
    blocks = make_blocks([d.text for d in read_documents([cfg.blocks])], tokenizer, cfg.context)
    return blocks.first(cfg.overfit_blocks) if cfg.overfit_blocks else blocks


def packed_windows(cfg: TrainConfig, dataset: ShardDataset) -> dict[str, PackedWindows] | None:
    """A prompt/completion dataset's splits packed at the run's context; None for plain text."""
    if not dataset.masked:
        return None
    version = dataset.manifest["loss_mask"]["version"]
    if version != LOSS_MASK_VERSION:
        raise OctlmError(
            f"{dataset.root} has loss-mask version {version}; this octlm reads {LOSS_MASK_VERSION}",
            "re-run `octlm prepare --format prompt-completion` with this octlm",
        )
    if cfg.blocks:
        raise OctlmError(
            "--blocks reads a text file, not the prompt/completion --data", "drop one of the two"
        )
    assert dataset.train_mask is not None and dataset.val_mask is not None
    packed = {
        "train": PackedWindows.build(dataset.train, dataset.train_mask, cfg.context),
        "val": PackedWindows.build(dataset.val, dataset.val_mask, cfg.context),
    }
    for split, windows in packed.items():
        if not len(windows):
            raise OctlmError(
                f"no {split} example of {dataset.root} fits in --context {cfg.context}",
                "raise --context, or prepare shorter examples",
            )
    return packed


def packing_record(packed: dict[str, PackedWindows] | None) -> dict[str, Any] | None:
    """For the log header: per split, examples, windows, skipped examples, padding share."""
    if packed is None:
        return None
    return {
        split: {
            "examples": len(w.lengths),
            "windows": len(w),
            "too_long": w.skipped,
            "padding": round(w.padding_share(), 6),
        }
        for split, w in packed.items()
    }


def build_sampler(
    cfg: TrainConfig,
    dataset: ShardDataset,
    blocks: TokenBlocks | None,
    dist: DistInfo,
    packed: dict[str, PackedWindows] | None = None,
) -> Sampler:
    source = packed["train"] if packed else (blocks if blocks is not None else dataset.train)
    try:
        return Sampler(
            source,
            seed=cfg.seed,
            context=cfg.context,
            micro_batch=cfg.micro_batch,
            accum=cfg.accum,
            overfit_blocks=cfg.overfit_blocks,
            rank=dist.rank,
            world=dist.world,
            order=cfg.order,
        )
    except ValueError as exc:
        raise OctlmError(str(exc), "use more data or a shorter --context") from None


def validation_set(
    cfg: TrainConfig,
    dataset: ShardDataset,
    blocks: TokenBlocks | None,
    tokenizer: Tokenizer,
    packed: dict[str, PackedWindows] | None = None,
) -> ValidationSet:
    common = {
        "context": cfg.context,
        "micro_batch": cfg.micro_batch,
        "token_bytes": tokenizer.token_bytes_table,
    }
    if packed is not None:  # the first windows, in packing order (or the memorised ones)
        windows = packed["train"] if cfg.overfit_blocks else packed["val"]
        n = cfg.overfit_blocks or cfg.val_batches * cfg.micro_batch
        starts = np.arange(min(n, len(windows)), dtype=np.int64)
        return ValidationSet(**common, packed=windows, starts=starts)
    if blocks is not None:  # the blocks are their own validation set
        return ValidationSet(**common, blocks=blocks)
    if cfg.overfit_blocks:  # validate on the memorised blocks themselves
        starts = np.arange(cfg.overfit_blocks, dtype=np.int64) * (cfg.context + 1)
        return ValidationSet(**common, stream=dataset.train, starts=starts)
    n = cfg.val_batches * cfg.micro_batch
    starts = validation_starts(len(dataset.val), cfg.context, n)
    return ValidationSet(**common, stream=dataset.val, starts=starts)
