"""The one scorer of categorical tasks (octlm's multiple-choice files, the suites, files in their
formats): each item's chosen answer by its format's rule (mc with lm-eval's acc and acc_norm
beside), each task's metric and centered score, and the suite's aggregate (CORE: the mean
centered accuracy).

Scoring runs in eval mode under no_grad inside `fork_rng`: it never moves a training bit, and
the same model scores the same items to the same numbers (the batches are fixed by the items'
order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from octlm.evaluate.items import CategoricalTask, Item, centered
from octlm.evaluate.likelihood import Continuation, encode_pair, scored_quietly
from octlm.tokenizer.core import Tokenizer


@dataclass(frozen=True)
class ItemResult:
    chosen: int
    """The option picked (mc: lowest mean loss per token; schema: likeliest continuation; lm
    and bpb: 0)."""
    right: bool
    """mc and schema: chosen == gold; lm: greedy decoding reproduces the continuation; bpb:
    False (no right or wrong)."""
    bpb: float
    """The gold continuation's bits per byte (its delimiter counted)."""
    acc_sum: bool = False
    """mc: the summed log-likelihood picks the gold (lm-eval's acc)."""
    acc_char: bool = False
    """mc: the log-likelihood per character picks the gold (lm-eval's acc_norm)."""


@dataclass(frozen=True)
class TaskResult:
    name: str
    kind: str
    items: int
    metric: float
    """mc, schema, lm: accuracy; bpb: the mean bits per byte over items."""
    centered: float | None
    """(accuracy - chance) / (1 - chance); None for bpb."""
    baseline: float
    bpb: float
    """The mean gold bits per byte (every format)."""
    acc_sum: float | None = None
    """mc: lm-eval's acc (the summed log-likelihood picks the gold)."""
    acc_char: float | None = None
    """mc: lm-eval's acc_norm (the log-likelihood per character picks the gold)."""
    per_item: tuple[ItemResult, ...] = ()
    metrics: str = "core"
    """The task's `metrics`: what its line and log fields show."""


def judge(item: Item, scored: list[Continuation], texts: list[str]) -> ItemResult:
    """One item's result from its options' numbers (`texts`: each option's continuation)."""
    gold_text = texts[item.gold] if item.kind != "schema" else texts[0]
    gold = scored[item.gold]
    bpb = -gold.loglik / (math.log(2) * max(1, len(gold_text.encode("utf-8"))))
    if item.kind in ("lm", "bpb"):
        return ItemResult(0, item.kind == "lm" and gold.greedy, bpb)
    if item.kind == "schema":  # the option under which the shared continuation is likeliest
        chosen = max(range(len(scored)), key=lambda i: scored[i].loglik / max(1, scored[i].tokens))
        return ItemResult(chosen, chosen == item.gold, bpb)
    mean = max(range(len(scored)), key=lambda i: scored[i].loglik / max(1, scored[i].tokens))
    total = max(range(len(scored)), key=lambda i: scored[i].loglik)
    # lm-eval divides by the choice's characters, its delimiter not counted.
    chars = [s.loglik / max(1, len(c)) for s, c in zip(scored, item.continuations, strict=True)]
    per_char = max(range(len(scored)), key=chars.__getitem__)
    return ItemResult(mean, mean == item.gold, bpb, total == item.gold, per_char == item.gold)


def score_categorical(
    model: nn.Module, task: CategoricalTask, tok: Tokenizer, context: int, device: torch.device
) -> TaskResult:
    """`task` scored by `model` (eval mode, generators untouched)."""
    pairs, texts = [], []
    for item in task.items:
        for ctx, cont in item.pairs():
            pairs.append(encode_pair(tok, ctx, cont))
            texts.append(cont)
    scored = scored_quietly(model, pairs, context, device)
    results, at = [], 0
    for item in task.items:
        n = len(item.pairs())
        results.append(judge(item, scored[at : at + n], texts[at : at + n]))
        at += n
    return summarise(task, tuple(results))


def summarise(task: CategoricalTask, results: tuple[ItemResult, ...]) -> TaskResult:
    n = len(results)
    kind = task.items[0].kind
    bpb = sum(r.bpb for r in results) / n
    if kind == "bpb":
        return TaskResult(
            task.name, kind, n, bpb, None, 0.0, bpb, per_item=results, metrics=task.metrics
        )
    acc = sum(r.right for r in results) / n
    sums = sum(r.acc_sum for r in results) / n if kind == "mc" else None
    chars = sum(r.acc_char for r in results) / n if kind == "mc" else None
    score = centered(acc, task.baseline)
    numbers = (acc, score, task.baseline, bpb, sums, chars, results, task.metrics)
    return TaskResult(task.name, kind, n, *numbers)


def aggregate(results: list[TaskResult]) -> dict[str, float]:
    """The suite's numbers: `centered` (CORE's: the mean centered accuracy over the accuracy
    tasks) and `bpb` (the mean bits per byte over the bpb tasks), each when it has tasks."""
    out: dict[str, float] = {}
    graded = [r.centered for r in results if r.centered is not None]
    if graded:
        out["centered"] = sum(graded) / len(graded)
    bits = [r.metric for r in results if r.kind == "bpb"]
    if bits:
        out["bpb"] = sum(bits) / len(bits)
    return out
