"""The app in this process (Starlette's test client, the real app and scheduler thread, a
random unit model): a request past its time limit gets a 504 in OpenAI's shape, a stream an
error event and then `[DONE]`, and the server answers the next request."""

from __future__ import annotations

import json

import pytest
import torch

from octlm.model.gpt import GPT
from octlm.serve.app import Served, build_app
from octlm.serve.batching import Scheduler
from tests.unit_model import unit_config

testclient = pytest.importorskip("starlette.testclient", reason="the serve extra is not installed")


def client_for(tokenizer, timeout: float):
    torch.manual_seed(0)
    model = GPT(unit_config(48)).eval()
    served = Served("unit", tokenizer, Scheduler(model), chat=False, timeout=timeout)
    return testclient.TestClient(build_app(served))


def test_a_request_past_its_time_limit_is_a_504_and_the_server_goes_on(tiny_tokenizer) -> None:
    with client_for(tiny_tokenizer, timeout=1e-9) as client:
        body = {"prompt": "To be", "max_tokens": 8}
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 504
        assert response.json()["error"]["code"] == "timeout"
        streamed = client.post("/v1/completions", json={**body, "stream": True}).text
        events = [line[6:] for line in streamed.splitlines() if line.startswith("data: ")]
        assert json.loads(events[-2])["error"]["code"] == "timeout" and events[-1] == "[DONE]"
        assert client.get("/health").json()["status"] == "ok"


def test_chat_with_a_model_without_a_chat_format_is_a_400(tiny_tokenizer) -> None:
    with client_for(tiny_tokenizer, timeout=60) as client:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "chat_not_supported"
        done = client.post("/v1/completions", json={"prompt": "To be", "max_tokens": 3}).json()
        assert done["usage"]["completion_tokens"] <= 3 and done["choices"][0]["index"] == 0
