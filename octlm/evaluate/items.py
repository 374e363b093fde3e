"""One evaluation item in any of the standard formats, and a task as a list of them.

The formats (how the field scores a small model without sampling):

- `mc`: multiple choice, one context and one continuation per choice; scored by the summed
  log-likelihood (`acc`), per character of the choice (`acc_norm`, lm-eval's), and per token
  (`acc_mean`, the lowest mean loss: CORE's rule for multiple choice);
- `schema`: Winograd style, one context per option and one shared continuation; the option
  under which the continuation is likeliest (CORE's rule for Winograd/Winogrande);
- `lm`: language-modelling exact match, one context and its gold continuation; right when
  greedy decoding reproduces every token of the continuation (CORE's rule for LAMBADA, SQuAD,
  CoQA, Jeopardy);
- `bpb`: the gold continuation's bits per byte (OLMo's small-compute metric): no right or
  wrong, a number per item, lower is better.

`shots` are worked examples, already rendered as text, put before the item's context(s) with
`shot_separator` between them (CORE: a blank line).
"""

from __future__ import annotations

from dataclasses import dataclass

FORMATS = ("mc", "schema", "lm", "bpb")


@dataclass(frozen=True)
class Item:
    contexts: tuple[str, ...]
    """One context; for `schema` one per option."""
    continuations: tuple[str, ...]
    """One per choice (`mc`); one shared (`schema`); the gold one (`lm`, `bpb`)."""
    gold: int = 0
    """The right choice (`mc`) or option (`schema`); 0 for `lm` and `bpb`."""
    kind: str = "mc"
    delimiter: str = " "
    """Between a context and a continuation."""
    shots: tuple[str, ...] = ()
    """Worked examples put first, in this order."""
    shot_separator: str = "\n\n"

    def __post_init__(self) -> None:
        if self.kind not in FORMATS:
            raise ValueError(f"unknown item format {self.kind!r}")
        options = len(self.contexts) if self.kind == "schema" else len(self.continuations)
        if not self.contexts or not self.continuations or not 0 <= self.gold < options:
            raise ValueError(f"a {self.kind} item needs its texts and a gold in range")

    @property
    def options(self) -> int:
        """How many answers the item chooses among (1 for `lm` and `bpb`)."""
        if self.kind == "schema":
            return len(self.contexts)
        return len(self.continuations) if self.kind == "mc" else 1

    def prompt(self, context: str) -> str:
        """`context` after the worked examples."""
        return "".join(shot + self.shot_separator for shot in self.shots) + context

    def pairs(self) -> list[tuple[str, str]]:
        """(full context, continuation) for each option, in option order."""
        if self.kind == "schema":
            return [(self.prompt(c), self.delimiter + self.continuations[0]) for c in self.contexts]
        if self.kind == "mc":
            return [(self.prompt(self.contexts[0]), self.delimiter + c) for c in self.continuations]
        return [(self.prompt(self.contexts[0]), self.delimiter + self.continuations[0])]


def item_problem(item: Item, choices: str = "choices") -> tuple[str, str] | None:
    """(field, what is wrong) for an item the scorer cannot score, None for a sound one: a
    choice needs another to be chosen over (mc: two choices or more; schema: two contexts or
    more), and every option needs text to score (its delimiter and continuation not both
    empty). Checked when a task file or a suite's file is read, with the file and line;
    `choices` is the name the file's layout gives an mc item's choices."""
    if item.kind == "mc" and item.options < 2:
        return choices, "holds 1 choice; a multiple-choice item needs 2 or more"
    if item.kind == "schema" and item.options < 2:
        return "contexts", "holds 1 context; a schema item needs 2 or more, one per option"
    for at, continuation in enumerate(item.continuations):
        if not item.delimiter + continuation:
            where = f"{choices}[{at}]" if item.kind == "mc" else "continuation"
            return where, "is empty and so is the delimiter: there is no text to score"
    return None


@dataclass(frozen=True)
class CategoricalTask:
    """The task protocol's categorical kind (`octlm/evaluate/protocol.py`): a named list of
    items whose options are scored, never sampled (a suite's task, a fixed seeded subset when
    capped; a task file), and the chance level its centered score is measured from."""

    name: str
    items: tuple[Item, ...]
    baseline: float = 0.0
    """Chance accuracy: centered = (acc - baseline) / (1 - baseline). 0 for lm and bpb."""
    source: str = ""
    """Where the items come from (the package's file), for the report and the docs."""
    metrics: str = "core"
    """What its score reports: "core" (the format's accuracy, centered, and bpb) or "lm-eval"
    (acc and acc_norm, lm-eval's: octlm's multiple-choice layouts)."""


def centered(acc: float, baseline: float) -> float:
    """CORE's centered accuracy: 0 at chance, 1 when every item is right."""
    return (acc - baseline) / (1.0 - baseline)
