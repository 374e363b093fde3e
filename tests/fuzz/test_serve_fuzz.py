"""The fuzz of `octlm serve`'s request bodies (issue 62), seeded and bounded: arbitrary bodies
(fields of the wrong type, huge, negative and non-finite numbers, unknown fields, nested junk,
lone surrogates, bytes that are not UTF-8, cut-short and empty bodies) posted to
`/v1/chat/completions` and `/v1/completions` of one real server on the tiny chat fine-tune.
Each answer is a 200 in OpenAI's shape (a whole answer or a stream of chunks ending `[DONE]`) or
a 4xx in OpenAI's error shape: never a 5xx, never a dropped connection, and the server answers
`/health` after. Found cases stay as plain tests below."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tests.rl.helpers import chat_source
from tests.serve.helpers import serving

pytestmark = pytest.mark.slow  # it starts `octlm serve`
pytest.importorskip("starlette", reason="the serve extra is not installed")

NAME = "tiny"
PATHS = ("/v1/chat/completions", "/v1/completions")
JUNK = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**80), 2**80)
    | st.floats()
    | st.sampled_from([10**400, -(10**400), 2**63, -(2**63) - 1])
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
ODD_TEXTS = ["\ud800", "a\udfff", "\x00", "\u202e", "<|im_end|>", "x" * 5000]
"""Lone surrogates (which JSON can escape), controls, a special token's look, a long one."""
TEXT = st.one_of(*[st.text(max_size=24)] * 4, st.sampled_from(ODD_TEXTS))
SMALL = st.integers(-2, 6)


PART = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
ROLES = st.sampled_from(["system", "developer", "user", "user", "assistant", "user", "tool"])
MESSAGE = st.fixed_dictionaries({"role": ROLES, "content": TEXT | st.lists(PART, max_size=2)})
PLAUSIBLE = {
    "model": st.just(NAME),
    "max_completion_tokens": SMALL,
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "top_k": SMALL,
    "n": st.integers(1, 3),
    "seed": st.integers(0, 2**64),
    "stop": TEXT | st.lists(TEXT, max_size=5),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "logprobs": st.booleans() | SMALL,
    "top_logprobs": SMALL,
}
"""The fields OpenAI's requests may carry, each with values a client could well send."""
VALID = st.fixed_dictionaries(
    {
        "prompt": TEXT | st.lists(TEXT, min_size=1, max_size=3),
        "messages": st.lists(MESSAGE, min_size=1, max_size=3),
        "max_tokens": st.integers(1, 4),
        "stream": st.booleans(),
    },
    optional=PLAUSIBLE,
)
FIELDS = ("prompt", "messages", "max_tokens", "stream", *PLAUSIBLE)


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    """A body of plausible fields (both endpoints' prompts: each reads its own), a few of them
    dropped or swapped for any JSON value, and unknown fields of any value."""
    body = draw(VALID)
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True)):
        if draw(st.booleans()):
            body.pop(name, None)
        else:
            body[name] = draw(JUNK)
    return {**draw(st.dictionaries(st.text(max_size=8), JUNK, max_size=2)), **body}


def encoded(body: Any) -> bytes:
    return json.dumps(body).encode()  # NaN and Infinity as Python writes them


BODIES = st.one_of(
    *[objects().map(encoded)] * 4,  # mostly bodies a client could send, some fields gone wrong
    objects().map(encoded).flatmap(lambda raw: st.integers(0, len(raw)).map(lambda n: raw[:n])),
    objects().map(lambda b: json.dumps(b, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    JUNK.map(encoded),  # JSON that is not an object
    st.binary(max_size=40),
    st.sampled_from(
        [b"", b'{"prompt": "\xff\xfe"}', b'{"messages": [{"role": "user", "content": "\xc3"}]}']
    ),
    st.integers(1, 20_000).map(lambda d: b'{"prompt": ' + b"[" * d + b"]" * d + b"}"),
)


def post(url: str, path: str, raw: bytes) -> tuple[int, str, bytes]:
    """(status, content type, body) of one raw POST; a dropped connection raises."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        connection.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.getheader("content-type") or "", response.read()
    finally:
        connection.close()


def error_shape(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return f"not OpenAI's error shape: {body!r:.300}"
    if not isinstance(error.get("message"), str) or not error["message"]:
        return f"an error without a message: {body!r:.300}"
    if not isinstance(error.get("type"), str) or error["type"] == "server_error":
        return f"an error of type {error.get('type')!r}: {body!r:.300}"
    return None


def answer_shape(body: Any, chat: bool) -> str | None:
    """What is wrong with a whole answer (None: OpenAI's shape)."""
    kind = "chat.completion" if chat else "text_completion"
    if not isinstance(body, dict) or body.get("object") != kind or not body.get("choices"):
        return f"not a {kind}: {body!r:.300}"
    for choice in body["choices"]:
        text = choice["message"]["content"] if chat else choice["text"]
        if not isinstance(text, str) or choice["finish_reason"] not in ("stop", "length"):
            return f"a choice not in OpenAI's shape: {choice!r:.300}"
    use = body["usage"]
    if use["total_tokens"] != use["prompt_tokens"] + use["completion_tokens"]:
        return f"usage does not add up: {use}"
    return None


def stream_shape(data: bytes, chat: bool) -> str | None:
    events = [line[6:] for line in data.decode().splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return f"a stream that does not end with [DONE]: {data[-300:]!r}"
    kind = "chat.completion.chunk" if chat else "text_completion"
    for text in events[:-1]:
        chunk = json.loads(text)
        if "error" in chunk:
            return error_shape(chunk)
        if chunk.get("object") != kind or not isinstance(chunk.get("choices"), list):
            return f"not a {kind}: {text[:300]}"
    return None


def problem(status: int, kind: str, data: bytes, chat: bool) -> str | None:
    """What is wrong with one answer (None: a valid answer or a refusal in OpenAI's shape)."""
    if 400 <= status < 500:
        return error_shape(json.loads(data))
    if status != 200:
        return f"status {status}: {data[:300]!r}"
    if kind.startswith("text/event-stream"):
        return stream_shape(data, chat)
    return answer_shape(json.loads(data), chat)


@pytest.fixture(scope="module")
def url(tiny_tokenizer, tmp_path_factory):
    with serving(chat_source(tiny_tokenizer, tmp_path_factory), "--name", NAME) as base:
        yield base


@settings(
    max_examples=300,
    derandomize=True,
    deadline=10_000,
    database=None,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: a hung server would take minutes
)
@given(path=st.sampled_from(PATHS), raw=BODIES)
def fuzz_bodies(url: str, path: str, raw: bytes) -> None:
    status, kind, data = post(url, path, raw)
    found = problem(status, kind, data, chat=path == PATHS[0])
    assert found is None, f"POST {path} {raw[:300]!r}: {found}"


def test_any_body_is_answered_or_refused_in_openais_shape(url) -> None:
    fuzz_bodies(url)
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("GET", "/health")
        health = connection.getresponse()
        assert health.status == 200 and json.loads(health.read())["status"] == "ok"
    finally:
        connection.close()


# Found by the fuzz: each was a 500 (the server's own error) before protocol.py refused it.
FOUND = {
    "an integer too large for a float": (
        PATHS[1],
        b'{"prompt": "a", "temperature": 1' + b"0" * 400 + b"}",
    ),
    "JSON nested thousands deep": (PATHS[1], b"[" * 5000),
    "a prompt holding a lone surrogate": (PATHS[1], b'{"prompt": "\\ud800", "max_tokens": 2}'),
}


@pytest.mark.parametrize("case", FOUND, ids=FOUND)
def test_a_found_body_is_a_400_in_openais_shape(url, case) -> None:
    path, raw = FOUND[case]
    status, _, data = post(url, path, raw)
    assert status == 400 and error_shape(json.loads(data)) is None, (status, data)
