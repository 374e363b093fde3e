"""What a run reads and in what order: the dataset (or a weighted mixture of several), the
batch sizes, the order and packing of the rows, the seed (`InputSettings`). `--data` is parsed
here, once, where the config is built: `InputSettings.mixture` is what every reader uses.
Torch-free.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from octlm.config import checks
from octlm.config.rules import (
    ConfigError,
    check_section,
    declared_rules,
    new_trajectory,
    require,
    setting,
    trajectory,
)

ORDERS = ("random", "epoch")  # training data orders (octlm.data.order)
PACKINGS = ("stream", "bos")  # pretraining rows (octlm.data.windows, octlm.data.bos)
Mixture = tuple[tuple[str, float], ...]
"""A `--data` mixture: (dataset path, weight) per part, in the order written."""
_MIXTURE_PART = re.compile(r"(?P<path>.+):(?P<weight>[^:,]+)")


# A weight is a share: only the ratios count (0.7,0.3 and 7,3 are one mixture). Each must lie
# in [MIN_WEIGHT, MAX_WEIGHT]: wide enough for fractions, percentages and token counts (a
# trillion tokens is 1e12), narrow enough that the sum of any mixture stays a finite float and
# no normalised share is subnormal (1e308 + 1e308 overflows, 1e-320 has a few bits left). And
# each share must win a dataset at least one of the STRATUM slots the sampler deals per 1,000
# samples (octlm.data.mixture): a smaller one would never be read, a mixture in name only.
MIN_WEIGHT, MAX_WEIGHT = 1e-9, 1e15
STRATUM = 1000
"""Samples per stratum of a mixture's source choice; `octlm.data.mixture` deals them."""
WEIGHT_RULE = "a positive number from 1e-9 to 1e15"


def parse_mixture(spec: str) -> Mixture | None:
    """`--data A:0.7,B:0.3` as [(A, 0.7), (B, 0.3)]; None for a single dataset path (no
    weights). Raises ValueError naming a weight out of range (WEIGHT_RULE), a share below one
    sample in STRATUM, or a dataset named twice (paths compared resolved: `D`, `D/`, `./D` and
    a link to D are one dataset)."""
    parts = spec.split(",")
    found = [_MIXTURE_PART.fullmatch(p.strip()) for p in parts]
    if len(parts) == 1 and not _is_weighted(found[0]):
        return None
    out = []
    for part, match in zip(parts, found, strict=True):
        if match is None:
            raise ValueError(f"{checks.shown(part.strip())} is not PATH:WEIGHT")
        try:
            weight = float(match["weight"])
        except ValueError:
            raise ValueError(
                f"the weight of {checks.shown(part.strip())} is not a number"
            ) from None
        if not MIN_WEIGHT <= weight <= MAX_WEIGHT:
            raise ValueError(f"the weight of {checks.shown(part.strip())} is not {WEIGHT_RULE}")
        out.append((match["path"].strip(), weight))
    _check_shares(out)
    _check_distinct([p for p, _ in out])
    return tuple(out)


def _check_shares(parts: list[tuple[str, float]]) -> None:
    total = math.fsum(w for _, w in parts)
    for path, weight in parts:
        if weight * STRATUM < total:
            raise ValueError(
                f"the weight of {checks.shown(path)} is {weight / total:.3g} of the whole, less "
                f"than one sample in {STRATUM:,}, so it would never be read"
            )


def _check_distinct(paths: list[str]) -> None:
    resolved: dict[str, str] = {}
    for path in paths:
        key = os.path.realpath(path)
        if key in resolved:
            first = resolved[key]
            again = "" if first == path else f" (as {checks.shown(path)})"
            raise ValueError(
                f"the dataset {checks.shown(first)} is named twice{again}: both are "
                f"{checks.shown(key)}"
            )
        resolved[key] = path


def _is_weighted(match: re.Match | None) -> bool:
    """A single `PATH:NUMBER` is a mixture of one; a path that merely holds a colon is not."""
    if match is None:
        return False
    try:
        float(match["weight"])
    except ValueError:
        return False
    return True


def check_data(data: str | None, blocks: str | None, overfit_blocks: int) -> Mixture | None:
    """--data as one dataset (None), or a weighted mixture `A:0.7,B:0.3` (octlm.data.mixture)
    as its parts, parsed here once for every reader."""
    try:
        mixture = parse_mixture(data) if data else None
    except ValueError as exc:
        raise ConfigError(
            f"--data {checks.shown(data)}: {exc}",
            f"write datasets and weights as PATH:WEIGHT,PATH:WEIGHT, each dataset once, each "
            f"weight {WEIGHT_RULE} and at least 1/{STRATUM:,} of their sum",
        ) from None
    if mixture is not None:
        require(blocks is None, "--blocks trains on one text file, not a mixture", "drop one")
        require(
            not overfit_blocks,
            "--overfit-blocks memorises blocks of one dataset, not of a mixture",
            "drop --overfit-blocks, or pass one dataset",
        )
    return mixture


def check_packing(packing: str, doc_mask: bool, blocks: str | None) -> None:
    require(packing in PACKINGS, f"packing {packing!r} is unknown", f"use one of {PACKINGS}")
    require(
        not doc_mask or packing == "bos",
        "--doc-mask masks the documents of --packing bos rows, and this run packs none",
        "add --packing bos, or drop --doc-mask",
    )
    require(
        packing == "stream" or blocks is None,
        "--packing bos reads a prepared --data, not the --blocks text",
        "drop --blocks, or --packing",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class InputSettings:
    """The data a run reads: which dataset, how much per step, in what order, and how text
    becomes rows. The global batch (`micro_batch * accum` sequences of `context` tokens) is the
    run's, whatever the process count."""

    # `data` and `blocks` are checked through the data fingerprint, not as settings.
    data: str | None = setting(None, checks.PATH)
    """Prepared dataset folder (`octlm prepare`), or a weighted mixture of several that share a
    tokenizer, PATH:WEIGHT,PATH:WEIGHT (docs/data.md); default: the embedded corpus."""
    micro_batch: int = trajectory(16, checks.Int(1))
    """Sequences per micro-batch."""
    accum: int = trajectory(32, checks.Int(1))
    """Micro-batches per optimizer step (gradient accumulation)."""
    context: int = trajectory(1024, checks.Int(1))
    """Tokens per sequence (at most the preset's context)."""
    order: str = new_trajectory("random")
    """Training data order: random (windows at any offset, drawn afresh each step) or epoch
    (every aligned block of context + 1 tokens once per epoch, shuffled per epoch); on
    prompt/completion data, packed windows drawn with replacement, or each once per epoch."""
    packing: str = new_trajectory("stream")
    """How pretraining text becomes rows: stream (windows of the token stream at any offset)
    or bos (rows that start at a document wherever the data allows, filled best-fit;
    docs/data.md)."""
    doc_mask: bool = new_trajectory(False)
    """With --packing bos: attention and RoPE positions stay inside each document of a row."""
    blocks: str | None = setting(None, checks.PATH)
    """Train and validate on in-memory blocks made from this text/JSONL file (the first seed's
    path: a short stream is padded and PAD targets are masked); the tokenizer comes from data."""
    overfit_blocks: int = trajectory(0, checks.Int(0))
    """If > 0, train and validate on only the first N blocks of the train stream (seed 1, Day 1)."""
    seed: int = trajectory(1337, checks.Int(0))
    """Seeds the model init and the data order."""
    mixture: Mixture | None = field(default=None, init=False, repr=False, compare=False)
    """`data` parsed: the mixture's parts, or None for one dataset (set when built)."""

    def __post_init__(self) -> None:
        check_section(self)
        require(self.order in ORDERS, f"order {self.order!r} is unknown", f"use one of {ORDERS}")
        check_packing(self.packing, self.doc_mask, self.blocks)
        mixture = check_data(self.data, self.blocks, self.overfit_blocks)
        object.__setattr__(self, "mixture", mixture)

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.accum * self.context

    @property
    def first_dataset(self) -> str | None:
        """The one dataset's path, or a mixture's first (whose tokenizer every part shares);
        None for the embedded corpus."""
        return self.data if self.mixture is None else self.mixture[0][0]


RULES = declared_rules(InputSettings)
