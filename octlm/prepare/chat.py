"""`octlm prepare --format chat`: conversations (a JSON line's `messages` list of
{"role", "content"} turns, or a Parquet/Arrow column of such lists, as Hugging Face chat
datasets store them) written as token shards plus a loss-mask stream in which only the
assistant turns are targets. The format itself is `octlm.data.chat_format`; the dataset is built by
`octlm.prepare.pairs`, as prompt/completion pairs are.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from octlm.data.chat_format import ASSISTANT, Message, encode_chat, parse_messages, turn_text
from octlm.errors import DataError
from octlm.prepare.sources import Source, json_objects
from octlm.prepare.tables import ARROW, PARQUET, Column, read_columns
from octlm.tokenizer.core import Tokenizer


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    messages: tuple[Message, ...]

    @property
    def chars(self) -> int:
        return sum(len(m.content) for m in self.messages)


def read_conversations(
    src: Source, field: str, specials: re.Pattern[str]
) -> Iterator[Conversation]:
    """The conversations of one JSON-lines, Parquet or Arrow file, in file order; a bad line or
    turn is a one-line error."""
    if src.kind in (PARQUET, ARROW):
        column = Column(field, "the messages column", "--messages-field", strings=False)
        for row, (row_id, (value,)) in enumerate(read_columns(src.path, src.kind, (column,)), 1):
            where = f"{src.path} row {row}"
            yield Conversation(
                row_id or f"{src.name}:{row}", parse_messages(value, where, specials)
            )
        return
    example = f'{{"{field}": [{{"role": ..., "content": ...}}, ...]}}'
    for lineno, record in json_objects(src, "chat", example):
        where = f"{src.path}:{lineno}"
        if field not in record:
            raise DataError(
                f"{where} has no field {field!r}",
                "write one object per line with its turns there, or name the field with "
                "--messages-field",
            )
        messages = parse_messages(record[field], where, specials)
        yield Conversation(str(record.get("id", f"{src.name}:{lineno}")), messages)


def encode_conversations(
    tokenizer: Tokenizer, conversations: Sequence[Conversation]
) -> tuple[np.ndarray, np.ndarray, list[int], dict[str, list[int]]]:
    """(tokens, loss mask, tokens per conversation, counts per conversation) of
    `conversations` back to back; the counts are its assistant turns and those whose text
    merged into the header (`octlm.data.chat_format`)."""
    ids: list[int] = []
    marks: list[int] = []
    lengths = []
    counts: dict[str, list[int]] = {"assistant_turns": [], "merged_headers": []}
    texts = [turn_text(m.role, m.content) for c in conversations for m in c.messages]
    turns = iter(tokenizer.encode_batch(texts, add_special_tokens=False))
    for conversation in conversations:
        encoded_turns = [next(turns) for _ in conversation.messages]
        encoded = encode_chat(tokenizer, conversation.messages, encoded_turns)
        ids += encoded.ids
        marks += encoded.marks
        lengths.append(len(encoded.ids))
        counts["assistant_turns"].append(sum(m.role == ASSISTANT for m in conversation.messages))
        counts["merged_headers"].append(encoded.merged_headers)
    return np.asarray(ids, dtype=np.int64), np.asarray(marks, dtype=np.uint8), lengths, counts
