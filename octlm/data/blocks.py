"""The first seed's small in-memory data path: documents -> fixed blocks of T + 1 tokens.

Inputs are a block's first T tokens, targets its last T (the same block shifted by one). A
stream shorter than one block is padded with <|pad|>; PAD targets become IGNORE_INDEX so the
loss skips them, and carry 0 bytes so bits per byte counts only real text.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octlm.hashing import sha256_bytes, sha256_json
from octlm.model import IGNORE_INDEX
from octlm.tokenizer.core import Tokenizer


@dataclass(frozen=True)
class TokenBlocks:
    inputs: torch.Tensor  # (N, T) int64
    targets: torch.Tensor  # (N, T) int64, IGNORE_INDEX where the target is PAD
    byte_lengths: torch.Tensor  # (N, T) int64, UTF-8 bytes of each target token (0 for specials)

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def first(self, n: int) -> TokenBlocks:
        """The first `n` blocks (the first seed's memorisation experiment)."""
        return TokenBlocks(self.inputs[:n], self.targets[:n], self.byte_lengths[:n])

    def shard(self, rank: int, world: int) -> TokenBlocks:
        """Every `world`-th block from the `rank`-th: one rank's share."""
        return TokenBlocks(
            self.inputs[rank::world], self.targets[rank::world], self.byte_lengths[rank::world]
        )

    def fingerprint(self, tokenizer_fingerprint: str) -> str:
        """Identifies the blocks' tokens (as a dataset fingerprint does a prepared folder's)."""
        data = self.inputs.numpy().tobytes() + self.targets.numpy().tobytes()
        return sha256_json({"tokenizer": tokenizer_fingerprint, "blocks": sha256_bytes(data)})


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
    return TokenBlocks(inputs, targets, byte_lengths)
