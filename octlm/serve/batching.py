"""Concurrent requests decoded together: one background thread steps one batch over one
key/value cache, and admits waiting requests at step boundaries (continuous batching).

Why this shape. A decoding step on a small model is bound by reading the weights, not by the
rows: B rows cost little more than one, so N users should share each forward pass. The batch
runs on the exact inference path (`octlm.model.exact`): its cache holds each row at its own
positions (row b's position t at slot t, padded on the right), and a row's logits are the
same bits whatever else is in the batch, wherever it sits and however long the others are.
So a newcomer joins a running batch at any step boundary: the requests admitted together are
prefilled in one forward pass (their prompts padded on the right; each row's first token gets
the bits of its prompt alone), their cache rows appended to the batch's, and from then on every
step decodes all rows at once, each at its own position. A request waits only while the batch
is full (`max_batch`). A row that ends (EOS, its max_tokens, a cancel: a stop string, a
disconnect, the time limit) leaves the cache at once, so the batch is only ever the rows still
decoding.

Every row samples from a generator of its own seeded with its request's seed, with its own
temperature, top-k and top-p (`octlm.generation.sampling.choose`, the one `octlm generate` uses),
so a seeded row draws, token for token and bit for bit, what `octlm generate` draws for it alone.

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
from octlm.model.exact import ExactCache, forward_exact
from octlm.model.gpt import GPT


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
    length: int = 0
    """Positions the cache holds for this row (its prompt and the tokens fed back so far)."""


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
        self.cache: ExactCache | None = None
        self.packs: dict[int, object] = {}
        """The weights packed for the exact path, once for the server's life (`ExactCache.packs`:
        the model never changes while it serves)."""
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
        self.rows, self.cache, self.logits = [], None, None

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
        start = torch.tensor([row.length for row in self.rows], device=self.device)
        self.logits = forward_exact(self.model, ids, self.cache, start)[:, -1, :].float()
        for row in self.rows:
            row.length += 1
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

    def admit(self) -> None:
        """Move the waiting rows into the batch while it has room, first come first served (each
        was checked to fit the context alone, which is all a row needs on the exact path)."""
        with self.wake:
            waiting = [r for r in self.waiting if not r.cancelled.is_set()]
            self.cancelled += len(self.waiting) - len(waiting)
            room = max(self.max_batch - len(self.rows), 0)
            admitted, self.waiting = waiting[:room], deque(waiting[room:])
        if admitted:
            self.join(admitted)

    def join(self, rows: list[Row]) -> None:
        """Prefill the newcomers' prompts in one forward pass, padded on the right (each row's
        bits are its own), and append their cache rows and first logits to the batch's."""
        for row in rows:
            row.generator = torch.Generator(device=self.device).manual_seed(row.seed)
            row.length = len(row.prompt)
        width = max(row.length for row in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        for b, row in enumerate(rows):
            ids[b, : row.length] = torch.tensor(row.prompt, device=self.device)
        fresh = ExactCache(self.model, len(rows))
        fresh.packs = self.packs
        last = torch.tensor([row.length - 1 for row in rows], device=self.device)
        logits = forward_exact(self.model, ids, fresh, at=last)[:, -1, :].float()
        if self.cache is None:
            self.cache, self.logits, self.rows = fresh, logits, list(rows)
            return
        assert self.logits is not None
        for layer in range(len(self.cache.keys)):
            self.cache.keys[layer] = torch.cat([self.cache.keys[layer], fresh.keys[layer]])
            self.cache.values[layer] = torch.cat([self.cache.values[layer], fresh.values[layer]])
        self.logits = torch.cat([self.logits, logits])
        self.rows += rows
