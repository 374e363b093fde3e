"""`octlm serve` as a process on a loopback port, serving a tiny chat fine-tune: driven by the
official `openai` client (plain and streaming, chat and completions), seeded replies compared
with `octlm generate` and `octlm chat`'s session, every bad request answered in OpenAI's error
shape with the server still healthy after them, and a bounded load of concurrent clients."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from octlm.generation.chat import ChatSession
from octlm.generation.trained import load_model, run_tokenizer
from tests.e2e.helpers import octlm
from tests.rl.helpers import chat_source
from tests.serve.helpers import KEY, request, serving

openai = pytest.importorskip("openai", reason="openai (the dev extra) is not installed")
pytestmark = pytest.mark.slow
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "max_tokens": 10}
CHAT = [{"role": "user", "content": "What is 3 + 4?"}]


@pytest.fixture(scope="module")
def source(tiny_tokenizer, tmp_path_factory) -> Path:
    return chat_source(tiny_tokenizer, tmp_path_factory)


@pytest.fixture(scope="module")
def url(source) -> str:
    with serving(source, "--api-key", KEY, "--max-body", "4096", "--name", "tiny") as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def test_chat_and_completions_plain_and_streamed(client) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]
    chat = client.chat.completions.create(model="tiny", messages=CHAT, temperature=0, max_tokens=8)
    reply = chat.choices[0]
    assert reply.message.role == "assistant" and reply.finish_reason in ("stop", "length")
    assert chat.usage.completion_tokens <= 8 and chat.usage.prompt_tokens > 0
    stream = client.chat.completions.create(
        model="tiny", messages=CHAT, temperature=0, max_tokens=8, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.message.content
    assert chunks[-1].usage.total_tokens == chat.usage.total_tokens
    plain = client.completions.create(
        model="tiny", prompt="user\n1 + 2", max_tokens=6, temperature=0
    )
    streamed = client.completions.create(
        model="tiny", prompt="user\n1 + 2", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == plain.choices[0].text


def test_a_seeded_completion_is_octlm_generates_text(client, source) -> None:
    prompt = "user\n5 + 2"
    got = client.completions.create(model="tiny", prompt=prompt, seed=11, extra_body={"top_k": 40},
                                    temperature=0.9, max_tokens=10)  # fmt: skip
    cli = octlm("generate", str(source), "--prompt", prompt, "--max-new-tokens", "10",
                "--temperature", "0.9", "--top-k", "40", "--seed", "11")  # fmt: skip
    assert cli.stdout.removesuffix("\n") == prompt + got.choices[0].text


def test_a_seeded_chat_reply_is_octlm_chats(client, source) -> None:
    model, info = load_model(source)
    session = ChatSession(model, run_tokenizer(info), max_new_tokens=10, temperature=0.9,
                          top_k=40, seed=5)  # fmt: skip
    expected = "".join(session.reply(CHAT[0]["content"]))
    got = client.chat.completions.create(model="tiny", messages=CHAT, seed=5, temperature=0.9,
                                         max_tokens=10, extra_body={"top_k": 40})  # fmt: skip
    assert got.choices[0].message.content == expected


def test_n_logprobs_and_stop(client) -> None:
    got = client.chat.completions.create(model="tiny", messages=CHAT, n=3, seed=1, logprobs=True,
                                         top_logprobs=2, **SAMPLED)  # fmt: skip
    assert [c.index for c in got.choices] == [0, 1, 2]
    for c in got.choices:
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in c.logprobs.content)
    assert got.usage.completion_tokens == sum(len(c.logprobs.content) for c in got.choices)
    whole = client.completions.create(
        model="tiny", prompt="user\n8 + 1", max_tokens=12, temperature=0
    )
    text = whole.choices[0].text
    assert len(text) >= 2, text
    stop = text[1]
    cut = client.completions.create(model="tiny", prompt="user\n8 + 1", max_tokens=12,
                                    temperature=0, stop=[stop])  # fmt: skip
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


BAD = [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    ({"model": "gpt-4", "messages": CHAT}, 404, "model_not_found"),
    ({"messages": [{"role": "user", "content": "9 " * 80}]}, 400, "context_length_exceeded"),
    ({"messages": CHAT, "max_tokens": 0}, 400, None),
    ({"messages": CHAT, "max_tokens": -3}, 400, None),
    ({"messages": CHAT, "max_tokens": 10_000}, 400, "context_length_exceeded"),
    ({"messages": CHAT, "temperature": 5}, 400, None),
    ({"messages": CHAT, "temperature": "hot"}, 400, None),
    ({"messages": CHAT, "top_p": 0}, 400, None),
    ({"messages": CHAT, "n": 0}, 400, None),
    ({"messages": CHAT, "stop": [1]}, 400, None),
    ({"messages": CHAT, "seed": 2**70}, 400, None),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    ({"messages": "hello"}, 400, None),
    ({"prompt": 7}, 400, None),
    ({"messages": CHAT, "padding": "x" * 5000}, 413, "request_too_large"),
]


@pytest.mark.parametrize("body, status, code", BAD, ids=range(len(BAD)))
def test_a_bad_request_gets_openais_error_shape(url, body, status, code) -> None:
    path = (
        "/v1/completions" if isinstance(body, dict) and "prompt" in body else "/v1/chat/completions"
    )
    got_status, got = request(url, "POST", path, body, KEY)
    assert got_status == status, got
    assert set(got["error"]) == {"message", "type", "param", "code"} and got["error"]["message"]
    assert got["error"]["code"] == code


def test_keys_unknown_fields_routes_and_health_after_the_bad_requests(url) -> None:
    assert request(url, "POST", "/v1/chat/completions", {"messages": CHAT})[0] == 401
    assert request(url, "GET", "/v1/models", key="wrong")[0] == 401
    fine = {"messages": CHAT, "max_tokens": 2, "frobnicate": True, "user": "me"}  # ignored
    assert request(url, "POST", "/v1/chat/completions", fine, KEY)[0] == 200
    status, got = request(url, "GET", "/v1/nothing", key=KEY)
    assert status == 404 and "error" in got
    status, health = request(url, "GET", "/health")
    assert status == 200 and health["status"] == "ok"


def test_concurrent_clients_are_batched_and_none_is_lost_or_mixed_up(url) -> None:
    """16 clients x 2 seeded requests at once: each reply the one the same request got alone."""
    requests = [{"prompt": f"user\n{i % 10} + {i // 10}", "seed": i, "max_tokens": 12,
                 "temperature": 1.0} for i in range(32)]  # fmt: skip

    def send(body: dict) -> str:
        status, got = request(url, "POST", "/v1/completions", body, KEY)
        assert status == 200, got
        return got["choices"][0]["text"]

    alone = [send(body) for body in requests]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(send, requests))
    assert together == alone
    assert request(url, "GET", "/health")[1]["widest"] > 1  # they shared forward passes


def test_a_run_without_chat_data_gets_a_clear_400(source, tmp_path) -> None:
    data = tmp_path / "plain"
    manifest = json.loads((source.parent / "data" / "manifest.json").read_text())
    manifest.pop("chat_template")
    data.mkdir()
    for f in (source.parent / "data").iterdir():
        if f.name != "manifest.json":
            (data / f.name).symlink_to(f)
    (data / "manifest.json").write_text(json.dumps(manifest))
    with serving(source, "--data", str(data)) as base:
        status, got = request(base, "POST", "/v1/chat/completions", {"messages": CHAT})
        assert status == 400 and got["error"]["code"] == "chat_not_supported"
        assert "not trained on a chat dataset" in got["error"]["message"]
        assert request(base, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2})[0] == 200
