"""The HTTP side of `octlm serve`: a Starlette app on uvicorn with OpenAI's endpoints
(`/v1/completions`, `/v1/chat/completions`, `/v1/models`), `/health` and the chat page at `/`.

Each request is read (a bounded body), checked (`protocol.py`: a bad one is OpenAI's error
object with its status, and the server goes on), turned into rows for the batch decoding
thread (`batching.py`), and answered whole or as server-sent events, each choice's text as it
decodes (`replies.py`). A request that passes its time limit, or whose client goes away, or
whose text reaches a stop string, cancels its rows: the thread drops them at its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from octlm.generation.sampling import SEEDS
from octlm.serve.batching import Busy, Row, Scheduler
from octlm.serve.protocol import (
    ApiError,
    Sampling,
    chat_prompt,
    check_model,
    completion_prompts,
    parse_json,
    sampling_of,
)
from octlm.serve.replies import Choice, chunk, head, usage, whole
from octlm.tokenizer.core import Tokenizer

PAGE = Path(__file__).with_name("page.html")
DISCONNECT_CHECK = 0.05
"""Seconds between two looks at whether a whole (not streamed) reply's client has gone, while
its tokens come: one that has gone cancels its rows."""


@dataclass
class Served:
    """What the server serves and how: the model (through its scheduler) and the limits."""

    name: str
    tokenizer: Tokenizer
    scheduler: Scheduler
    chat: bool
    api_key: str | None = None
    timeout: float = 300.0
    max_body: int = 1 << 20

    @property
    def context(self) -> int:
        return self.scheduler.context


def build_app(served: Served) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        served.scheduler.start()
        try:
            yield
        finally:
            served.scheduler.close()

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    handlers = {ApiError: api_error, HTTPException: http_error, Exception: server_error}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)  # type: ignore[arg-type]
    app.state.served = served
    return app


async def api_error(request: Request, exc: ApiError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status)


async def http_error(request: Request, exc: HTTPException) -> Response:
    return await api_error(request, ApiError(exc.status_code, str(exc.detail), code=None))


async def server_error(request: Request, exc: Exception) -> Response:
    failure = ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error")
    return await api_error(request, failure)


async def page(request: Request) -> Response:
    return HTMLResponse(PAGE.read_text(encoding="utf-8"))


async def health(request: Request) -> Response:
    served: Served = request.app.state.served
    return JSONResponse({"status": "ok", "model": served.name, **served.scheduler.load()})


async def models(request: Request) -> Response:
    served: Served = request.app.state.served
    authorize(request, served.api_key)
    model = {"id": served.name, "object": "model", "created": 0, "owned_by": "octlm"}
    model |= {"max_model_len": served.context, "chat": served.chat}
    return JSONResponse({"object": "list", "data": [model]})


def authorize(request: Request, key: str | None) -> None:
    if key is None:
        return
    given = request.headers.get("authorization", "").encode()
    if not hmac.compare_digest(given, f"Bearer {key}".encode()):
        needed = "a valid API key is needed (Authorization: Bearer KEY)"
        raise ApiError(401, needed, None, "invalid_api_key")


async def read_body(request: Request, limit: int) -> bytes:
    too_large = ApiError(413, f"the body is over {limit:,} bytes", None, "request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise too_large
        parts.append(part)
    return b"".join(parts)


async def completions(request: Request) -> Response:
    return await answer(request, chat=False)


async def chat_completions(request: Request) -> Response:
    return await answer(request, chat=True)


async def answer(request: Request, chat: bool) -> Response:
    served: Served = request.app.state.served
    authorize(request, served.api_key)
    body = parse_json(await read_body(request, served.max_body))
    check_model(body, served.name)
    if chat and not served.chat:
        raise ApiError(
            400,
            f"{served.name} was not trained on a chat dataset (its data has no chat format), so "
            "it has no chat template: use /v1/completions, or fine-tune it on chat data first",
            "messages",
            "chat_not_supported",
        )
    tokenizer = served.tokenizer
    prompts = [chat_prompt(body, tokenizer)] if chat else completion_prompts(body, tokenizer)
    sampling = sampling_of(body, max(map(len, prompts)), served.context, chat)
    job = Job(served, chat, sampling, prompts, asyncio.get_running_loop())
    try:
        served.scheduler.submit(job.rows)
    except Busy as exc:
        raise ApiError(
            503, f"the server is busy: {exc}", None, "server_busy", "server_error"
        ) from None
    if sampling.stream:
        return StreamingResponse(job.stream(), media_type="text/event-stream")
    try:
        await job.finish(request)
    finally:
        job.cancel()
    return JSONResponse(whole(job.id, served.name, chat, job.choices, job.usage()))


class Job:
    """One request's rows in the scheduler and its choices here."""

    def __init__(
        self,
        served: Served,
        chat: bool,
        sampling: Sampling,
        prompts: list[list[int]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.served, self.chat, self.sampling, self.loop = served, chat, sampling, loop
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.events: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.deadline = loop.time() + served.timeout
        self.look = loop.time() + DISCONNECT_CHECK  # when to next ask if the client is gone
        self.rows, self.choices = [], []
        s = sampling
        for p, prompt in enumerate(prompts):
            for i in range(s.n):  # choice i of each prompt: seed + i (choice 0 is the seed's)
                seed = s.seed + i if s.seed + i <= SEEDS[1] else s.seed - i
                row = Row(prompt, s.max_tokens, self.emitter(len(self.rows)), s.temperature,
                          s.top_k, s.top_p, seed, s.logprobs, served.tokenizer.eos_id,
                          exact=s.seeded)  # fmt: skip
                self.rows.append(row)
                self.choices.append(Choice(p * s.n + i, row, served.tokenizer, s.stop))

    def emitter(self, k: int) -> Any:
        def emit(event: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
                self.loop.call_soon_threadsafe(self.events.put_nowait, (k, event))

        return emit

    def cancel(self) -> None:
        for row in self.rows:
            row.cancelled.set()

    def done(self) -> bool:
        return all(c.finish is not None for c in self.choices)

    def usage(self) -> dict[str, int]:
        return usage(self.prompt_tokens, self.choices)

    async def next_event(self, request: Request | None) -> tuple[Choice, str]:
        """The next event's choice and its new text; an ApiError past the time limit."""
        while True:
            now = self.loop.time()
            left = self.deadline - now
            if left <= 0:
                limit = f"the request ran past the time limit of {self.served.timeout:g} s"
                raise ApiError(504, limit, None, "timeout", "timeout_error")
            if request is not None and now >= self.look:  # (a stream: Starlette watches it)
                self.look = now + DISCONNECT_CHECK
                if await request.is_disconnected():
                    raise asyncio.CancelledError
            try:
                k, event = await asyncio.wait_for(self.events.get(), min(left, DISCONNECT_CHECK))
            except TimeoutError:
                continue
            choice = self.choices[k]
            text = choice.feed(event)
            if choice.finish == "error":
                raise ApiError(500, choice.error, None, None, "server_error")
            return choice, text

    async def finish(self, request: Request) -> None:
        while not self.done():
            await self.next_event(request)

    async def stream(self) -> AsyncIterator[str]:
        first = {id(c) for c in self.choices}
        name, chat = self.served.name, self.chat
        try:
            while not self.done():
                choice, text = await self.next_event(None)
                if text or choice.finish is not None or id(choice) in first:
                    yield event(chunk(self.id, name, chat, choice, text, id(choice) in first))
                    first.discard(id(choice))
            if self.sampling.include_usage:
                yield event(
                    {**head(self.id, name, chat, True), "choices": [], "usage": self.usage()}
                )
        except ApiError as exc:
            yield event(exc.body())
        finally:
            self.cancel()
        yield "data: [DONE]\n\n"


def event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def run_server(served: Served, host: str, port: int) -> None:
    """Serve until interrupted (Ctrl-C, SIGTERM)."""
    import uvicorn

    config = uvicorn.Config(build_app(served), host=host, port=port, log_level="warning")
    uvicorn.Server(config).run()
