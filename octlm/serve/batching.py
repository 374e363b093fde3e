"""Concurrent requests decoded together: one background thread steps the running rows over
key/value caches, and admits waiting requests at step boundaries (continuous batching).

Why this shape. A decoding step on a small model is bound by reading the weights, not by the
rows: B rows cost little more than one, so N users should share each forward pass. A seeded
request decodes on the exact inference path, an unseeded one on the plain path (the two kinds
of batch, `octlm/serve/batches.py`): issue 60's rule, since the exact path costs more than 10%
(docs/performance.md), is to pay it where a user asked for a particular draw. Each step samples
one token for every row of both batches, drops the rows that ended (EOS, max_tokens, a cancel:
a stop string, a disconnect, the time limit), and runs one forward pass per non-empty batch.
`max_batch` caps the rows of both together.

Every row samples from a generator of its own seeded with its request's seed, with its own
temperature, top-k and top-p (`octlm.generation.sampling.choose`, the one `octlm generate` uses),
so a seeded row draws, token for token and bit for bit, what `octlm generate` draws for it alone.

The thread owns the model and the caches; request handlers talk to it only through `submit`
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
from octlm.serve.batches import ExactBatch, PlainBatch


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
    exact: bool = True
    """On the exact path (a seeded request) or the plain one (`octlm/serve/batches.py`)."""


class Busy(Exception):
    """More requests wait than the server queues."""


class Scheduler:
    """The batch decoding thread: `start`, `submit` rows from any thread, `close`."""

    def __init__(self, model: GPT, max_batch: int = 32, max_waiting: int = 256) -> None:
        self.model, self.max_batch, self.max_waiting = model, max_batch, max_waiting
        self.context = model.config.context
        self.device = next(model.parameters()).device
        self.waiting: deque[Row] = deque()
        # The weights packed for the exact path once for the server's life (`ExactCache.packs`:
        # the model never changes while it serves).
        self.exact, self.plain = ExactBatch(model, {}), PlainBatch(model)
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
        return {"running": self.running(), "waiting": len(self.waiting), "widest": self.widest,
                "generated": self.generated, "cancelled": self.cancelled}  # fmt: skip

    def run(self) -> None:
        while True:
            with self.wake:
                while not (self.closed or self.waiting or self.running()):
                    self.wake.wait()
                if self.closed:
                    return
            try:
                self.step()
            except Exception as exc:  # a failed forward ends its rows, not the server
                for row in [*self.exact.rows, *self.plain.rows, *self.waiting]:
                    row.emit(End("error", f"{type(exc).__name__}: {exc}"))
                with self.wake:
                    self.waiting.clear()
                self.reset()

    def running(self) -> int:
        return len(self.exact.rows) + len(self.plain.rows)

    def reset(self) -> None:
        self.exact.drop(list(range(len(self.exact.rows))))
        self.plain.drop(list(range(len(self.plain.rows))))

    @torch.no_grad()
    def step(self) -> None:
        """Admit who fits, sample one token for every row, drop the rows that ended, and run
        the forward pass of the rest, one per kind of batch."""
        self.admit()
        for batch in (self.exact, self.plain):
            if not batch.rows:
                continue
            logits = batch.logits
            assert logits is not None
            done = [b for b, row in enumerate(batch.rows) if self.draw(row, logits[b : b + 1])]
            if done:
                batch.drop(done)
            if batch.rows:
                batch.advance()
                self.forwards += 1
                self.widest = max(self.widest, len(batch.rows))

    def draw(self, row: Row, logits: Tensor) -> bool:
        """Sample `row`'s next token and emit it (or its end); whether the row has ended."""
        if row.cancelled.is_set():
            self.cancelled += 1
            return True
        token = self.sample(row, logits)
        row.made += 1
        if token.id == row.stop_id:
            row.emit(End("stop"))
            return True
        row.emit(token)
        self.generated += 1
        row.last = token.id
        if row.made >= row.max_tokens:
            row.emit(End("length"))
            return True
        return False

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

    def admit(self) -> None:
        """Move the waiting rows that fit into their batch, first come first served, while the
        rows number fewer than `max_batch`; a new plain batch starts at its longest prompt."""
        with self.wake:
            waiting = [r for r in self.waiting if not r.cancelled.is_set()]
            self.cancelled += len(self.waiting) - len(waiting)
            plain = [r for r in waiting[: self.max_batch] if not r.exact]
            if not self.plain.rows and plain:
                longest = max(plain, key=lambda r: len(r.prompt))
                waiting.remove(longest)
                waiting.insert(0, longest)
            admitted: dict[bool, list[Row]] = {True: [], False: []}
            left: deque[Row] = deque()
            for row in waiting:
                batch = self.exact if row.exact else self.plain
                room = self.running() + len(admitted[True]) + len(admitted[False]) < self.max_batch
                if room and batch.fits(row, admitted[row.exact]):
                    admitted[row.exact].append(row)
                else:
                    left.append(row)
            self.waiting = left
        for exact, rows in admitted.items():
            for row in rows:
                row.generator = torch.Generator(device=self.device).manual_seed(row.seed)
            if rows:
                (self.exact if exact else self.plain).join(rows)
