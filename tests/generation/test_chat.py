"""The chat format (octlm/data/chat_format.py) and a conversation over the key/value cache
(octlm/generation/chat.py): which tokens are targets, that Hugging Face's
`apply_chat_template` with the exported template gives the same ids, and that a session's
replies are the uncached model's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from octlm.data.chat_format import (
    JINJA_TEMPLATE,
    NO_SPECIALS,
    Message,
    encode_chat,
    parse_messages,
    reply_prompt_ids,
    special_pattern,
    turn_ids,
)
from octlm.data.packing import CONTEXT, START, TARGET
from octlm.errors import DataError
from octlm.generation.chat import ChatSession, reply_to
from octlm.generation.sampling import generate
from octlm.model.gpt import GPT
from octlm.tokenizer.core import Specials, Tokenizer
from octlm.tools.export import special_tokens, tokenizer_config
from tests.unit_model import unit_config

CONVERSATION = [
    Message("system", "You answer in verse."),
    Message("user", "Who goes there?"),
    Message("assistant", "Nay, answer me: stand, and unfold yourself."),
    Message("user", "Long live the king!"),
    Message("assistant", "Bernardo?"),
]


def test_only_the_assistant_turns_and_their_eos_are_targets(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    enc = encode_chat(tok, CONVERSATION)
    expected = list(tok.start_ids)
    for m in CONVERSATION:
        expected += turn_ids(tok, m.role, m.content)
    assert enc.ids == expected and len(enc.marks) == len(enc.ids)
    assert enc.marks[0] == START and set(enc.marks[1:]) == {CONTEXT, TARGET}
    targets = [i for i, mark in zip(enc.ids, enc.marks, strict=True) if mark == TARGET]
    replies = [m.content for m in CONVERSATION if m.role == "assistant"]
    assert tok.decode(targets) == "".join(replies)  # the EOS each: special, decoded to nothing
    assert targets.count(tok.eos_id) == 2
    # The header before each reply is context: the prompt `octlm chat` ends with.
    header = reply_prompt_ids(tok)
    first = enc.marks.index(TARGET)
    assert enc.ids[first - len(header) : first] == header
    assert enc.merged_headers == 0


def test_a_reply_that_merges_into_the_header_is_counted_and_targets_the_rest() -> None:
    # A vocabulary that learned "newline + spaces" as one token, as verse-heavy text teaches.
    tok = Tokenizer.train(["assistant\n    indented\n    lines\n"] * 50, vocab_size=300)
    enc = encode_chat(tok, [Message("user", "hi"), Message("assistant", "    indented")])
    assert enc.merged_headers == 1
    header = reply_prompt_ids(tok)
    reply = turn_ids(tok, "assistant", "    indented")
    shared = next(i for i, (a, b) in enumerate(zip(reply, header, strict=False)) if a != b)
    assert shared < len(header)  # the newline and the spaces are one token
    assert enc.marks[-len(reply) :] == [CONTEXT] * shared + [TARGET] * (len(reply) - shared)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("hello", "not a non-empty list"),
        ([], "not a non-empty list"),
        ([{"role": "user"}], "not an object with a role and a content"),
        ([{"role": "bot", "content": "x"}], "has role 'bot'"),
        ([{"role": "user", "content": 3}], "content is a int"),
        ([{"role": "user", "content": "x"}], "no assistant turn"),
        ([{"role": "assistant", "content": "a <|eos|> b"}], "special token '<|eos|>'"),
    ],
)
def test_bad_conversations_are_one_line_errors(tiny_tokenizer, value, match) -> None:
    with pytest.raises(DataError, match=re.escape(match)):
        parse_messages(value, "f.jsonl:1", special_pattern(tiny_tokenizer))


def test_a_user_turn_alone_is_a_prompt_for_the_api() -> None:
    turns = parse_messages([{"role": "user", "content": "hi"}], "m", NO_SPECIALS, need_reply=False)
    assert turns == (Message("user", "hi"),)


def hf_chat_tokenizer(tok: Tokenizer, folder: Path):
    """The tokenizer files `octlm export` writes for a chat fine-tune, loaded by transformers."""
    transformers = pytest.importorskip("transformers")
    folder.mkdir()
    tok.save(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(256, tok, True)))
    (folder / "special_tokens_map.json").write_text(json.dumps(special_tokens(tok)))
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def ids_of(encoded) -> list[int]:
    return encoded if isinstance(encoded, list) else list(encoded["input_ids"])


@pytest.mark.parametrize("bos", [True, False], ids=["bos", "no-bos"])
def test_apply_chat_template_gives_octlm_ids(tiny_tokenizer, tmp_path, bos) -> None:
    tok = tiny_tokenizer
    if not bos:  # a tokenizer whose documents start with no BOS: the template writes none
        tok = Tokenizer(tok.hf, tok.fingerprint, Specials(None, tok.eos_id, tok.pad_id))
    hf = hf_chat_tokenizer(tok, tmp_path / "hf")
    assert hf.chat_template == JINJA_TEMPLATE
    plain = [{"role": m.role, "content": m.content} for m in CONVERSATION]
    tricky = [  # newlines, spaces, non-ASCII, an empty reply
        {"role": "user", "content": "\n  two\n\nlines  "},
        {"role": "assistant", "content": "   indented, ünïcödé ✓"},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
    ]
    for messages in (plain, tricky):
        turns = [Message(**m) for m in messages]
        assert (
            ids_of(hf.apply_chat_template(messages, tokenize=True)) == encode_chat(tok, turns).ids
        )
        prompt = ids_of(
            hf.apply_chat_template(messages[:-1], tokenize=True, add_generation_prompt=True)
        )
        session = ChatSession(GPT(unit_config(64)), tok)
        session.system = None
        session.reset()
        for m in turns[:-1]:
            session.add(m.role, m.content)
        assert prompt == session.ids + reply_prompt_ids(tok)


@pytest.fixture(scope="module")
def chat_model(tiny_tokenizer) -> GPT:
    """A unit model trained for a few seconds on conversations in the chat format, confident
    enough that its top-1 margins dwarf the cache's rounding."""
    tok = tiny_tokenizer
    lines = ["Who goes there?", "Stand, and unfold yourself.", "Long live the king!"]
    convo = [Message("user" if i % 2 == 0 else "assistant", lines[i % 3]) for i in range(6)]
    stream = torch.tensor(encode_chat(tok, convo).ids * 8)
    torch.manual_seed(0)
    model = GPT(unit_config(256))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        starts = torch.randint(0, len(stream) - 65, (8,), generator=gen)
        rows = torch.stack([stream[s : s + 65] for s in starts.tolist()])
        loss_sum, n = model(rows[:, :-1], rows[:, 1:])
        opt.zero_grad()
        (loss_sum / n).backward()
        opt.step()
    return model.eval()


def uncached_reply(model: GPT, tok: Tokenizer, ids: list[int], n: int) -> list[int]:
    """The reply the full forward gives after `ids`, checked to be decided by wide margins."""
    new = generate(model, ids, n, stop_id=tok.eos_id, cache=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids + new]))[0, len(ids) - 1 :].float()
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3  # rounding is ~1e-6: equal tokens anywhere
    return new


@pytest.mark.slow  # trains a unit model for a few seconds
def test_a_conversation_over_the_cache_is_the_uncached_models(chat_model, tiny_tokenizer):
    tok, n = tiny_tokenizer, 24
    session = ChatSession(chat_model, tok, system="Speak.", max_new_tokens=n)
    before = list(session.ids)
    first = "".join(session.reply("Who goes there?"))
    assert first.strip()
    prefix = before + turn_ids(tok, "user", "Who goes there?") + reply_prompt_ids(tok)
    reply_ids = uncached_reply(chat_model, tok, prefix, n)
    assert tok.decode([i for i in reply_ids if i != tok.eos_id]) == first
    # The history is kept: the second reply reads the whole conversation.
    after_first = prefix + [i for i in reply_ids if i != tok.eos_id] + [tok.eos_id]
    assert session.ids == after_first
    second = "".join(session.reply("Long live the king!"))
    prefix2 = after_first + turn_ids(tok, "user", "Long live the king!") + reply_prompt_ids(tok)
    reply2 = uncached_reply(chat_model, tok, prefix2, n)
    assert tok.decode([i for i in reply2 if i != tok.eos_id]) == second
    assert session.continuation.cache.length <= len(session.ids)


@pytest.mark.slow
def test_a_stopped_reply_is_closed_and_the_next_one_reads_it(chat_model, tiny_tokenizer):
    tok = tiny_tokenizer
    session = ChatSession(chat_model, tok, max_new_tokens=24)
    pieces = session.reply("Who goes there?")
    shown = next(pieces)
    pieces.close()  # what Ctrl-C does in `chat_loop`: the generator ends mid-reply
    assert session.ids[-1] == tok.eos_id
    assert session.messages[-1] == Message("assistant", shown)
    prefix = session.ids + turn_ids(tok, "user", "Long live the king!") + reply_prompt_ids(tok)
    second = "".join(session.reply("Long live the king!"))
    reply = uncached_reply(chat_model, tok, prefix, 24)
    assert tok.decode([i for i in reply if i != tok.eos_id]) == second


def test_the_same_seed_gives_the_same_sampled_conversation(tiny_tokenizer) -> None:
    torch.manual_seed(0)
    model = GPT(unit_config(128)).eval()
    turns = [Message("user", "Who goes there?")]

    def reply(seed: int) -> str:
        session = ChatSession(model, tiny_tokenizer, temperature=1.0, max_new_tokens=16, seed=seed)
        return reply_to(session, turns)

    assert reply(1) == reply(1)
    assert reply(1) != reply(2)


def test_a_reply_ending_inside_a_character_is_shown_whole(tiny_tokenizer) -> None:
    """The streamed pieces join to the decoded reply, even when its last bytes never complete
    a character (a byte-level model can emit any bytes)."""
    torch.manual_seed(0)
    model = GPT(unit_config(128)).eval()
    session = ChatSession(model, tiny_tokenizer, temperature=1.0, max_new_tokens=24, seed=3)
    shown = "".join(session.reply("Who goes there?"))
    assert shown == session.messages[-1].content
