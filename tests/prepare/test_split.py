"""The split rule: limits by document count, fraction and tokens, from ids alone; the streamed
prepare and the in-memory split_documents agree."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from octlm.data.shards import ShardDataset
from octlm.errors import DataError
from octlm.hashing import sha256_json
from octlm.prepare.corpus import split_documents
from octlm.prepare.split import CANDIDATE, VAL, KeyTable, SplitRule, plan_split, take_tokens
from octlm.prepare.text import PrepareConfig, prepare
from octlm.tokenizer.core import Tokenizer


def table(ids: list[str], chars: int = 10) -> KeyTable:
    keys = KeyTable()
    for i in ids:
        keys.add(i, chars)
    return keys


def by_hash(ids: list[str]) -> list[str]:
    return sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())


def test_the_key_order_is_the_hex_digest_order():
    ids = [f"doc-{i}" for i in range(500)]
    keys = table(ids)
    assert [ids[i] for i in keys.ranking()] == by_hash(ids)


@pytest.mark.parametrize("n_val", [1, 7, 99])
def test_val_docs_takes_that_many_smallest_hashes(n_val):
    ids = [f"d{i}" for i in range(100)]
    labels = plan_split(table(ids), SplitRule(val_fraction=None, val_docs=n_val, val_tokens=None))
    assert {ids[i] for i in np.flatnonzero(labels.labels == VAL)} == set(by_hash(ids)[:n_val])


def test_val_docs_must_leave_a_training_document():
    with pytest.raises(DataError, match="leaves no training document"):
        plan_split(table(["a", "b"]), SplitRule(val_fraction=None, val_docs=2, val_tokens=None))


def test_fraction_and_docs_together_are_refused():
    with pytest.raises(DataError, match="pass one of them"):
        SplitRule(val_fraction=0.1, val_docs=3)


@pytest.mark.parametrize("bad", [{"val_docs": 0}, {"val_tokens": -1}, {"val_fraction": 1.0}])
def test_non_positive_limits_are_refused(bad):
    rule = {"val_fraction": None, "val_docs": None, "val_tokens": None} | bad
    with pytest.raises(DataError):
        SplitRule(**rule)


def test_split_documents_is_plan_split_by_fraction(corpus_docs):
    keys = table([d.id for d in corpus_docs])
    plan = plan_split(keys, SplitRule(val_fraction=0.1, val_tokens=None))
    _, val = split_documents(corpus_docs, 0.1)
    assert [d.id for d in val] == [corpus_docs[i].id for i in np.flatnonzero(plan.labels == VAL)]


def test_a_token_limit_marks_candidates_until_enough_characters():
    ids = [f"d{i}" for i in range(1000)]
    plan = plan_split(table(ids, chars=100), SplitRule(val_fraction=0.5, val_tokens=50))
    # 8 chars per token asked for: 400 characters, so the 4 smallest hashes are candidates.
    cands = [ids[i] for i in np.flatnonzero(plan.labels == CANDIDATE)]
    assert set(cands) == set(by_hash(ids)[:4])
    assert sorted(plan.ranks.values()) == list(range(4)) and plan.cut_by_chars


def test_a_token_limit_that_could_take_half_the_corpus_is_refused():
    with pytest.raises(DataError, match="could need half of this corpus"):
        plan_split(
            table([f"d{i}" for i in range(100)]), SplitRule(val_fraction=None, val_tokens=70)
        )


def test_take_tokens_stops_at_the_document_that_reaches_the_limit():
    ranks, tokens = [3, 0, 2, 1], [10, 40, 5, 30]
    # by rank: position 1 (40 tokens), 3 (30): 70 >= 60 -> stop.
    assert take_tokens(ranks, tokens, 60) == {1, 3}
    assert take_tokens(ranks, tokens, 40) == {1}
    assert take_tokens(ranks, tokens, 10**9) == {0, 1, 2, 3}


def write_corpus(path, n_docs: int, words: int) -> list[tuple[str, str]]:
    docs = [
        (f"doc{i:04d}", " ".join(f"w{(i * 7 + j) % 97}" for j in range(words)))
        for i in range(n_docs)
    ]
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs))
    return docs


def test_prepare_with_val_tokens_holds_out_just_enough_documents(tmp_path):
    corpus = tmp_path / "c.jsonl"
    docs = write_corpus(corpus, 200, 60)
    rule = SplitRule(val_fraction=None, val_tokens=1000)
    cfg = PrepareConfig(
        out=tmp_path / "d", inputs=(str(corpus),), split=rule, vocab_size=300, context=8, workers=1
    )
    manifest = prepare(cfg, progress=False)
    tokenizer = Tokenizer.load(tmp_path / "d" / "tokenizer.json")
    tokens = {i: len(tokenizer.encode(t)) for i, t in docs}
    text = dict(docs)
    ranked = by_hash(list(text))
    # Validation: the smallest hashes until 1000 tokens; the last one taken reaches the limit.
    n = next(k for k in range(1, 201) if sum(tokens[i] for i in ranked[:k]) >= 1000)
    val_ids = set(ranked[:n])
    in_order = [i for i, _ in docs]
    val = manifest["splits"]["val"]
    assert val["documents"] == n and val["tokens"] == sum(tokens[i] for i in val_ids)
    assert val["document_ids_sha256"] == sha256_json([i for i in in_order if i in val_ids])
    # Candidates (hash prefix until 8 x 1000 characters) validation did not take go to the
    # end of training, in input order.
    chars = np.cumsum([len(text[i]) for i in ranked])
    candidates = {i for k, i in enumerate(ranked) if (chars[k] - len(text[i])) < 8_000}
    assert len(candidates) > n  # the test covers leftovers
    train_order = [i for i in in_order if i not in candidates] + [
        i for i in in_order if i in candidates and i not in val_ids
    ]
    assert manifest["splits"]["train"]["document_ids_sha256"] == sha256_json(train_order)
    assert len(ShardDataset.open(tmp_path / "d").val) == val["tokens"]
    assert manifest["split_rule"] == {"val_fraction": None, "val_docs": None, "val_tokens": 1000}


def test_default_rule_is_a_tenth_capped_at_ten_million_tokens():
    rule = SplitRule()
    assert (rule.val_fraction, rule.val_docs, rule.val_tokens) == (0.1, None, 10_000_000)
