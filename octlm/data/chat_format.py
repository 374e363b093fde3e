"""The chat format: how a conversation of system/user/assistant turns becomes token ids, which
of them a chat fine-tune is scored on, and the same format as a Jinja chat template for
Hugging Face's `apply_chat_template`.

Version 1, for a tokenizer with BOS (none: the conversation starts with its first turn):

    [BOS] role "\\n" content [EOS] role "\\n" content [EOS] ...

Each turn is its role name, a newline and its text, encoded as one string, then EOS. EOS is
what a pretrained octlm model already emits at a document's end, so a reply stops where a
document would, with no new token in the vocabulary (a fine-tune keeps its base model's). A
turn is encoded on its own, between special tokens, exactly as a Hugging Face tokenizer
encodes the template's rendered string (it splits the text at special tokens first), so
`apply_chat_template(messages, tokenize=True)` gives these ids.

Only assistant turns are targets: their text and closing EOS. The role header "assistant\\n" is
context, as it is the prompt `octlm chat` ends with before the model replies. Where a text's
first token merges with the header's newline (the text starts with two or more spaces, say),
the target starts after the tokens the turn shares with the header alone; `prepare` counts
such turns.

Torch-free: `octlm prepare` imports it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octlm.config.checks import shown
from octlm.data.packing import CONTEXT, START, TARGET
from octlm.data.shards import MANIFEST_NAME
from octlm.errors import DataError
from octlm.tokenizer.core import Tokenizer

CHAT_FORMAT = "chat"
CHAT_TEMPLATE_VERSION = 1
SYSTEM, USER, ASSISTANT = "system", "user", "assistant"
ROLES = (SYSTEM, USER, ASSISTANT)

JINJA_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}"
    "{{ message['role'] + '\n' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant\n' }}{% endif %}"
)
"""Version 1 as Hugging Face renders it; `octlm export` writes it into tokenizer_config.json.
One line of blocks: transformers' Jinja environment trims newlines after block tags."""


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str


def check_template_version(version: Any, where: str) -> None:
    if version != CHAT_TEMPLATE_VERSION:
        raise DataError(
            f"{where} uses chat template version {version!r}; this octlm knows version "
            f"{CHAT_TEMPLATE_VERSION}",
            "upgrade octlm, or prepare the dataset again with this one",
        )


def check_chat_dataset(manifest: dict[str, Any], run: Any) -> None:
    """Refuse, in one line, to chat with a run whose dataset is not in the chat format (it
    never saw the turns' framing) or is in a version this octlm does not know."""
    if "chat_template" not in manifest:
        raise DataError(
            f"{run} was not trained on a chat dataset (its data has no chat format)",
            "fine-tune it on `octlm prepare --format chat` data first (docs/chat.md), or name "
            "such a dataset with --data",
        )
    check_template_version(manifest["chat_template"].get("version"), f"{run}'s dataset")


def trained_on_chat(data_dir: str | Path | None) -> bool:
    """Whether a run's dataset (its manifest, if still there) is in the chat format; a version
    this octlm does not know is refused in one line."""
    path = Path(data_dir or "") / MANIFEST_NAME
    if not data_dir or not path.is_file():
        return False
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if "chat_template" not in manifest:
        return False
    check_template_version(manifest["chat_template"].get("version"), str(path))
    return True


NO_SPECIALS = re.compile(r"(?!)")
"""A pattern that matches nothing: for turns no template will encode (`octlm.chat`)."""


def parse_messages(
    value: Any, where: str, specials: re.Pattern[str], need_reply: bool = True
) -> tuple[Message, ...]:
    """The turns of one conversation (a list of {"role", "content"} objects), or a one-line
    error naming what is wrong at `where`. A text may not hold a special token's string: the
    Hugging Face template's encoding would read it as that token, octlm's as text.
    `need_reply`: a conversation to learn from needs an assistant turn."""
    if not isinstance(value, list) or not value:
        raise DataError(
            f"{where}: the messages are not a non-empty list",
            'write [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]',
        )
    messages = []
    for i, item in enumerate(value):
        at = f"{where} message {i + 1}"
        if not isinstance(item, dict) or not {"role", "content"} <= item.keys():
            raise DataError(f"{at} is not an object with a role and a content", "fix that turn")
        role, content = item["role"], item["content"]
        if role not in ROLES:
            raise DataError(f"{at} has role {shown(role)}", f"use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            kind = type(content).__name__
            raise DataError(f"{at}: its content is a {kind}, not a string", "make it a string")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError:  # JSON can escape half of a surrogate pair
            raise DataError(f"{at} holds a lone surrogate", "fix that turn") from None
        found = specials.search(content)
        if found:
            raise DataError(
                f"{at} holds the special token {found.group()!r} as text",
                "remove it from the text (a template would read it as the token itself)",
            )
        messages.append(Message(role, content))
    if need_reply and not any(m.role == ASSISTANT for m in messages):
        raise DataError(
            f"{where} has no assistant turn, nothing to learn", "add a reply or drop it"
        )
    return tuple(messages)


def special_pattern(tokenizer: Tokenizer) -> re.Pattern[str]:
    """Matches the string of any of the tokenizer's special tokens (added tokens marked
    special: Hugging Face's template encoding reads those in text as the tokens)."""
    added = tokenizer.hf.get_added_tokens_decoder().values()
    strings = sorted((t.content for t in added if t.special), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, strings))) if strings else NO_SPECIALS


def turn_text(role: str, content: str) -> str:
    """One turn's text as the template writes it, before its EOS."""
    return f"{role}\n{content}"


def turn_ids(tokenizer: Tokenizer, role: str, content: str) -> list[int]:
    """One turn as the template encodes it: role, newline and text as one string, then EOS."""
    return [*tokenizer.encode(turn_text(role, content), add_special_tokens=False), tokenizer.eos_id]


def reply_prompt_ids(tokenizer: Tokenizer) -> list[int]:
    """What a conversation ends with when the model is to reply: the assistant header."""
    return tokenizer.encode(f"{ASSISTANT}\n", add_special_tokens=False)


@dataclass(frozen=True, slots=True)
class EncodedChat:
    ids: list[int]
    marks: list[int]
    """The loss mask: START, CONTEXT or TARGET per token (`octlm.data.packing`)."""
    merged_headers: int
    """Assistant turns whose first token merged with the header (see the module doc)."""


def encode_chat(
    tokenizer: Tokenizer,
    messages: Sequence[Message],
    encoded_turns: Sequence[list[int]] | None = None,
) -> EncodedChat:
    """A conversation's ids and loss mask. `encoded_turns`: each turn's `turn_text` already
    encoded (by one `encode_batch` over many conversations), else encoded here."""
    if encoded_turns is None:
        texts = [turn_text(m.role, m.content) for m in messages]
        encoded_turns = tokenizer.encode_batch(texts, add_special_tokens=False)
    ids, marks = list(tokenizer.start_ids), [CONTEXT] * len(tokenizer.start_ids)
    header = reply_prompt_ids(tokenizer)
    merged = 0
    for m, text_ids in zip(messages, encoded_turns, strict=True):
        turn = [*text_ids, tokenizer.eos_id]
        if m.role != ASSISTANT:
            context = len(turn)
        else:
            context = _shared_prefix(turn, header)
            merged += context < len(header)
        ids += turn
        marks += [CONTEXT] * context + [TARGET] * (len(turn) - context)
    marks[0] = START
    return EncodedChat(ids, marks, merged)


def _shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
