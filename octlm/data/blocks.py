"""The first seed's small in-memory data path: documents -> fixed blocks of T + 1 tokens.

Inputs are a block's first T tokens, targets its last T (the same block shifted by one). A
stream shorter than one block is padded with <|pad|>; PAD targets become IGNORE_INDEX so the
loss skips them, and carry 0 bytes so bits per byte counts only real text. `TokenBlocks` is a
`octlm.data.windows.Windows`: window k is block k.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from octlm.hashing import sha256_bytes, sha256_json
from octlm.model.gpt import IGNORE_INDEX
from octlm.tokenizer.core import Tokenizer


@dataclass(frozen=True)
class TokenBlocks:
    inputs: torch.Tensor  # (N, T) int64
    targets: torch.Tensor  # (N, T) int64, IGNORE_INDEX where the target is PAD
    byte_lengths: torch.Tensor  # (N, T) int64, UTF-8 bytes of each target token (0 for specials)
    tokenizer_fingerprint: str
    """The fingerprint of the tokenizer that cut the blocks (part of `fingerprint`)."""

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @property
    def width(self) -> int:
        return self.inputs.shape[1]

    def first(self, n: int) -> TokenBlocks:
        """The first `n` blocks (the first seed's memorisation experiment)."""
        return TokenBlocks(
            self.inputs[:n], self.targets[:n], self.byte_lengths[:n], self.tokenizer_fingerprint
        )

    @cached_property  # hashes every block: asked once per run, the blocks never change
    def fingerprint(self) -> str:
        """Identifies the blocks' tokens (as a dataset fingerprint does a prepared folder's)."""
        data = self.inputs.numpy().tobytes() + self.targets.numpy().tobytes()
        return sha256_json({"tokenizer": self.tokenizer_fingerprint, "blocks": sha256_bytes(data)})

    @property
    def layout(self) -> dict[str, Any] | None:
        return None

    def summary(self) -> dict[str, Any] | None:
        return None

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of blocks `indices`, each (len(indices), T) int64."""
        index = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        return self.inputs[index], self.targets[index]


def make_blocks(texts: str | list[str], tokenizer: Tokenizer, context_length: int) -> TokenBlocks:
    if context_length < 1:
        raise ValueError(f"context_length must be positive, got {context_length}")
    documents = [texts] if isinstance(texts, str) else texts
    ids: list[int] = []
    for ids_doc in tokenizer.encode_batch(documents):
        ids.extend(ids_doc)
    width = context_length + 1
    real = len(ids)
    if real < width:
        ids.extend([tokenizer.pad_id] * (width - real))
    n_blocks = len(ids) // width  # the tail that does not fill a block is dropped
    tokens = torch.tensor(ids[: n_blocks * width], dtype=torch.int64).view(n_blocks, width)
    inputs, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    table = torch.from_numpy(tokenizer.token_bytes_table).to(torch.int64)
    byte_lengths = table[targets]
    if real < width:  # one padded block; masked by position, not by id: PAD may be EOS
        targets[0, max(real - 1, 0) :] = IGNORE_INDEX
    return TokenBlocks(inputs, targets, byte_lengths, tokenizer.fingerprint)
