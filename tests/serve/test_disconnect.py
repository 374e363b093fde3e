"""A client that goes away stops its generation: `octlm serve` as a process on a loopback port,
serving the tiny model at context 256 (one training step: its replies rarely end early), and
/health's counters of tokens sampled and rows cancelled. The control is the same request read
to its end: it makes all its tokens and cancels nothing."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from tests.serve.helpers import request, serving, tiny_run

pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytestmark = pytest.mark.slow
N, MAX_TOKENS = 16, 240
BODY = {"prompt": "To be", "max_tokens": MAX_TOKENS, "n": N, "seed": 3, "temperature": 1.0}


@pytest.fixture(scope="module")
def url(tiny_dataset, tmp_path_factory) -> str:
    with serving(tiny_run(tiny_dataset, tmp_path_factory)) as base:
        yield base


def settled(url: str) -> dict:
    """/health once no row runs nor waits (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        health = request(url, "GET", "/health")[1]
        if health["running"] == health["waiting"] == 0 or time.monotonic() > deadline:
            return health
        time.sleep(0.05)


def counted(url: str, send) -> tuple[int, int, object]:
    """(tokens sampled, rows cancelled) while `send(url)` runs and the server settles after,
    and what `send` returned."""
    before = settled(url)
    got = send(url)
    after = settled(url)
    assert after["running"] == after["waiting"] == 0
    return after["generated"] - before["generated"], after["cancelled"] - before["cancelled"], got


def read_all(url: str) -> tuple[int, int]:
    """The streamed reply read to its [DONE]: its completion tokens, and its choices that ran
    to `max_tokens` (the others sampled EOS first)."""
    connection = http.client.HTTPConnection(*url.removeprefix("http://").split(":"), timeout=60)
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    connection.request("POST", "/v1/completions", json.dumps(body))
    events = connection.getresponse().read().decode().split("\n\n")
    connection.close()
    assert events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    ends = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
    return chunks[-1]["usage"]["completion_tokens"], ends.count("length")


def leave_a_stream(url: str) -> None:
    """Read the first event of the stream, then close the connection."""
    connection = http.client.HTTPConnection(*url.removeprefix("http://").split(":"), timeout=60)
    connection.request("POST", "/v1/completions", json.dumps({**BODY, "stream": True}))
    response = connection.getresponse()
    assert response.status == 200 and response.readline().startswith(b"data: {")
    connection.close()


def leave_a_whole_reply(url: str) -> None:
    """Send a plain (not streamed) request, wait until its rows decode, then close the socket."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(BODY).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 30
        while request(url, "GET", "/health")[1]["running"] < N:
            assert time.monotonic() < deadline, "the request's rows never ran"
            time.sleep(0.01)


def test_a_client_that_goes_away_stops_its_generation(url: str) -> None:
    made, cancelled, (reply_tokens, full) = counted(url, read_all)  # the control: to the end
    assert made == reply_tokens > N * MAX_TOKENS // 2 and cancelled == 0 and full > 0
    for leave in (leave_a_stream, leave_a_whole_reply):
        made, cancelled, _ = counted(url, leave)
        # every row that would run to max_tokens is cancelled, and maybe some that end early
        assert full <= cancelled <= N, leave.__name__
        assert made < reply_tokens // 3, (leave.__name__, made, reply_tokens)
    assert request(url, "GET", "/health")[1]["status"] == "ok"
