"""A task file line in one of the standard formats (`octlm/evaluate/items.py`), marked by its
`"format"` key:

- `{"format": "mc", "context": str, "choices": [str, ...], "gold": int}`
- `{"format": "schema", "contexts": [str, ...], "continuation": str, "gold": int}`
- `{"format": "lm", "context": str, "continuation": str}` (greedy exact match)
- `{"format": "bpb", "context": str, "continuation": str}` (the continuation's bits per byte)

each with an optional `"delimiter"` (default " ") and `"shots"` (worked examples put first, in
order). A file's lines share one format; its chance level, for the centered score, is the mean
of one over each item's options (0 for lm and bpb).
"""

from __future__ import annotations

from octlm.config.checks import shown
from octlm.evaluate.fields import TaskLineError, index_field, text_field, texts_field
from octlm.evaluate.items import FORMATS, Item


def item_of(record: dict) -> Item:
    """One line with a `"format"` key as an Item; a TaskLineError names the wrong field."""
    kind = record.get("format")
    if kind not in FORMATS:
        raise TaskLineError("format", f"{shown(kind)} is not one of {', '.join(FORMATS)}")
    delimiter = text_field(record, "delimiter", " ")
    shots = texts_field(record, "shots") if "shots" in record else ()
    if kind == "mc":
        choices = texts_field(record, "choices")
        gold = index_field(record, "gold", len(choices))
        contexts: tuple[str, ...] = (text_field(record, "context"),)
        return Item(contexts, choices, gold, kind, delimiter, shots)
    if kind == "schema":
        contexts = texts_field(record, "contexts")
        gold = index_field(record, "gold", len(contexts))
        return Item(contexts, (text_field(record, "continuation"),), gold, kind, delimiter, shots)
    context, continuation = text_field(record, "context"), text_field(record, "continuation")
    return Item((context,), (continuation,), 0, kind, delimiter, shots)


def chance(items: tuple[Item, ...]) -> float:
    """The accuracy of guessing: the mean of one over each item's options (0: lm, bpb)."""
    if items[0].kind in ("lm", "bpb"):
        return 0.0
    return sum(1.0 / item.options for item in items) / len(items)
