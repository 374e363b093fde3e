"""`octlm serve`'s chat page in headless Chromium: the model's name and context shown, a message
typed and sent with the keyboard, the reply streamed into the page piece by piece, equal to the
API's reply to the same request; nothing fetched from anywhere but the server."""

from __future__ import annotations

import pytest

from tests.rl.helpers import chat_source
from tests.serve.helpers import request, serving

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(tiny_tokenizer, tmp_path_factory) -> str:
    with serving(chat_source(tiny_tokenizer, tmp_path_factory)) as base:
        yield base


def test_the_page_streams_a_reply_typed_at_the_keyboard(browser, url) -> None:
    errors, requests = [], []
    page = browser.new_page()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(f"{url}/")
    page.locator("#model").filter(has_text="ft").wait_for()
    assert page.locator("#context").inner_text() == "64"
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "12")
    # Record the texts the reply bubble shows: a streamed reply grows through several.
    page.evaluate(
        """() => { window.shown = []; new MutationObserver((records) => {
            const bubble = document.querySelector('.msg.assistant');
            for (const r of records) if (bubble) window.shown.push(bubble.textContent);
        }).observe(document.getElementById('log'), {subtree: true, characterData: true,
        childList: true}); }"""
    )
    page.focus("#input")
    page.keyboard.type("What is 2 + 3?")
    page.keyboard.press("Enter")
    page.locator("#send:not([disabled])").wait_for()
    reply = page.locator(".msg.assistant").inner_text()
    body = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "temperature": 0,
            "max_tokens": 12, "top_k": 50}  # fmt: skip
    status, expected = request(url, "POST", "/v1/chat/completions", body)
    assert status == 200 and reply == expected["choices"][0]["message"]["content"]
    assert page.locator(".msg.user").inner_text() == "What is 2 + 3?"
    shown = [t for t in dict.fromkeys(page.evaluate("window.shown")) if t]
    assert len(shown) >= 2 and all(reply.startswith(t) for t in shown), (reply, shown)
    assert page.evaluate("document.activeElement.id") == "input"  # ready for the next turn
    assert errors == [] and all(r.startswith(url) for r in requests)
    page.close()
