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

import contextlib
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
from octlm.errors import OctlmError, one_line
from octlm.generation.prompts import check_line, check_text
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
        context = model.config.context
        if system is not None and len(self.ids) >= context:  # no room left for a user's turn
            raise OctlmError(
                f"the system turn is {len(self.ids):,} tokens, not fewer than the model's "
                f"context of {context}",
                "shorten it: the model must see the turns after it",
            )

    def reset(self) -> None:
        """Forget the conversation (the system turn stays)."""
        self.ids: list[int] = list(self.tokenizer.start_ids)
        self.messages: list[Message] = []
        self.continuation = Continuation(self.model, cache=True)
        if self.system is not None:
            self.add(SYSTEM, self.system)

    def add(self, role: str, content: str) -> None:
        """A turn the model reads (system, user, or an assistant turn given as text)."""
        check_text(f"the {role} turn", content, "pass UTF-8 text without NUL characters")
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
    out: TextIO | None = None,
    interactive: bool = False,
) -> int:
    """The interactive loop: a line in, the reply streamed out, until /exit, Ctrl-D (end of
    file) or Ctrl-C at the prompt (exit status 0: ending a chat is not a failure). A line that
    is not text (bytes that are not UTF-8, a NUL) is refused in one line: at a terminal
    (`interactive`) on stderr, and the chat goes on; from a pipe as the command's error."""
    out = out or sys.stdout
    print(HELP, file=out, flush=True)
    number = 0
    while True:
        try:
            text = read("you> ")
        except (EOFError, KeyboardInterrupt):
            print(file=out, flush=True)
            return 0
        number += 1
        try:
            check_line(number, text, interactive)
        except OctlmError as exc:
            if not interactive:
                raise
            print(f"octlm: error: {one_line(exc.message)}", file=sys.stderr, flush=True)
            continue
        if not answer(session, text, out):
            return 0


def answer(session: ChatSession, text: str, out: TextIO) -> bool:
    """Act on one line of the chat: a command, or a user turn and its streamed reply; False
    when the line ends the chat."""
    command = text.strip()
    if command in ("/exit", "/quit"):
        return False
    if command == "/reset":
        session.reset()
        print("(conversation forgotten)", file=out, flush=True)
        return True
    if not command:
        return True
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
    return True


def closed_input(prompt: str) -> str:
    """`input` when this process has no stdin (`octlm chat RUN <&-`): at once end of file."""
    raise EOFError


@contextlib.contextmanager
def terminal_input() -> Iterator[tuple[Callable[[str], str], bool]]:
    """(the line reader, whether it reads a terminal) for `chat_loop`, on this process's stdin.
    While it is open, stdin decodes bytes that are not UTF-8 to lone surrogates
    (`surrogateescape`) rather than raising, whatever the locale, so `chat_loop` refuses the
    line that holds them, and only it; a closed stdin reads as end of file."""
    stdin = sys.stdin
    if stdin is None:
        yield closed_input, False
        return
    errors = getattr(stdin, "errors", None)
    changed = False
    if errors is not None and hasattr(stdin, "reconfigure"):
        with contextlib.suppress(ValueError, OSError):  # a closed or detached stream
            stdin.reconfigure(errors="surrogateescape")
            changed = True
    interactive = False
    with contextlib.suppress(ValueError, OSError):
        interactive = stdin.isatty()
    try:
        yield input, interactive
    finally:
        if changed:
            with contextlib.suppress(ValueError, OSError):
                stdin.reconfigure(errors=errors)
