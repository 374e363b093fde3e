"""What a run reads, built from its config: the in-memory blocks (--blocks), the training
sampler (its data order, --order) and the fixed validation set."""

from __future__ import annotations

import numpy as np

from octlm.config import TrainConfig
from octlm.data.blocks import TokenBlocks, make_blocks
from octlm.data.corpus import read_documents
from octlm.data.order import Sampler, validation_starts
from octlm.data.shards import ShardDataset
from octlm.errors import OctlmError
from octlm.evaluate import ValidationSet
from octlm.tokenizer import Tokenizer
from octlm.train.distributed import DistInfo


def train_blocks(cfg: TrainConfig, tokenizer: Tokenizer) -> TokenBlocks | None:
    """The first seed's in-memory path (--blocks): PAD-masked blocks of one text, or None."""
    if not cfg.blocks:
        return None
    blocks = make_blocks([d.text for d in read_documents([cfg.blocks])], tokenizer, cfg.context)
    return blocks.first(cfg.overfit_blocks) if cfg.overfit_blocks else blocks


def build_sampler(
    cfg: TrainConfig, dataset: ShardDataset, blocks: TokenBlocks | None, dist: DistInfo
) -> Sampler:
    try:
        return Sampler(
            blocks if blocks is not None else dataset.train,
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
    cfg: TrainConfig, dataset: ShardDataset, blocks: TokenBlocks | None, tokenizer: Tokenizer
) -> ValidationSet:
    common = {
        "context": cfg.context,
        "micro_batch": cfg.micro_batch,
        "token_bytes": tokenizer.token_bytes_table,
    }
    if blocks is not None:  # the blocks are their own validation set
        return ValidationSet(**common, blocks=blocks)
    if cfg.overfit_blocks:  # validate on the memorised blocks themselves
        starts = np.arange(cfg.overfit_blocks, dtype=np.int64) * (cfg.context + 1)
        return ValidationSet(**common, stream=dataset.train, starts=starts)
    n = cfg.val_batches * cfg.micro_batch
    starts = validation_starts(len(dataset.val), cfg.context, n)
    return ValidationSet(**common, stream=dataset.val, starts=starts)
