"""OpenAI's request bodies read and checked: what a completion or a chat completion asks for,
as prompt ids and sampling settings, or an `ApiError` in OpenAI's error shape with its status.

Unknown fields are ignored, as OpenAI ignores them; a known field of the wrong type or out of
range is a 400 naming it (`param`). Torch-free and Starlette-free: the app calls it.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any

from octlm.data.chat_format import (
    ASSISTANT,
    SYSTEM,
    parse_messages,
    reply_prompt_ids,
    special_pattern,
    turn_ids,
)
from octlm.errors import OctlmError
from octlm.generation.sampling import SEEDS
from octlm.tokenizer.core import Tokenizer

MAX_N = 16
"""Choices one request may ask for."""
MAX_STOPS = 4
COMPLETION_TOKENS = 16
"""`/v1/completions`' default max_tokens, OpenAI's; a chat reply may fill the context."""


class ApiError(Exception):
    """A request the server refuses: its HTTP status and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.kind, "param": self.param}
        return {"error": {**error, "code": self.code}}


@dataclass(frozen=True, slots=True)
class Sampling:
    """How a request's choices are decoded."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int | None
    seed: int
    seeded: bool
    """The request gave its seed: it decodes on the exact path (`octlm/serve/batches.py`)."""
    n: int
    stop: tuple[str, ...]
    logprobs: int | None
    stream: bool
    include_usage: bool


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:  # `[[[[...` thousands deep: Python's parser recurses per level
        raise ApiError(400, "the body nests too deep to read", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    return body


def number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and (isinstance(value, int) or math.isfinite(value))  # 10**400 is no float
    if not ok or not low <= value <= high:
        raise ApiError(400, f"{name} must be a number from {low} to {high}", name)
    return float(value)


def integer(body: dict, name: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ApiError(400, f"{name} must be an integer from {low} to {high}", name)
    return value


def flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false", name)
    return value


def stops(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or len(value) > MAX_STOPS:
        raise ApiError(400, f"stop must be a string or a list of at most {MAX_STOPS}", "stop")
    if not all(isinstance(s, str) and s for s in value):
        raise ApiError(400, "stop must hold non-empty strings", "stop")
    return tuple(value)


def sampling_of(body: dict, prompt_tokens: int, context: int, chat: bool) -> Sampling:
    """The sampling settings of `body`, whose longest prompt is `prompt_tokens` long."""
    if prompt_tokens >= context:
        raise ApiError(
            400,
            f"the prompt is {prompt_tokens} tokens; the model's context is {context}, and the "
            "reply needs at least one more",
            "messages" if chat else "prompt",
            "context_length_exceeded",
        )
    room = context - prompt_tokens
    name = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    default = room if chat else min(COMPLETION_TOKENS, room)
    max_tokens = integer(body, name, default, -(2**63), 2**63)
    assert max_tokens is not None
    if max_tokens <= 0 or max_tokens > room:
        raise ApiError(
            400,
            f"{name} is {max_tokens}: it must be from 1 to {room} (the context of {context} "
            f"less the prompt's {prompt_tokens} tokens)",
            name,
            "context_length_exceeded" if max_tokens > 0 else None,
        )
    top_k = integer(body, "top_k", None, -1, 2**31)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    return Sampling(
        max_tokens=max_tokens,
        temperature=number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=top_p_of(body),
        top_k=top_k if top_k is not None and top_k > 0 else None,
        seed=seed_of(body),
        seeded=body.get("seed") is not None,
        n=integer(body, "n", 1, 1, MAX_N) or 1,
        stop=stops(body),
        logprobs=logprobs_of(body, chat),
        stream=flag(body, "stream"),
        include_usage=flag(options, "include_usage"),
    )


def top_p_of(body: dict) -> float:
    top_p = number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0:
        raise ApiError(400, "top_p must be more than 0 (it keeps no token)", "top_p")
    return top_p


def seed_of(body: dict) -> int:
    """The request's seed; a fresh random one when it gives none."""
    seed = integer(body, "seed", None, SEEDS[0], SEEDS[1])
    return secrets.randbits(62) if seed is None else seed


def logprobs_of(body: dict, chat: bool) -> int | None:
    """None for no log-probabilities, else how many rivals each token lists."""
    if not chat:
        return integer(body, "logprobs", None, 0, 5)
    top = integer(body, "top_logprobs", None, 0, 20)
    if not flag(body, "logprobs"):
        if top:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        return None
    return top or 0


def check_model(body: dict, name: str) -> None:
    model = body.get("model")
    if model is not None and model != name:
        raise ApiError(
            404,
            f"the model {str(model)[:100]!r} does not exist; this server serves {name!r}",
            "model",
            "model_not_found",
        )


def completion_prompts(body: dict, tokenizer: Tokenizer) -> list[list[int]]:
    """`prompt` (a string or a list of strings) as `octlm generate` encodes it: BOS (EOS when
    the tokenizer has none), then the text."""
    prompt = body.get("prompt")
    texts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "prompt must be a string or a non-empty list of strings", "prompt")
    if len(texts) > MAX_N:
        raise ApiError(400, f"prompt may list at most {MAX_N} strings", "prompt")
    if not all(t.isascii() or unicode(t) for t in texts):  # JSON can escape half of a pair
        raise ApiError(400, "prompt holds a lone surrogate, which is no text", "prompt")
    start = tokenizer.start_ids or [tokenizer.eos_id]
    return [[*start, *tokenizer.encode(t, add_special_tokens=False)] for t in texts]


def unicode(text: str) -> bool:
    """Whether `text` is Unicode text (no lone surrogate, which a tokenizer cannot read)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def chat_prompt(body: dict, tokenizer: Tokenizer) -> list[int]:
    """`messages` as the run's chat format encodes them, ending with the assistant header: the
    ids `octlm chat` gives the model for the same turns."""
    messages = body.get("messages")
    if isinstance(messages, list):
        messages = [plain_turn(m) for m in messages]
    try:
        turns = parse_messages(messages, "messages", special_pattern(tokenizer), need_reply=False)
    except OctlmError as exc:
        raise ApiError(400, exc.message, "messages") from None
    ids = list(tokenizer.start_ids)
    for turn in turns:
        ids += turn_ids(tokenizer, turn.role, turn.content)
    return ids + reply_prompt_ids(tokenizer)


def plain_turn(message: Any) -> Any:
    """An OpenAI message as the chat format's {role, content}: a "developer" turn is a system
    turn, a content of text parts their text joined; other fields dropped."""
    if not isinstance(message, dict):
        return message
    role, content = message.get("role"), message.get("content")
    if role == "developer":
        role = SYSTEM
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) else None for p in content]
        content = "".join(parts) if all(isinstance(p, str) for p in parts) else content
    if content is None and role == ASSISTANT:
        content = ""
    return {"role": role, "content": content}
