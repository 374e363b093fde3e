"""What a request gets back: each choice's text as its tokens arrive (stop strings cut, the
text held back that may still become one), its log-probabilities, and the bodies of OpenAI's
completion, chat completion and their stream chunks."""

from __future__ import annotations

import time
from typing import Any

from octlm.generation.chat import INCOMPLETE
from octlm.serve.batching import End, Row, Token
from octlm.tokenizer.core import Tokenizer


class Choice:
    """One choice of a request: fed its row's events, it says what text is new."""

    def __init__(self, index: int, row: Row, tokenizer: Tokenizer, stop: tuple[str, ...]):
        self.index, self.row, self.tokenizer, self.stop = index, row, tokenizer, stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.tokens: list[Token] = []
        self.text, self.shown, self.sent_tokens = "", 0, 0
        self.finish: str | None = None
        self.error = ""

    def feed(self, event: Token | End) -> str:
        """Take one event of the row; the text that is now final and not yet shown."""
        if self.finish is not None:
            return ""
        if isinstance(event, End):
            self.finish, self.error = event.reason, event.message
        else:
            self.tokens.append(event)
            self.text = self.tokenizer.decode([t.id for t in self.tokens])
            cuts = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
            if cuts:
                self.text, self.finish = self.text[: min(cuts)], "stop"
                self.row.cancelled.set()  # the scheduler drops the row at its next step
        if self.finish is not None:
            safe = len(self.text)
        elif self.text.endswith(INCOMPLETE):  # a character whose last bytes are still to come
            safe = self.shown
        else:
            safe = max(self.shown, len(self.text) - self.holdback)
        new, self.shown = self.text[self.shown : safe], safe
        return new

    def logprobs(self, chat: bool, since: int = 0) -> dict[str, Any] | None:
        """OpenAI's logprobs object for the tokens from `since` on; None if not asked for."""
        if self.row.logprobs is None:
            return None
        tokens = self.tokens[since:]

        def name(ids: list[int]) -> str:  # EOS too, by its name
            return self.tokenizer.decode(ids, skip_special_tokens=False)

        if chat:
            content = []
            for t in tokens:
                rivals = [entry(name([i]), lp) for i, lp in t.top]
                content.append({**entry(name([t.id]), t.logprob), "top_logprobs": rivals})
            return {"content": content}
        offsets, at = [], len(self.tokenizer.decode([t.id for t in self.tokens[:since]]))
        for t in tokens:
            offsets.append(at)
            at += len(name([t.id]))
        return {
            "tokens": [name([t.id]) for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [{name([i]): lp for i, lp in t.top} for t in tokens],
            "text_offset": offsets,
        }

    def unsent_logprobs(self, chat: bool) -> dict[str, Any] | None:
        since, self.sent_tokens = self.sent_tokens, len(self.tokens)
        return self.logprobs(chat, since)


def entry(token: str, logprob: float | None) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def usage(prompt_tokens: int, choices: list[Choice]) -> dict[str, int]:
    made = sum(len(c.tokens) for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": made,
        "total_tokens": prompt_tokens + made,
    }


def head(rid: str, model: str, chat: bool, chunk: bool) -> dict[str, Any]:
    kind = "chat.completion" if chat else "text_completion"
    kind += ".chunk" if chunk and chat else ""
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model}


def whole(rid: str, model: str, chat: bool, choices: list[Choice], used: dict) -> dict:
    """The body of a request answered at once."""
    items = []
    for c in choices:
        item: dict[str, Any] = {"index": c.index, "finish_reason": c.finish}
        if chat:
            item["message"] = {"role": "assistant", "content": c.text}
        else:
            item["text"] = c.text
        item["logprobs"] = c.logprobs(chat)
        items.append(item)
    return {**head(rid, model, chat, False), "choices": items, "usage": used}


def chunk(rid: str, model: str, chat: bool, choice: Choice, text: str, first: bool) -> dict:
    """One stream chunk of `choice`: its new `text`, and its finish reason once it ends."""
    item: dict[str, Any] = {"index": choice.index}
    if chat:
        item["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        if choice.finish is not None and not text and not first:
            item["delta"] = {}
    else:
        item["text"] = text
    item["logprobs"] = choice.unsent_logprobs(chat)
    item["finish_reason"] = choice.finish
    return {**head(rid, model, chat, True), "choices": [item]}
