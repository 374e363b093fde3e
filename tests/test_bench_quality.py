"""The pure parts of bench/quality.py: the held-out split, bits per byte, step sizing, variants."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench.quality import round_order, summary
from bench.quality_data import (
    BenchError,
    bits_per_byte,
    char_ids,
    prepare_train_docs,
    split_heldout,
    stream_nats,
    truncate_docs,
    windows,
)
from bench.quality_probe import (
    calibration,
    nanogpt_warmup,
    octlm_warmup,
    probe_estimate,
    size_steps,
)
from bench.quality_runs import Side, check_variants, parse_variants
from octlm.prepare.corpus import Document, embedded_documents


def test_heldout_split_is_deterministic_disjoint_and_last():
    docs = embedded_documents()
    train, held = split_heldout(docs)
    again_train, again_held = split_heldout(embedded_documents())
    assert [d.id for d in held] == [d.id for d in again_held]
    assert [d.id for d in train] == [d.id for d in again_train]
    assert not {d.id for d in train} & {d.id for d in held}
    assert train + held == docs  # the last documents, in order; nothing lost
    total = sum(len(d.text) for d in docs)
    chars = sum(len(d.text) for d in held)
    assert chars >= 0.1 * total > chars - len(held[0].text)  # the fewest that reach 10%
    # octlm's prepare keeps one training document for its validation split: never a held-out one
    trained = prepare_train_docs(train)
    assert len(trained) == len(train) - 1
    assert {d.id for d in trained} < {d.id for d in train}


def test_heldout_split_keeps_a_training_document():
    docs = [Document("a", "x" * 10), Document("b", "y" * 1000)]
    assert split_heldout(docs, 0.5) == ([docs[0]], [docs[1]])
    assert split_heldout(docs, 1.0) == ([docs[0]], [docs[1]])


def test_uniform_model_scores_log2_vocab_bits_per_token():
    vocab, context, n_bytes = 37, 8, 123
    stream = np.arange(50) % vocab  # 50 tokens: 6 full windows of 8 and one of 1

    def uniform(x, y):
        return torch.zeros(*x.shape, vocab)

    nats, predicted = stream_nats(uniform, stream, context, batch=4)
    assert predicted == len(stream) - 1
    assert bits_per_byte(nats, n_bytes) == pytest.approx(math.log2(vocab) * predicted / n_bytes)


def test_windows_predict_every_token_but_the_first_once():
    for n, context in [(2, 8), (9, 8), (10, 8), (1000, 256)]:
        spans = windows(n, context)
        targets = [t for start, length in spans for t in range(start + 1, start + 1 + length)]
        assert targets == list(range(1, n))
        assert all(0 < length <= context for _, length in spans)


def test_step_sizing_from_a_probe():
    median, extra = probe_estimate([900.0, 300.0, 250.0, 200.0, 210.0, 190.0])
    assert median == 200.0
    assert extra == pytest.approx((900 + 300 + 250 - 3 * 200) / 1e3)
    assert size_steps(240, 200.0) == 1200
    assert size_steps(240, 200.0, extra) == int((240 - extra) / 0.2)
    assert size_steps(1, 5000.0) == 1  # never none
    assert probe_estimate([10.0, 10.0, 10.0, 20.0])[1] == 0.0  # a fast start adds nothing
    with pytest.raises(BenchError):
        probe_estimate([1.0, 2.0, 3.0])


def test_calibration_from_earlier_rounds():
    assert calibration([]) == 1.0
    probe = {"probe_ms_per_step": 200.0, "probe_extra_s": 4.0}
    # Predicted 4 + 100 x 0.2 = 24 s; the runs took 21.6 s and 26.4 s, then 24 s: 0.9, 1.1, 1.
    rounds = [{**probe, "steps": 100, "train_s": t} for t in (21.6, 26.4, 24.0)]
    assert calibration(rounds[:1]) == pytest.approx(0.9)
    assert calibration(rounds) == pytest.approx(1.0)
    # Bounded: a probe that was off by half was wrong, not biased.
    assert calibration([{**rounds[0], "train_s": 12.0}]) == 0.8
    assert calibration([{**rounds[0], "train_s": 48.0}]) == 1.25
    # --steps rounds have no probe (NaN): they say nothing of it.
    assert calibration([{**rounds[0], "probe_ms_per_step": math.nan}]) == 1.0


def test_warmups_scale_with_the_run():
    assert [octlm_warmup(n) for n in (1, 10, 120, 440, 5000)] == [1, 1, 6, 22, 250]
    assert [nanogpt_warmup(n) for n in (1, 10, 120, 2000, 5000)] == [0, 0, 6, 100, 100]
    assert all(nanogpt_warmup(n) < n for n in range(1, 3000))  # its cosine needs it below


def test_variant_parsing():
    assert parse_variants(None) == {"octlm": []}
    got = parse_variants(["adamw=", "muon=--optimizer muon", "cap=--logit-softcap 15 --note 'a b'"])
    assert got == {
        "adamw": [],
        "muon": ["--optimizer", "muon"],
        "cap": ["--logit-softcap", "15", "--note", "a b"],
    }
    for bad in (["muon"], ["=--qk-norm"], ["nanoGPT-bpe="], ["a=", "a=--qk-norm"], ["a=--x 'b"]):
        with pytest.raises(BenchError):
            parse_variants(bad)


def test_variants_are_checked_by_octlm_before_any_run(tmp_path):
    check_variants({"adamw": [], "later": ["--warmup", "7", "--seed", "2"]}, tmp_path, tmp_path)
    with pytest.raises(BenchError, match="'bad'.*--no-such-flag"):
        check_variants({"bad": ["--no-such-flag"]}, tmp_path, tmp_path)
    with pytest.raises(BenchError, match="'long'.*warmup"):
        check_variants({"long": ["--warmup", "5000"]}, tmp_path, tmp_path)  # 1000 steps


def test_truncated_heldout_and_char_ids():
    docs = [Document("a", "abc"), Document("b", "dé f"), Document("c", "zzz")]
    assert truncate_docs(docs, None) == docs
    assert [d.text for d in truncate_docs(docs, 5)] == ["abc", "d"]  # é is 2 bytes: not cut
    assert [d.text for d in truncate_docs(docs, 6)] == ["abc", "dé"]
    ids, unseen = char_ids("abca?", {"a": 0, "b": 1, "c": 2})
    assert ids.tolist() == [0, 1, 2, 0, 0] and unseen == 1


def test_summary_pairs_rounds():
    def side(name, bpbs, flags=None, mode="bpe"):
        rounds = [{"bpb": b, "steps": 10, "ms_per_step": 1.0, "train_s": 0.01} for b in bpbs]
        return Side(name, mode, flags, rounds)

    sides = [
        side("adamw", [1.0, 1.2, 1.1], []),
        side("muon", [0.9, 1.2, 1.0], ["--optimizer", "muon"]),
        side("nanoGPT-bpe", [2.0, 2.0, 2.2]),
    ]
    result = summary(sides)
    assert result["sides"]["adamw"]["median_bpb"] == 1.1
    assert result["sides"]["muon"]["min_bpb"] == 0.9
    assert set(result["ratios"]) == {"adamw / nanoGPT-bpe", "muon / nanoGPT-bpe", "muon / adamw"}
    r = result["ratios"]["muon / adamw"]
    assert r["ratio_of_medians"] == pytest.approx(1.0 / 1.1)
    assert r["paired"] == pytest.approx([0.9, 1.0, 1.0 / 1.1])
    assert r["paired_median"] == pytest.approx(1.0 / 1.1)


def test_later_rounds_continue_the_rotation():
    a, b, c = Side("a", "bpe", []), Side("b", "bpe", []), Side("nanoGPT-bpe", "bpe")

    def names(order):
        return [(n, side.name) for n, side in order]

    five = names(round_order([a, b, c], 1, 5))
    assert five[:3] == [(1, "a"), (1, "b"), (1, "nanoGPT-bpe")]
    assert five[3:6] == [(2, "b"), (2, "nanoGPT-bpe"), (2, "a")]
    # Rounds 4 and 5 run alone are the same rounds, in the same order, as in a run of five.
    assert names(round_order([a, b, c], 1, 3)) + names(round_order([a, b, c], 4, 2)) == five
