"""The two kinds of batch the serving thread decodes (`octlm/serve/batching.py`), each one set of
rows over one key/value cache, with the same four moves: `fits` a newcomer, `join` newcomers
(prefill and append), `advance` every row by the token it drew, `drop` the rows that ended.

`ExactBatch` is the exact inference path (`octlm/model/exact.py`): each row at its own positions
(row b's position t at slot t, padded on the right), its logits the same bits whatever else is
in the batch. A seeded request decodes here, so its tokens and log-probabilities are bit for bit
what it gets alone and what `octlm generate --seed` gives. Newcomers are prefilled together in
one forward pass and join at any step.

`PlainBatch` is the plain cached path (`octlm/model/kvcache.py`, its products from weights
packed once, `octlm/model/packed.py`), faster (docs/performance.md, "Exact decode"; docs/serve.md,
throughput) and equal to the exact one only to float rounding: for requests without a seed,
which promise no particular draw. Its cache holds one length for all rows, so newcomers'
prompts are prefilled together, left-padded to the longest, and copied in right-aligned to the
batch's length L with left padding (masked, and not counted by RoPE): a newcomer joins when its
prompt fits behind L and its reply in front of it within the context, and otherwise waits.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from octlm.model.exact import ExactCache, forward_exact
from octlm.model.gpt import GPT
from octlm.model.kvcache import KVCache, forward_cached, left_padded
from octlm.model.packed import PackedWeights


class HasPrompt(Protocol):
    prompt: list[int]
    max_tokens: int
    last: int
    length: int


class ExactBatch:
    """Rows on the exact path; `packs` is the server's (the weights packed once for its life)."""

    def __init__(self, model: GPT, packs: dict[int, Any]) -> None:
        self.model, self.packs = model, packs
        self.device = next(model.parameters()).device
        self.rows: list[Any] = []
        self.cache: ExactCache | None = None
        self.logits: Tensor | None = None  # (rows, V) float32: each row's next token

    def fits(self, row: HasPrompt, admitted: list[Any]) -> bool:
        return True  # each was checked to fit the context alone, all a row needs here

    def join(self, rows: list[Any]) -> None:
        """Prefill the newcomers' prompts in one forward pass, padded on the right (each row's
        bits are its own), and append their cache rows and first logits to the batch's."""
        for row in rows:
            row.length = len(row.prompt)
        width = max(row.length for row in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        for b, row in enumerate(rows):
            ids[b, : row.length] = torch.tensor(row.prompt, device=self.device)
        fresh = ExactCache(self.model, len(rows))
        fresh.packs = self.packs
        last = torch.tensor([row.length - 1 for row in rows], device=self.device)
        logits = forward_exact(self.model, ids, fresh, at=last)[:, -1, :].float()
        if self.cache is None or self.logits is None:
            self.cache, self.logits, self.rows = fresh, logits, list(rows)
            return
        for layer in range(len(self.cache.keys)):
            self.cache.keys[layer] = torch.cat([self.cache.keys[layer], fresh.keys[layer]])
            self.cache.values[layer] = torch.cat([self.cache.values[layer], fresh.values[layer]])
        self.logits = torch.cat([self.logits, logits])
        self.rows += rows

    def advance(self) -> None:
        assert self.cache is not None
        ids = torch.tensor([[row.last] for row in self.rows], device=self.device)
        start = torch.tensor([row.length for row in self.rows], device=self.device)
        self.logits = forward_exact(self.model, ids, self.cache, start)[:, -1, :].float()
        for row in self.rows:
            row.length += 1

    def drop(self, done: list[int]) -> None:
        keep = [b for b in range(len(self.rows)) if b not in set(done)]
        if not keep:
            self.rows, self.cache, self.logits = [], None, None
            return
        assert self.cache is not None and self.logits is not None
        self.logits = keep_rows(self.cache, self.logits, keep)
        self.rows = [self.rows[b] for b in keep]


class PlainBatch:
    """Rows on the plain cached path, left-padded to one length (the module's docstring)."""

    def __init__(self, model: GPT) -> None:
        self.model, self.context = model, model.config.context
        self.packed = PackedWeights()  # for the server's life: the model never changes
        self.device = next(model.parameters()).device
        self.rows: list[Any] = []
        self.pads: list[int] = []
        self.cache: KVCache | None = None
        self.logits: Tensor | None = None

    def fits(self, row: HasPrompt, admitted: list[Any]) -> bool:
        if not self.rows and not admitted:
            return True  # the request was checked to fit the context alone
        length = self.cache.length if self.cache is not None else len(admitted[0].prompt)
        return len(row.prompt) <= length and length + row.max_tokens <= self.context

    def join(self, rows: list[Any]) -> None:
        """Prefill the newcomers' prompts in one forward pass (left-padded to the longest), then
        add their rows right-aligned to the batch's length: one concatenation per layer for them
        all (one per row copied the whole cache once per newcomer, which cost seconds when 32
        requests came at once). A new batch starts at its longest newcomer's length."""
        fresh, logits, pads = self.prefill(rows)
        if self.cache is None:
            self.cache, self.logits, self.rows, self.pads = fresh, logits, list(rows), pads
            return
        assert self.logits is not None
        length, n = self.cache.length, fresh.length
        for t in (*fresh.keys, *fresh.values):  # shift the block's n positions to end at length
            t[:, :, length - n : length] = t[:, :, :n].clone()
            t[:, :, : length - n] = 0
        for layer in range(len(self.cache.keys)):
            keys, values = self.cache.keys[layer], self.cache.values[layer]
            self.cache.keys[layer] = torch.cat([keys, fresh.keys[layer]])
            self.cache.values[layer] = torch.cat([values, fresh.values[layer]])
        self.logits = torch.cat([self.logits, logits])
        self.rows += rows
        self.pads += [pad + length - n for pad in pads]

    def prefill(self, rows: list[Any]) -> tuple[KVCache, Tensor, list[int]]:
        """The rows' prompts left-padded to the longest, through the cache in one pass: the
        cache, each row's next-token logits (rows, V) and its padding."""
        ids, pad = left_padded([row.prompt for row in rows], self.device)
        fresh = KVCache(self.model, len(rows))
        mask = pad if bool(pad.any()) else None  # prompts of one length: the causal kernel
        logits = forward_cached(self.model, ids, fresh, pad=mask, linear=self.packed.linear)
        return fresh, logits[:, -1, :].float(), pad.tolist()

    def advance(self) -> None:
        assert self.cache is not None
        ids = torch.tensor([[row.last] for row in self.rows], device=self.device)
        pad = torch.tensor(self.pads, device=self.device) if any(self.pads) else None
        logits = forward_cached(self.model, ids, self.cache, pad=pad, linear=self.packed.linear)
        self.logits = logits[:, -1, :].float()

    def drop(self, done: list[int]) -> None:
        keep = [b for b in range(len(self.rows)) if b not in set(done)]
        if not keep:
            self.rows, self.pads, self.cache, self.logits = [], [], None, None
            return
        assert self.cache is not None and self.logits is not None
        self.logits = keep_rows(self.cache, self.logits, keep)
        self.rows = [self.rows[b] for b in keep]
        self.pads = [self.pads[b] for b in keep]


def keep_rows(cache: ExactCache | KVCache, logits: Tensor, keep: list[int]) -> Tensor:
    """Keep rows `keep` of the cache (in place) and of `logits` (returned)."""
    index = torch.tensor(keep, device=logits.device)
    cache.keys = [k.index_select(0, index) for k in cache.keys]
    cache.values = [v.index_select(0, index) for v in cache.values]
    return logits.index_select(0, index)
