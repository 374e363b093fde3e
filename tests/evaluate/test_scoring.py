"""Tests for octlm.evaluate.scoring on every item format: each item's chosen answer and numbers
equal an independent implementation (one forward per option of octlm's model, and the same
rule on the logits of the model exported to transformers' Llama), the scores repeat, and the
model's mode and the generators are left as they were."""

from __future__ import annotations

import math

import pytest
import torch

from octlm.evaluate.items import CategoricalTask, Item, centered
from octlm.evaluate.likelihood import encode_pair
from octlm.evaluate.scoring import aggregate, score_categorical
from octlm.model.gpt import GPT
from octlm.model.hf import hf_config, hf_state_dict
from tests.unit_model import unit_config

WORDS = ["the king", "a horse", "my lord", "good night", "sweet love", "the sea", "of war"]


def items_of(kind: str) -> tuple[Item, ...]:
    if kind == "mc":
        return tuple(
            Item(
                (f"{WORDS[i]} and",),
                tuple(w + "!" * (i % 3) for w in WORDS[:4]),
                i % 4,
                shots=(f"{WORDS[5]} and {WORDS[6]}",) * (i % 2),
            )  # fmt: skip
            for i in range(6)
        )
    if kind == "schema":
        return tuple(
            Item(
                (f"{WORDS[i]} met {WORDS[j]}", f"{WORDS[j]} met {WORDS[i]}"),
                ("at the sea",),
                (i + j) % 2,
                kind="schema",
            )  # fmt: skip
            for i, j in [(0, 1), (2, 3), (4, 5), (1, 6)]
        )
    return tuple(Item((f"{WORDS[i]} said",), (WORDS[i + 1],), kind=kind) for i in range(5))


def brute(model: GPT, tok, item: Item) -> list[tuple[float, int, bool]]:
    """(loglik, tokens, greedy) per option, one forward each."""
    out = []
    with torch.no_grad():
        for ctx, cont in item.pairs():
            head, tail = encode_pair(tok, ctx, cont)
            ids = torch.tensor([head + tail])
            logp = torch.log_softmax(model(ids[:, :-1]).float(), -1)[0, len(head) - 1 :]
            targets = ids[0, len(head) :]
            picked = logp.gather(1, targets[:, None])
            out.append((float(picked.sum()), len(tail), bool((logp.argmax(-1) == targets).all())))
    return out


def expected(item: Item, numbers: list[tuple[float, int, bool]]) -> tuple[int, bool]:
    if item.kind in ("lm", "bpb"):
        return 0, item.kind == "lm" and numbers[0][2]
    chosen = max(range(len(numbers)), key=lambda i: numbers[i][0] / numbers[i][1])
    return chosen, chosen == item.gold


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(unit_config(64)).train()


@pytest.mark.parametrize("kind", ["mc", "schema", "lm", "bpb"])
def test_each_item_is_judged_as_one_forward_per_option_judges_it(model, tiny_tokenizer, kind):
    task = CategoricalTask(kind, items_of(kind), baseline=0.25 if kind == "mc" else 0.0)
    state = torch.get_rng_state()
    result = score_categorical(model, task, tiny_tokenizer, 64, torch.device("cpu"))
    assert model.training and torch.equal(state, torch.get_rng_state())
    again = score_categorical(model, task, tiny_tokenizer, 64, torch.device("cpu"))
    assert again == result
    model.eval()
    for item, got in zip(task.items, result.per_item, strict=True):
        numbers = brute(model, tiny_tokenizer, item)
        chosen, right = expected(item, numbers)
        assert (got.chosen, got.right) == (chosen, right)
        gold_text = item.pairs()[item.gold if kind != "schema" else 0][1]
        bpb = -numbers[item.gold][0] / (math.log(2) * len(gold_text.encode()))
        assert got.bpb == pytest.approx(bpb, rel=1e-5)
    model.train()
    if kind == "bpb":
        assert result.centered is None and aggregate([result]) == {"bpb": result.metric}
    else:
        assert result.centered == centered(result.metric, task.baseline)


def test_greedy_exact_match_is_right_on_the_models_own_continuation(model, tiny_tokenizer):
    """The control for `lm`: the model's own greedy tokens are right; another word is not."""
    model.eval()
    head = encode_pair(tiny_tokenizer, "the king said", "")[0]
    ids = list(head)
    with torch.no_grad():
        for _ in range(3):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    own = tiny_tokenizer.decode(ids[len(head) :])
    model.train()
    items = (Item(("the king said",), (own,), delimiter=""), Item(("the king said",), (" zz",)))
    result = score_categorical(model, CategoricalTask("lm", tuple(
        Item(i.contexts, i.continuations, kind="lm", delimiter=i.delimiter) for i in items
    )), tiny_tokenizer, 64, torch.device("cpu"))  # fmt: skip
    assert [r.right for r in result.per_item] == [True, False]


@pytest.mark.parametrize("kind", ["mc", "schema", "lm", "bpb"])
def test_the_choices_equal_transformers_on_the_export(model, tiny_tokenizer, kind):
    """The same items scored from the logits of the model exported to transformers' Llama:
    every item's chosen answer is the same, and the numbers agree to float tolerance."""
    transformers = pytest.importorskip("transformers")
    cfg = model.config
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_config(cfg)))
    missing = hf.load_state_dict(hf_state_dict(model.state_dict(), cfg.n_layers), strict=False)
    assert set(missing.missing_keys) <= {"lm_head.weight"}  # tied to the embedding
    hf.tie_weights()
    hf.eval()
    task = CategoricalTask(kind, items_of(kind))
    ours = score_categorical(model, task, tiny_tokenizer, 64, torch.device("cpu"))

    class Wrapped(torch.nn.Module):  # transformers' logits through octlm's brute force
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return hf(ids).logits

    theirs = Wrapped()
    for item, got in zip(task.items, ours.per_item, strict=True):
        chosen, right = expected(item, brute(theirs, tiny_tokenizer, item))  # type: ignore[arg-type]
        assert (got.chosen, got.right) == (chosen, right)
