"""Talking to a chat fine-tune: `ChatSession` keeps a conversation's ids and the key/value
cache over them, so each turn runs the model over its own new tokens only; `chat_loop` is the
terminal side of `octlm chat`.

The ids are the chat format's (`octlm.data.chat_format`): a user turn is encoded as the template
encodes it, the reply prompt is the assistant header, and a reply is the ids the model chose,
closed with EOS (added when it stopped at --max-new-tokens or was interrupted). So the
conversation the model sees is the one `apply_chat_template` would encode, as long as each
reply's ids are the ones its text encodes to.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO

import torch

from octlm.data.chat_format import (
    ASSISTANT,
    SYSTEM,
    USER,
    Message,
    reply_prompt_ids,
    turn_ids,
)
from octlm.generation.sampling import Continuation, check_sampling, choose
from octlm.model.gpt import GPT
from octlm.tokenizer.core import Tokenizer

INCOMPLETE = "\ufffd"
"""What decoding shows for the first bytes of a character whose last bytes are still to come."""


class ChatSession:
    """A conversation with a model: add turns, stream the model's replies."""

    def __init__(
        self,
        model: GPT,
        tokenizer: Tokenizer,
        *,
        system: str | None = None,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int | None = None,
        seed: int = 0,
    ) -> None:
        check_sampling(max_new_tokens, temperature, top_k, seed)
        self.model, self.tokenizer, self.system = model, tokenizer, system
        self.max_new_tokens = max_new_tokens
        self.sampling = (temperature, top_k)
        device = next(model.parameters()).device
        # One generator for the whole conversation: the same turns give the same replies.
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the system turn stays)."""
        self.ids: list[int] = list(self.tokenizer.start_ids)
        self.messages: list[Message] = []
        self.continuation = Continuation(self.model, cache=True)
        if self.system is not None:
            self.add(SYSTEM, self.system)

    def add(self, role: str, content: str) -> None:
        """A turn the model reads (system, user, or an assistant turn given as text)."""
        self.ids += turn_ids(self.tokenizer, role, content)
        self.messages.append(Message(role, content))

    @property
    def over_context(self) -> bool:
        """Whether the conversation no longer fits: the model then sees its last tokens."""
        return len(self.ids) > self.model.config.context

    @torch.no_grad()
    def reply(self, text: str | None = None) -> Iterator[str]:
        """Add the user turn `text` (if given), then the model's reply, yielded piece by piece
        as it decodes. However the reply ends (EOS, --max-new-tokens, an exception such as
        KeyboardInterrupt), its turn is closed with EOS and kept in the conversation."""
        if text is not None:
            self.add(USER, text)
        self.ids += reply_prompt_ids(self.tokenizer)
        eos, new, shown = self.tokenizer.eos_id, [], ""
        device = next(self.model.parameters()).device
        try:
            for _ in range(self.max_new_tokens):
                ids = torch.tensor([self.ids + new], dtype=torch.long, device=device)
                next_id = choose(self.continuation(ids), *self.sampling, self.generator)
                if next_id == eos:
                    break
                new.append(next_id)
                text_so_far = self.tokenizer.decode(new)
                if not text_so_far.endswith(INCOMPLETE):
                    yield text_so_far[len(shown) :]
                    shown = text_so_far
            # A reply can end on bytes that never complete a character: show them as decoded.
            rest = self.tokenizer.decode(new)[len(shown) :]
            if rest:
                yield rest
        finally:
            self.ids += [*new, eos]
            self.messages.append(Message(ASSISTANT, self.tokenizer.decode(new)))


def reply_to(session: ChatSession, messages: Sequence[Message]) -> str:
    """The reply to a whole conversation (its turns added in order, then one reply)."""
    for m in messages:
        session.add(m.role, m.content)
    return "".join(session.reply())


HELP = "/reset forgets the conversation, /exit or Ctrl-D ends it; Ctrl-C stops a reply"


def chat_loop(
    session: ChatSession,
    read: Callable[[str], str] = input,
    out: TextIO = sys.stdout,
) -> int:
    """The interactive loop: a line in, the reply streamed out, until /exit, Ctrl-D or Ctrl-C
    at the prompt (exit status 0: ending a chat is not a failure)."""
    print(HELP, file=out, flush=True)
    while True:
        try:
            text = read("you> ")
        except (EOFError, KeyboardInterrupt):
            print(file=out, flush=True)
            return 0
        command = text.strip()
        if command in ("/exit", "/quit"):
            return 0
        if command == "/reset":
            session.reset()
            print("(conversation forgotten)", file=out, flush=True)
            continue
        if not command:
            continue
        print("model> ", end="", file=out, flush=True)
        try:
            for piece in session.reply(text):
                print(piece, end="", file=out, flush=True)
        except KeyboardInterrupt:
            print(" [stopped]", end="", file=out)
        print(file=out, flush=True)
        if session.over_context:
            context = session.model.config.context
            print(
                f"(longer than the context of {context}: the model sees the last {context} "
                "tokens; /reset to start over)",
                file=out,
                flush=True,
            )
