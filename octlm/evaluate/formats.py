"""One raw row of a standard data set as an `Item`, in the format CORE gives it.

CORE is DCLM's eval gauntlet as nanochat's CORE metric runs it: a multiple-choice item is a
query and its choices after " " (the lowest mean loss per token wins), a schema item is one
context per option and a shared continuation, a language-modelling item is a context (stripped)
and its gold continuation (right when greedy decoding gives every token). The renderings follow
the lm-evaluation-harness conventions CORE's files were written with; where the rows here lead
to a text that differs from CORE's published files, the converter's comment says how, so that
nobody compares one number with the other as if they were the same measurement.

The small-suite's items (`request_item`) are OLMo's own requests, verbatim: the context and the
continuation (leading space included) exactly as OLMo scores them, so no rendering of ours comes
between the file and the score.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from octlm.evaluate.items import Item

UNCONDITIONED = 1_000_000
"""OLMo's rc request files add, from this doc_id on, the choices without their question (for
its `acc_uncond`): not items."""


def as_shot(item: Item) -> str:
    """`item` as a worked example: its context, the delimiter and the gold continuation (CORE's
    rendering; an lm item's context is stripped, as CORE's template trims it)."""
    if item.kind == "schema":
        return item.contexts[item.gold] + item.delimiter + item.continuations[0]
    if item.kind == "mc":
        return item.contexts[0] + item.delimiter + item.continuations[item.gold]
    return item.contexts[0].strip() + item.delimiter + item.continuations[0]


def answer_index(row: dict) -> int:
    """The gold of a row with lettered choices (ARC, CommonsenseQA, OpenBookQA)."""
    return list(row["choices"]["label"]).index(row["answerKey"])


def hellaswag_text(text: str) -> str:
    """HellaSwag's preprocessing (lm-eval's, which CORE's file shows): WikiHow's " [title]"
    becomes ". ", other bracketed tags ("[header]", "[step]") go, double spaces become one."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag(row: dict) -> Item:
    """Activity label, ": ", the context (its second part capitalised); the four endings."""
    context = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    return Item(
        (hellaswag_text(row["activity_label"] + ": " + context),),
        tuple(hellaswag_text(e) for e in row["endings"]),
        int(row["label"]),
    )


def question_answer(row: dict) -> Item:
    """ARC and CommonsenseQA: "Question: {q}\\nAnswer:" then " " + each choice."""
    return Item(
        (f"Question: {row['question']}\nAnswer:",),
        tuple(row["choices"]["text"]),
        answer_index(row),
    )


def openbookqa(row: dict) -> Item:
    """The question stem alone as the context (OpenBookQA's stems are sentence starts)."""
    return Item((row["question_stem"],), tuple(row["choices"]["text"]), answer_index(row))


def piqa(row: dict) -> Item:
    """ "Question: {goal}\\nAnswer:", the two solutions."""
    return Item(
        (f"Question: {row['goal']}\nAnswer:",), (row["sol1"], row["sol2"]), int(row["label"])
    )


def copa(row: dict) -> Item:
    """The premise, its final "." turned into " because" (cause) or " therefore" (effect); each
    choice with its first letter lower-cased, continuing the sentence."""
    connector = {"cause": "because", "effect": "therefore"}[row["question"]]
    premise = row["premise"].strip()
    choices = (row["choice1"], row["choice2"])
    return Item(
        (premise[:-1] + " " + connector,),
        tuple(c[:1].lower() + c[1:] for c in choices),
        int(row["label"]),
    )


def boolq(row: dict) -> Item:
    """lm-eval's "{passage}\\nQuestion: {question}?\\nAnswer:" with " no" / " yes". CORE's file
    may put "Passage: " first (not checked offline): a possible difference of wording."""
    return Item(
        (f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:",),
        ("no", "yes"),
        int(bool(row["answer"])),
    )


def winogrande(row: dict) -> Item:
    """Schema: the sentence up to "_" with each option is a context; the rest after "_"
    (stripped left) the shared continuation."""
    at = row["sentence"].index("_")
    head, tail = row["sentence"][:at], row["sentence"][at + 1 :].lstrip()
    return Item(
        (head + row["option1"], head + row["option2"]),
        (tail,),
        int(row["answer"]) - 1,
        kind="schema",
    )


def lm_item(line: dict) -> Item:
    """A language-modelling item from one line of OLMo's bpb requests: the bare query (no
    instruction, no worked examples: those are ours) and the gold continuation, stripped."""
    query = line["doc"].get("query", line["request"]["context"])
    return Item((query.strip(),), (line["request"]["continuation"].strip(),), kind="lm")


def request_item(lines: list[dict], kind: str) -> Item:
    """OLMo's requests of one doc as one item, verbatim (delimiter ""): `bpb` (one line); an
    rc doc is `mc` when its contexts agree, `schema` when its continuations do (WinoGrande)."""
    contexts = tuple(line["request"]["context"] for line in lines)
    continuations = tuple(line["request"]["continuation"] for line in lines)
    if kind == "bpb":
        return Item(contexts, continuations, kind="bpb", delimiter="")
    gold = int(lines[0]["label"])
    if len(set(contexts)) == 1:
        return Item(contexts[:1], continuations, gold, delimiter="")
    return Item(contexts, continuations[:1], gold, kind="schema", delimiter="")


def rc_docs(lines: list[dict]) -> list[list[dict]]:
    """OLMo's rc requests grouped by doc (in doc order), the unconditioned ones left out."""
    docs: dict[int, list[dict]] = {}
    for line in lines:
        if line["doc_id"] < UNCONDITIONED:
            docs.setdefault(line["doc_id"], []).append(line)
    return [sorted(docs[d], key=lambda line: line["idx"]) for d in sorted(docs)]


ROW_FORMATS: dict[str, Callable[[dict], Item]] = {
    "hellaswag": hellaswag,
    "question_answer": question_answer,
    "openbookqa": openbookqa,
    "piqa": piqa,
    "copa": copa,
    "boolq": boolq,
    "winogrande": winogrande,
    "lm": lm_item,
}
"""The converters by name, for the suite table."""
