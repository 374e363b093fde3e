"""What a run reads, built from its config: the windows of each split (`windows`: packed
prompt/completion examples, the --blocks text's in-memory blocks, BOS-aligned rows, or windows
of a token stream), the training sampler over them (its data order, --order) and the fixed
validation set."""

from __future__ import annotations

from typing import Any

from octlm.config import TrainConfig
from octlm.data.blocks import TokenBlocks, make_blocks
from octlm.data.bos import BosRows
from octlm.data.order import Sampler
from octlm.data.packed import PackedWindows
from octlm.data.packing import LOSS_MASK_VERSION
from octlm.data.shards import ShardDataset
from octlm.data.windows import StreamWindows, Windows, first_windows
from octlm.errors import OctlmError
from octlm.evaluate import ValidationSet
from octlm.prepare.corpus import read_documents
from octlm.tokenizer.core import Tokenizer
from octlm.trainer.distributed import DistInfo


def windows(cfg: TrainConfig, dataset: ShardDataset, tokenizer: Tokenizer, split: str) -> Windows:
    """The windows a run reads from `split` ("train" or "val") of `dataset`: its packed
    examples (prompt/completion data), the --blocks blocks (train), else windows of the split's
    token stream. The training windows' `fingerprint` is the run's data fingerprint."""
    if dataset.masked:
        if cfg.packing != "stream":
            raise OctlmError(
                f"{dataset.root} holds prompt/completion examples, which are packed already",
                "drop --packing and --doc-mask",
            )
        return packed_split(cfg, dataset, split)
    # Validation reads the same windows whatever the packing, so that runs with and without
    # it are scored on the same tokens.
    if split == "val":  # scored in order, disjoint targets: window j starts at token j * T
        return StreamWindows(dataset.val, cfg.context, cfg.context, dataset.fingerprint)
    if cfg.blocks:
        return train_blocks(cfg, tokenizer)
    if cfg.packing == "bos":
        return bos_rows(cfg, dataset, tokenizer)
    # Which windows exist is part of the data order (docs/training-order.md): "random" draws
    # a window at any offset, "epoch" each aligned block of T + 1 tokens once per epoch, and
    # --overfit-blocks memorises the first N such blocks.
    aligned = cfg.order == "epoch" or bool(cfg.overfit_blocks)
    stride = cfg.context + 1 if aligned else 1
    found = StreamWindows(dataset.train, cfg.context, stride, dataset.fingerprint)
    if len(found) < max(1, cfg.overfit_blocks):
        raise OctlmError(
            f"stream of {len(dataset.train)} tokens is too short for context {cfg.context}",
            "use more data or a shorter --context",
        )
    return found


def bos_rows(cfg: TrainConfig, dataset: ShardDataset, tokenizer: Tokenizer) -> BosRows:
    """The training stream's BOS-aligned rows (--packing bos)."""
    rows = BosRows(
        dataset.train, cfg.context, tokenizer.eos_id, dataset.fingerprint, doc_mask=cfg.doc_mask
    )
    if len(rows) < max(1, cfg.overfit_blocks):
        raise OctlmError(
            f"stream of {len(dataset.train)} tokens is too short for context {cfg.context}",
            "use more data or a shorter --context",
        )
    return rows


def train_blocks(cfg: TrainConfig, tokenizer: Tokenizer) -> TokenBlocks:
    """The first seed's in-memory path (--blocks): PAD-masked blocks of one text."""
    assert cfg.blocks is not None
    blocks = make_blocks([d.text for d in read_documents([cfg.blocks])], tokenizer, cfg.context)
    return blocks.first(cfg.overfit_blocks) if cfg.overfit_blocks else blocks


def packed_split(cfg: TrainConfig, dataset: ShardDataset, split: str) -> PackedWindows:
    """A prompt/completion dataset's split packed at the run's context."""
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
    packed = PackedWindows.of_split(dataset, split, cfg.context)
    if not len(packed):
        raise OctlmError(
            f"no {split} example of {dataset.root} fits in --context {cfg.context}",
            "raise --context, or prepare shorter examples",
        )
    return packed


def packing_record(train: Windows, val: Windows) -> dict[str, Any] | None:
    """For the log header: per split, what its windows say of themselves (packed examples:
    examples, windows, skipped examples, padding share; BOS rows: rows, tokens cropped and
    padded, rows at a document start); None when neither says anything."""
    records = {"train": train.summary(), "val": val.summary()}
    found = {split: r for split, r in records.items() if r is not None}
    return found or None


def packing_line(train: dict[str, Any], context: int) -> str:
    """What the training windows' summary says, in one line for the terminal."""
    if train.get("packing") == "bos":
        return (
            f"BOS-aligned rows: {train['rows']:,} rows of {context + 1} tokens, "
            f"{train['rows_at_document_start']:.1%} starting at a document (sampled), nothing "
            "cropped or padded"
        )
    return (
        f"packed {train['examples']:,} training examples into {train['windows']:,} windows of "
        f"{context} (padding {train['padding']:.1%}; {train['too_long']:,} longer than the "
        "context skipped)"
    )


def build_sampler(cfg: TrainConfig, train: Windows, dist: DistInfo) -> Sampler:
    try:
        return Sampler(
            train,
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
    cfg: TrainConfig, train: Windows, val: Windows, tokenizer: Tokenizer
) -> ValidationSet:
    """The validation split's first windows; an overfit run validates on the windows it
    memorises, and --blocks on the blocks themselves."""
    if cfg.overfit_blocks or cfg.blocks:
        scored, n = train, cfg.overfit_blocks or len(train)
    else:
        scored, n = val, cfg.val_batches * cfg.micro_batch
    return ValidationSet(
        scored, first_windows(scored, n), cfg.micro_batch, tokenizer.token_bytes_table
    )
