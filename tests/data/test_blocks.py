"""make_blocks rules (the first seed's in-memory data path): blocks of T + 1 tokens, shifted
targets, PAD targets ignored, and per-target byte lengths that add up to the text's bytes."""

from __future__ import annotations

import pytest
import torch

from octlm.data.blocks import make_blocks
from octlm.model.gpt import IGNORE_INDEX

T = 16


@pytest.fixture(scope="module")
def play(corpus_docs) -> str:
    return next(d.text for d in corpus_docs if d.id == "macbeth")[:4000]


def stream_of(tokenizer, texts: list[str]) -> list[int]:
    return [i for ids in tokenizer.encode_batch(texts) for i in ids]


def test_ignore_index_is_minus_100():
    assert IGNORE_INDEX == -100


def test_blocks_are_consecutive_slices_of_t_plus_1(tiny_tokenizer, play):
    stream = stream_of(tiny_tokenizer, [play])
    blocks = make_blocks(play, tiny_tokenizer, T)
    n = len(stream) // (T + 1)
    assert n > 10 and len(blocks) == n
    assert blocks.inputs.shape == blocks.targets.shape == blocks.byte_lengths.shape == (n, T)
    assert blocks.inputs.dtype == blocks.targets.dtype == blocks.byte_lengths.dtype == torch.int64
    full = torch.tensor(stream[: n * (T + 1)]).view(n, T + 1)
    assert torch.equal(blocks.inputs, full[:, :T])
    assert torch.equal(blocks.targets, full[:, 1:])


def test_targets_are_inputs_shifted_by_one(tiny_tokenizer, play):
    blocks = make_blocks(play, tiny_tokenizer, T)
    assert torch.equal(blocks.targets[:, :-1], blocks.inputs[:, 1:])


def test_tail_that_does_not_fill_a_block_is_dropped(tiny_tokenizer, play):
    stream = stream_of(tiny_tokenizer, [play])
    blocks = make_blocks(play, tiny_tokenizer, T)
    used = len(blocks) * (T + 1)
    assert 0 <= len(stream) - used < T + 1
    assert blocks.targets[-1, -1].item() == stream[used - 1]


def test_several_texts_are_concatenated_with_bos_and_eos(tiny_tokenizer):
    texts = ["First document, fairly short.", "Second one.", "Third and last document here."]
    stream = stream_of(tiny_tokenizer, texts)
    assert stream.count(tiny_tokenizer.bos_id) == stream.count(tiny_tokenizer.eos_id) == 3
    blocks = make_blocks(texts, tiny_tokenizer, 8)
    n = len(stream) // 9
    assert torch.equal(blocks.inputs, torch.tensor(stream[: n * 9]).view(n, 9)[:, :8])


def test_exactly_t_plus_1_tokens_is_one_block_without_padding(tiny_tokenizer, play):
    text = tiny_tokenizer.decode(tiny_tokenizer.encode(play, add_special_tokens=False)[: T - 1])
    assert len(tiny_tokenizer.encode(text)) == T + 1
    blocks = make_blocks(text, tiny_tokenizer, T)
    assert len(blocks) == 1
    assert (blocks.targets != IGNORE_INDEX).all() and tiny_tokenizer.pad_id not in blocks.inputs


def test_short_stream_is_padded_and_pad_targets_are_ignored(tiny_tokenizer):
    text = "Hi."
    ids = tiny_tokenizer.encode(text)
    assert len(ids) < T + 1
    blocks = make_blocks(text, tiny_tokenizer, T)
    assert len(blocks) == 1
    n_pad = T + 1 - len(ids)
    assert blocks.inputs[0].tolist() == ids + [tiny_tokenizer.pad_id] * (n_pad - 1)
    assert blocks.targets[0].tolist() == ids[1:] + [IGNORE_INDEX] * n_pad
    assert blocks.byte_lengths[0, -n_pad:].tolist() == [0] * n_pad


def test_empty_text_gives_one_block_of_bos_eos_and_padding(tiny_tokenizer):
    blocks = make_blocks("", tiny_tokenizer, 4)
    assert blocks.inputs.tolist() == [[0, 1, 2, 2]]
    assert blocks.targets.tolist() == [[1, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]]
    assert blocks.byte_lengths.tolist() == [[0, 0, 0, 0]]


def test_byte_lengths_are_token_bytes_of_each_target(tiny_tokenizer, play):
    blocks = make_blocks([play, "Short end."], tiny_tokenizer, T)
    expected = [
        [0 if t == IGNORE_INDEX else tiny_tokenizer.token_bytes(t) for t in row]
        for row in blocks.targets.tolist()
    ]
    assert blocks.byte_lengths.tolist() == expected


def test_byte_lengths_of_a_padded_document_sum_to_its_utf8_bytes(tiny_tokenizer):
    text = "Ça va? 日本 👋"
    blocks = make_blocks(text, tiny_tokenizer, 64)
    assert len(blocks) == 1
    assert int(blocks.byte_lengths.sum()) == len(text.encode("utf-8"))


def test_byte_lengths_of_each_block_sum_to_the_bytes_it_covers(tiny_tokenizer, play):
    # Shakespeare is ASCII, so every target slice decodes on its own.
    blocks = make_blocks(play, tiny_tokenizer, T)
    for i in range(len(blocks)):
        covered = tiny_tokenizer.decode(blocks.targets[i].tolist())
        assert int(blocks.byte_lengths[i].sum()) == len(covered.encode("utf-8")), i


def test_byte_lengths_of_all_blocks_add_up_with_the_uncovered_tokens(tiny_tokenizer):
    text = "Ünïcödé ✓ — 日本語のテキスト, emoji 🎭 and more. " * 20
    blocks = make_blocks(text, tiny_tokenizer, T)
    stream = stream_of(tiny_tokenizer, [text])
    width = T + 1
    # Tokens that are never a target: the first of each block, and the dropped tail.
    uncovered = stream[::width][: len(blocks)] + stream[len(blocks) * width :]
    uncovered_bytes = sum(tiny_tokenizer.token_bytes(t) for t in uncovered)
    assert int(blocks.byte_lengths.sum()) + uncovered_bytes == len(text.encode("utf-8"))


@pytest.mark.parametrize("context", [0, -1])
def test_non_positive_context_is_refused(tiny_tokenizer, context):
    with pytest.raises(ValueError, match="context_length must be positive"):
        make_blocks("text", tiny_tokenizer, context)
