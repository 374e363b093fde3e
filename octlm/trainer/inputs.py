"""What a run reads, built from its config: the windows of each split (`windows`: packed
prompt/completion examples, the --blocks text's in-memory blocks, BOS-aligned rows, or windows
of a token stream), the training sampler over them (its data order, --order) and the fixed
validation set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octlm.config.shape import preset
from octlm.config.train import TrainConfig
from octlm.data.blocks import TokenBlocks, make_blocks
from octlm.data.bos import BosRows
from octlm.data.dataset_tokenizer import dataset_tokenizer
from octlm.data.mixture import MixtureSampler, mixture_fingerprint
from octlm.data.order import Sampler
from octlm.data.packed import PackedWindows
from octlm.data.packing import LOSS_MASK_VERSION
from octlm.data.shards import ShardDataset
from octlm.data.windows import StreamWindows, Windows, first_windows
from octlm.errors import OctlmError
from octlm.evaluate.loss import ValidationSet
from octlm.prepare.corpus import read_documents
from octlm.prepare.text import embedded_dataset
from octlm.tokenizer.core import Tokenizer
from octlm.trainer.distributed import DistInfo


def resolve_data(cfg: TrainConfig) -> Path:
    """The run's dataset folder: --data (a mixture's first dataset), else the embedded corpus
    at the preset's vocabulary (prepared on first use)."""
    first = cfg.inputs.first_dataset
    if first is not None:
        return Path(first)
    return embedded_dataset(preset(cfg.shape.model).vocab_size)


def open_data(cfg: TrainConfig) -> tuple[Path, ShardDataset, Tokenizer]:
    """The dataset folder, the dataset and its tokenizer (a mixture's first)."""
    data_dir = resolve_data(cfg)
    dataset = ShardDataset.open(data_dir)
    tokenizer = dataset_tokenizer(dataset)
    if tokenizer.fingerprint != dataset.tokenizer_fingerprint:
        raise OctlmError(
            f"{dataset.tokenizer_path} does not match the manifest's tokenizer",
            "re-run `octlm prepare`",
        )
    return data_dir, dataset, tokenizer


@dataclass(frozen=True)
class Inputs:
    """What a run reads, as `build_run` hands it to the `Run`."""

    sampler: Sampler | MixtureSampler
    val: ValidationSet
    val_sources: dict[str, ValidationSet]
    """A mixture's validation sets per dataset; empty for one dataset."""
    fingerprint: str
    """The data fingerprint: a --blocks text's, the dataset's, or a mixture's datasets' and
    weights'."""
    packing: dict[str, Any] | None


def build_inputs(
    cfg: TrainConfig, dataset: ShardDataset, tokenizer: Tokenizer, dist: DistInfo
) -> Inputs:
    train, val = windows(cfg, dataset, tokenizer, "train"), windows(cfg, dataset, tokenizer, "val")
    packing, val_set = packing_record(train, val), validation_set(cfg, train, val, tokenizer)
    mixture = open_mixture(cfg, tokenizer)
    if mixture is None:
        return Inputs(build_sampler(cfg, train, dist), val_set, {}, train.fingerprint, packing)
    sampler = mixture_sampler(cfg, mixture, tokenizer, dist)
    by_source = mixture_validation(cfg, mixture, tokenizer)
    return Inputs(sampler, val_set, by_source, mixture.fingerprint, packing)


def run_validation(
    cfg: TrainConfig, dataset: ShardDataset, tokenizer: Tokenizer
) -> tuple[ValidationSet, dict[str, ValidationSet]]:
    """The validation sets `build_inputs` gives a run (`Inputs.val`, `Inputs.val_sources`),
    without its sampler: what `octlm eval` scores by default."""
    val = windows(cfg, dataset, tokenizer, "val")
    memorised = cfg.inputs.overfit_blocks or cfg.inputs.blocks  # validated on training windows
    train = windows(cfg, dataset, tokenizer, "train") if memorised else val
    mixture = open_mixture(cfg, tokenizer)
    by_source = {} if mixture is None else mixture_validation(cfg, mixture, tokenizer)
    return validation_set(cfg, train, val, tokenizer), by_source


def windows(cfg: TrainConfig, dataset: ShardDataset, tokenizer: Tokenizer, split: str) -> Windows:
    """The windows a run reads from `split` ("train" or "val") of `dataset`: its packed
    examples (prompt/completion data), the --blocks blocks (train), else windows of the split's
    token stream. The training windows' `fingerprint` is the run's data fingerprint."""
    if dataset.masked:
        if cfg.inputs.packing != "stream":
            raise OctlmError(
                f"{dataset.root} holds prompt/completion examples, which are packed already",
                "drop --packing and --doc-mask",
            )
        return packed_split(cfg, dataset, split)
    # Validation reads the same windows whatever the packing, so that runs with and without
    # it are scored on the same tokens.
    if split == "val":  # scored in order, disjoint targets: window j starts at token j * T
        return StreamWindows(
            dataset.val, cfg.inputs.context, cfg.inputs.context, dataset.fingerprint
        )
    if cfg.inputs.blocks:
        return train_blocks(cfg, tokenizer)
    if cfg.inputs.packing == "bos":
        return bos_rows(cfg, dataset, tokenizer)
    # Which windows exist is part of the data order (docs/training-order.md): "random" draws
    # a window at any offset, "epoch" each aligned block of T + 1 tokens once per epoch, and
    # --overfit-blocks memorises the first N such blocks.
    aligned = cfg.inputs.order == "epoch" or bool(cfg.inputs.overfit_blocks)
    stride = cfg.inputs.context + 1 if aligned else 1
    found = StreamWindows(dataset.train, cfg.inputs.context, stride, dataset.fingerprint)
    if len(found) < max(1, cfg.inputs.overfit_blocks):
        raise OctlmError(
            f"stream of {len(dataset.train)} tokens is too short for context {cfg.inputs.context}",
            "use more data or a shorter --context",
        )
    return found


def bos_rows(cfg: TrainConfig, dataset: ShardDataset, tokenizer: Tokenizer) -> BosRows:
    """The training stream's BOS-aligned rows (--packing bos)."""
    rows = BosRows(
        dataset.train,
        cfg.inputs.context,
        tokenizer.eos_id,
        dataset.fingerprint,
        doc_mask=cfg.inputs.doc_mask,
    )
    if len(rows) < max(1, cfg.inputs.overfit_blocks):
        raise OctlmError(
            f"stream of {len(dataset.train)} tokens is too short for context {cfg.inputs.context}",
            "use more data or a shorter --context",
        )
    return rows


def train_blocks(cfg: TrainConfig, tokenizer: Tokenizer) -> TokenBlocks:
    """The first seed's in-memory path (--blocks): PAD-masked blocks of one text."""
    assert cfg.inputs.blocks is not None
    blocks = make_blocks(
        [d.text for d in read_documents([cfg.inputs.blocks])], tokenizer, cfg.inputs.context
    )
    return blocks.first(cfg.inputs.overfit_blocks) if cfg.inputs.overfit_blocks else blocks


def packed_split(cfg: TrainConfig, dataset: ShardDataset, split: str) -> PackedWindows:
    """A prompt/completion dataset's split packed at the run's context."""
    version = dataset.manifest["loss_mask"]["version"]
    if version != LOSS_MASK_VERSION:
        raise OctlmError(
            f"{dataset.root} has loss-mask version {version}; this octlm reads {LOSS_MASK_VERSION}",
            "re-run `octlm prepare --format prompt-completion` with this octlm",
        )
    if cfg.inputs.blocks:
        raise OctlmError(
            "--blocks reads a text file, not the prompt/completion --data", "drop one of the two"
        )
    packed = PackedWindows.of_split(dataset, split, cfg.inputs.context)
    if not len(packed):
        raise OctlmError(
            f"no {split} example of {dataset.root} fits in --context {cfg.inputs.context}",
            "raise --context, or prepare shorter examples",
        )
    return packed


@dataclass(frozen=True)
class Mixture:
    """The datasets of a --data mixture, in the order given, with their weights; `names` (the
    folders' names) label their numbers in the log."""

    names: list[str]
    datasets: list[ShardDataset]
    weights: list[float]

    @property
    def fingerprint(self) -> str:
        return mixture_fingerprint([d.fingerprint for d in self.datasets], self.weights)


def open_mixture(cfg: TrainConfig, tokenizer: Tokenizer) -> Mixture | None:
    """The datasets of `--data A:0.7,B:0.3` (None for one dataset), each checked to share the
    first one's tokenizer (`tokenizer`) and to hold plain text."""
    spec = cfg.inputs.mixture
    if spec is None:
        return None
    datasets = [ShardDataset.open(Path(path)) for path, _ in spec]
    first = spec[0][0]
    for (path, _), dataset in zip(spec, datasets, strict=True):
        if dataset.tokenizer_fingerprint != tokenizer.fingerprint:
            raise OctlmError(
                f"{path} was prepared with another tokenizer than {first}: a mixture's datasets "
                "must share token ids",
                "prepare them with one --tokenizer (docs/data.md, recipe 4)",
            )
        if dataset.masked:
            raise OctlmError(
                f"{path} holds prompt/completion examples: a mixture mixes pretraining text",
                "fine-tune on one prompt/completion dataset",
            )
    names = [Path(p).name or p for p, _ in spec]  # the folders' names, the paths if those clash
    if len(set(names)) < len(names):
        names = [p for p, _ in spec]
    return Mixture(names, datasets, [w for _, w in spec])


def mixture_sampler(
    cfg: TrainConfig, mixture: Mixture, tokenizer: Tokenizer, dist: DistInfo
) -> MixtureSampler:
    sources = [windows(cfg, d, tokenizer, "train") for d in mixture.datasets]
    try:
        return MixtureSampler(sources, mixture.names, mixture.weights, **order_settings(cfg, dist))
    except ValueError as exc:
        raise OctlmError(str(exc), "use more data or a shorter --context") from None


def mixture_validation(
    cfg: TrainConfig, mixture: Mixture, tokenizer: Tokenizer
) -> dict[str, ValidationSet]:
    """Each source's validation split, `val_batches` micro-batches of it."""
    return {
        name: ValidationSet(
            (val := windows(cfg, dataset, tokenizer, "val")),
            first_windows(val, cfg.evaluation.val_batches * cfg.inputs.micro_batch),
            cfg.inputs.micro_batch,
            tokenizer.token_bytes_table,
        )
        for name, dataset in zip(mixture.names, mixture.datasets, strict=True)
    }


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


def order_settings(cfg: TrainConfig, dist: DistInfo) -> dict[str, Any]:
    """The data order's settings, the same for one dataset's sampler and a mixture's."""
    return {
        "seed": cfg.inputs.seed,
        "micro_batch": cfg.inputs.micro_batch,
        "accum": cfg.inputs.accum,
        "rank": dist.rank,
        "world": dist.world,
        "order": cfg.inputs.order,
    }


def build_sampler(cfg: TrainConfig, train: Windows, dist: DistInfo) -> Sampler:
    try:
        settings = order_settings(cfg, dist)
        return Sampler(
            train, context=cfg.inputs.context, overfit_blocks=cfg.inputs.overfit_blocks, **settings
        )
    except ValueError as exc:
        raise OctlmError(str(exc), "use more data or a shorter --context") from None


def validation_set(
    cfg: TrainConfig, train: Windows, val: Windows, tokenizer: Tokenizer
) -> ValidationSet:
    """The validation split's first windows; an overfit run validates on the windows it
    memorises, and --blocks on the blocks themselves."""
    if cfg.inputs.overfit_blocks or cfg.inputs.blocks:
        scored, n = train, cfg.inputs.overfit_blocks or len(train)
    else:
        scored, n = val, cfg.evaluation.val_batches * cfg.inputs.micro_batch
    return ValidationSet(
        scored, first_windows(scored, n), cfg.inputs.micro_batch, tokenizer.token_bytes_table
    )
