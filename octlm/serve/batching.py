"""Concurrent requests decoded together: one background thread steps one batch over one
key/value cache, and admits waiting requests at step boundaries (continuous batching).

Why this shape. A decoding step on a small model is bound by reading the weights, not by the
rows: B rows cost little more than one, so N users should share each forward pass. The cache
(`octlm.model.kvcache.KVCache`) holds one length for all its rows, and `forward_cached` already
decodes left-padded rows each as it would be alone (`pad`: the padding is masked and RoPE does
not count it). So a newcomer can join a running batch at a step boundary, without waiting for
the batch to end: its prompt is prefilled alone, in a cache of one row (the exact computation
`octlm generate` runs for it), and its keys and values are copied into a new row of the batch's
cache, right-aligned to the batch's length L with L - P positions of padding. That needs its
prompt to fit behind the batch (P <= L) and its reply to fit in front (L + max_tokens <= the
context); a request that does not fit waits, first in line, for a later step or for the batch
to empty, when the next batch starts at the longest waiting prompt. A row that ends (EOS, its
max_tokens, a cancel: a stop string, a disconnect, the time limit) leaves the cache at once, so
the batch is only ever the rows still decoding.

Every row samples from a generator of its own seeded with its request's seed, with its own
temperature, top-k and top-p (`octlm.generation.sampling.choose`, the one `octlm generate` uses),
so a seeded row draws what it draws alone. Its logits are computed alone for the first token
and, while it is the only row without padding, for every token (`pad=None`, `generate`'s path);
decoded beside others they are the batched forward's, equal to float rounding, not bit for bit,
until the decode path is made invariant to the batch.

The thread owns the model and the cache; request handlers talk to it only through `submit`
and each row's `emit` callback (called on the thread) and `cancelled` flag (read at each step).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from octlm.generation.sampling import choose
from octlm.model.gpt import GPT
from octlm.model.kvcache import KVCache, forward_cached


@dataclass(frozen=True, slots=True)
class Token:
    """A sampled token, with its log-probability and the likeliest alternatives' when asked."""

    id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class End:
    """A row's end: "stop" (EOS), "length" (max_tokens), or "error" with its message."""

    reason: str
    message: str = ""


@dataclass(eq=False)
class Row:
    """One sequence to decode: a request's prompt (one of its `n` choices)."""

    prompt: list[int]
    max_tokens: int
    emit: Callable[[Token | End], None]
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    logprobs: int | None = None
    """None: no log-probabilities; k >= 0: the chosen token's and its k likeliest rivals'."""
    stop_id: int | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    generator: torch.Generator | None = None
    made: int = 0
    last: int = 0


class Busy(Exception):
    """More requests wait than the server queues."""


class Scheduler:
    """The batch decoding thread: `start`, `submit` rows from any thread, `close`."""

    def __init__(self, model: GPT, max_batch: int = 32, max_waiting: int = 256) -> None:
        self.model, self.max_batch, self.max_waiting = model, max_batch, max_waiting
        self.context = model.config.context
        self.device = next(model.parameters()).device
        self.waiting: deque[Row] = deque()
        self.rows: list[Row] = []
        self.pads: list[int] = []
        self.cache: KVCache | None = None
        self.logits: Tensor | None = None  # (rows, V) float32: each row's next token
        self.widest = 0  # the most rows one forward pass decoded (shown by /health)
        self.forwards = 0
        self.generated = 0  # tokens made since the start, as `usage` counts them (shown by /health)
        self.cancelled = 0  # rows dropped before their end: a stop string, a client gone, ...
        self.wake = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self.run, name="octlm-serve-batch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        with self.wake:
            self.closed = True
            self.wake.notify()
        self.thread.join(timeout=10)

    def submit(self, rows: list[Row]) -> None:
        with self.wake:
            if len(self.waiting) + len(rows) > self.max_waiting:
                raise Busy(f"{len(self.waiting)} requests are waiting already")
            self.waiting.extend(rows)
            self.wake.notify()

    def load(self) -> dict[str, int]:
        return {"running": len(self.rows), "waiting": len(self.waiting), "widest": self.widest,
                "generated": self.generated, "cancelled": self.cancelled}  # fmt: skip

    def run(self) -> None:
        while True:
            with self.wake:
                while not (self.closed or self.waiting or self.rows):
                    self.wake.wait()
                if self.closed:
                    return
            try:
                self.step()
            except Exception as exc:  # a failed forward ends its rows, not the server
                for row in [*self.rows, *self.waiting]:
                    row.emit(End("error", f"{type(exc).__name__}: {exc}"))
                with self.wake:
                    self.waiting.clear()
                self.reset()

    def reset(self) -> None:
        self.rows, self.pads, self.cache, self.logits = [], [], None, None

    @torch.no_grad()
    def step(self) -> None:
        """Admit who fits, sample one token for every row, drop the rows that ended, and run
        the forward pass of the rest."""
        self.admit()
        if not self.rows:
            return
        assert self.logits is not None
        done = []
        for b, row in enumerate(self.rows):
            if row.cancelled.is_set():
                done.append(b)
                self.cancelled += 1
                continue
            token = self.sample(row, self.logits[b : b + 1])
            row.made += 1
            if token.id == row.stop_id:
                row.emit(End("stop"))
            else:
                row.emit(token)
                self.generated += 1
                if row.made >= row.max_tokens:
                    row.emit(End("length"))
            if token.id == row.stop_id or row.made >= row.max_tokens:
                done.append(b)
            row.last = token.id
        self.drop(done)
        if self.rows:
            self.advance()

    def sample(self, row: Row, logits: Tensor) -> Token:
        assert row.generator is not None
        next_id = choose(logits, row.temperature, row.top_k, row.generator, top_p=row.top_p)
        if row.logprobs is None:
            return Token(next_id)
        logprobs = torch.log_softmax(logits[0], dim=-1)
        top = torch.topk(logprobs, row.logprobs) if row.logprobs else None
        rivals = (
            ()
            if top is None
            else tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True))
        )
        return Token(next_id, float(logprobs[next_id]), rivals)

    def advance(self) -> None:
        assert self.cache is not None
        ids = torch.tensor([[row.last] for row in self.rows], device=self.device)
        pad = torch.tensor(self.pads, device=self.device) if any(self.pads) else None
        self.logits = forward_cached(self.model, ids, self.cache, pad=pad)[:, -1, :].float()
        self.forwards += 1
        self.widest = max(self.widest, len(self.rows))

    def drop(self, done: list[int]) -> None:
        if not done:
            return
        keep = [b for b in range(len(self.rows)) if b not in set(done)]
        if not keep:
            self.reset()
            return
        assert self.cache is not None and self.logits is not None
        index = torch.tensor(keep, device=self.device)
        self.cache.keys = [k.index_select(0, index) for k in self.cache.keys]
        self.cache.values = [v.index_select(0, index) for v in self.cache.values]
        self.logits = self.logits.index_select(0, index)
        self.rows = [self.rows[b] for b in keep]
        self.pads = [self.pads[b] for b in keep]

    def admit(self) -> None:
        """Move the waiting rows that fit into the batch, first come first served."""
        with self.wake:
            waiting = [r for r in self.waiting if not r.cancelled.is_set()]
            self.cancelled += len(self.waiting) - len(waiting)
            if not self.rows and waiting:  # a new batch starts at its longest prompt
                longest = max(waiting[: self.max_batch], key=lambda r: len(r.prompt))
                waiting.remove(longest)
                waiting.insert(0, longest)
            admitted, left = [], deque()
            for row in waiting:
                if len(self.rows) + len(admitted) < self.max_batch and self.fits(row, admitted):
                    admitted.append(row)
                else:
                    left.append(row)
            self.waiting = left
        if admitted:
            self.join(admitted)

    def fits(self, row: Row, admitted: list[Row]) -> bool:
        if not self.rows and not admitted:
            return True  # the request was checked to fit the context alone
        length = self.cache.length if self.cache is not None else len(admitted[0].prompt)
        return len(row.prompt) <= length and length + row.max_tokens <= self.context

    def join(self, rows: list[Row]) -> None:
        """Prefill each row's prompt alone, then add the rows to the batch, left-padded to its
        length: one concatenation per layer for them all (one per row copied the whole cache
        once per newcomer, which cost seconds when 32 requests came at once)."""
        prefilled = [(row, *self.prefill(row)) for row in rows]
        if self.cache is None:  # a new batch, at its first row's length
            row, alone, logits = prefilled.pop(0)
            self.cache, self.logits, self.rows, self.pads = alone, logits, [row], [0]
        if not prefilled:
            return
        assert self.logits is not None
        length = self.cache.length
        for _, alone, _ in prefilled:  # right-align each row's n positions to the batch's
            n = alone.length
            for t in (*alone.keys, *alone.values):
                t[:, :, length - n : length] = t[:, :, :n].clone()
                t[:, :, : length - n] = 0
        caches = [alone for _, alone, _ in prefilled]
        for layer in range(len(self.cache.keys)):
            keys, values = self.cache.keys[layer], self.cache.values[layer]
            self.cache.keys[layer] = torch.cat([keys, *(c.keys[layer] for c in caches)])
            self.cache.values[layer] = torch.cat([values, *(c.values[layer] for c in caches)])
        self.logits = torch.cat([self.logits, *(logits for _, _, logits in prefilled)])
        self.rows += [row for row, _, _ in prefilled]
        self.pads += [length - c.length for c in caches]

    def prefill(self, row: Row) -> tuple[KVCache, Tensor]:
        """`row`'s prompt alone in a cache of one row (`octlm generate`'s computation): the
        cache and the first token's float32 logits; its generator seeded."""
        row.generator = torch.Generator(device=self.device).manual_seed(row.seed)
        alone = KVCache(self.model, 1)
        ids = torch.tensor([row.prompt], dtype=torch.long, device=self.device)
        return alone, forward_cached(self.model, ids, alone)[:, -1, :].float()
