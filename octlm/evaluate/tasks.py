"""Task files: the categorical tasks (`protocol.py`) a user writes or octlm ships, read line by
line. Octlm's multiple-choice layouts are scored as lm-evaluation-harness scores them: which
continuation of a context the model finds likeliest (`acc`), and likeliest per character of the
continuation (`acc_norm`, lm-eval's length-normalised accuracy), by `scoring.py`'s one scorer.

A task is a JSON-lines file, one question a line, in one of three layouts:

- octlm's (the one docs/evaluation.md's lm-eval walkthrough uses): `{"context": str,
  "choices": [str, ...], "gold": int}`, and optionally `"delimiter"` (default " ");
- HellaSwag's: `{"ctx": str, "endings": [str, ...], "label": int or "0".."3"}`;
- ARC's: `{"question": str, "choices": {"text": [...], "label": [...]}, "answerKey": str}`
  (scored as "Question: ...\\nAnswer:" then " " + choice, as lm-eval's arc tasks do).

A task octlm ships is named without a path (`next_line`: see SHIPPED). `FILE:N` takes the
first N questions: a fixed subset, so two evaluations of a run differ only
because the model changed. Each choice is scored as lm-eval scores it: trailing spaces of the
context move to the continuation, the continuation's tokens are those that follow the context's
in the encoding of both together, the log-likelihood is the sum of their log-probabilities
after BOS (when the tokenizer has one) and the context (cut from the left to fit the model).
Scoring runs in eval mode under no_grad inside `fork_rng`: it never moves a training bit.
"""

from __future__ import annotations

import io
import json
import unicodedata
from pathlib import Path

from octlm.config.checks import Int, shown
from octlm.config.run import TASKS_FIX, task_spec
from octlm.errors import OctlmError
from octlm.evaluate.fields import (
    LINE_FIX,
    TaskLineError,
    index_field,
    text_field,
    texts_field,
)
from octlm.evaluate.item_lines import chance, item_of
from octlm.evaluate.items import CategoricalTask, Item, item_problem
from octlm.evaluate.suites import SUITES

SHOWN_PATH = 200
"""An error line shows at most this much of a path (a spec may be thousands of characters)."""
SHIPPED = Path(__file__).resolve().parents[1] / "assets" / "tasks"
"""Tasks octlm ships, named by their stem: next_line, "which line follows this one" among four
lines of the works the embedded corpus' default split holds out (scripts/build_tasks.py)."""


def question_of(record: object) -> Item:
    """One line of a task file, in any of the three layouts (see the module docstring), as an
    mc item; a TaskLineError names the field that is wrong."""
    if not isinstance(record, dict):
        raise OctlmError(f"is not a JSON object but {shown(record)}", LINE_FIX)
    if "ctx" in record or "endings" in record:  # HellaSwag
        endings = texts_field(record, "endings")
        return Item(
            (text_field(record, "ctx"),), endings, index_field(record, "label", len(endings))
        )
    if "answerKey" in record or "question" in record:  # ARC
        return arc_question(record)
    if not {"context", "choices", "gold"} & set(record):
        raise OctlmError(
            f"has none of the task layouts (keys {shown(sorted(record))})",
            'write {"context": ..., "choices": [...], "gold": N} (or HellaSwag or ARC lines)',
        )
    choices = texts_field(record, "choices")
    gold = index_field(record, "gold", len(choices))
    return Item(
        (text_field(record, "context"),), choices, gold, "mc", text_field(record, "delimiter", " ")
    )


def choices_key(record: dict) -> str:
    """What a multiple-choice line's layout calls its choices (for an error line)."""
    if "endings" in record:
        return "endings"
    return "choices.text" if isinstance(record.get("choices"), dict) else "choices"


def arc_question(record: dict) -> Item:
    question, table = text_field(record, "question"), record.get("choices")
    if not isinstance(table, dict):
        raise TaskLineError(
            "choices", f'must be {{"text": [...], "label": [...]}}, not {shown(table)}'
        )
    texts, labels = texts_field(table, "text", "choices."), texts_field(table, "label", "choices.")
    if len(labels) != len(texts) or len(set(labels)) != len(labels):
        raise TaskLineError("choices.label", f"must be {len(texts)} distinct labels, one per text")
    key = text_field(record, "answerKey")
    if key not in labels:
        raise TaskLineError(
            "answerKey", f"{shown(key)} is not one of the labels {shown(list(labels))}"
        )
    return Item((f"Question: {question}\nAnswer:",), texts, labels.index(key))


def shown_path(path: Path | str) -> str:
    """A path as an error line shows it: as written, or escaped if it holds what a terminal
    would not print (a newline, a right-to-left override)."""
    text = str(path)
    text = text if text.isprintable() else ascii(text)
    return text if len(text) <= SHOWN_PATH else text[: SHOWN_PATH - 3] + "..."


def is_file(path: Path, or_folder: bool = False) -> bool:
    """Whether `path` is a file (or anything, with `or_folder`); False for a name the system
    refuses to look up (too long, say), which `Path.is_file` raises for."""
    try:
        return path.exists() if or_folder else path.is_file()
    except OSError:
        return False


def task_file(path: str) -> Path:
    """The file a task spec names: a path, else a task octlm ships."""
    file = Path(path)
    if not is_file(file) and is_file(SHIPPED / f"{path}.jsonl"):
        return SHIPPED / f"{path}.jsonl"
    if is_file(file):
        name = file.stem
        if not name or any(unicodedata.category(c)[0] == "C" or c in "\u2028\u2029" for c in name):
            raise OctlmError(
                f"task file {shown_path(file)}: its name {ascii(name)} holds a control or "
                "invisible character, and names the task in the log",
                "rename the file (the task's name is the file's stem)",
            )
        return file
    head, colon, tail = path.rpartition(":")
    if colon and is_file(Path(head)):
        raise OctlmError(
            f"task file {shown_path(head)}: N={shown(tail)} must be {Int(1)}", TASKS_FIX
        )
    shipped = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.jsonl")))
    what = "is not a file" if is_file(file, or_folder=True) else "does not exist"
    raise OctlmError(
        f"task file {shown_path(file)} {what}",
        f"pass a JSON-lines task file, or a task octlm ships: {shipped} (a verifiable task "
        "such as addition:2 is sampled, not scored in training: octlm eval RUN --tasks NAME)",
    )


def task_lines(file: Path) -> list[tuple[int, str]]:
    """(line number, text) of each non-blank line of a task file, read as UTF-8."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise OctlmError(f"cannot read task file {shown_path(file)} ({exc.strerror})",
                         "make it readable") from None  # fmt: skip
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise OctlmError(
            f"{shown_path(file)}:{line} is not UTF-8 (byte {data[exc.start]:#04x})",
            "save the task file as UTF-8",
        ) from None
    lines = io.StringIO(text, newline=None)
    return [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]


def read_task(spec: str) -> CategoricalTask:
    """`FILE` or `FILE:N` (its first N questions) as a task named by the file's stem."""
    return load_task(*task_spec("task", spec.strip()))


def load_task(path: str, limit: int | None) -> CategoricalTask:
    """The first `limit` questions (all: None) of a task file or shipped task, each line
    checked field by field: an error names the file, the line and the field. One layout per
    file: octlm's multiple-choice layouts (`question`: scored as lm-eval scores them) or one
    standard format (a line with "format")."""
    file = task_file(path)
    items: list[Item] = []
    layouts: list[str] = []
    for number, line in task_lines(file):
        if limit is not None and len(items) == limit:
            break
        where = f"{shown_path(file)}:{number}"
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise OctlmError(
                f"{where} is not a task question ({shown(str(exc))})", LINE_FIX
            ) from None
        try:
            standard = isinstance(record, dict) and "format" in record
            items.append(item_of(record) if standard else question_of(record))
            degenerate = item_problem(items[-1], "choices" if standard else choices_key(record))
            if degenerate is not None:  # the scorer would divide by zero or index nothing
                raise TaskLineError(*degenerate)
            layouts.append(items[-1].kind if standard else "question")
            if layouts[-1] != layouts[0]:
                raise OctlmError(
                    f"is a {layouts[-1]} line in a file of {layouts[0]}",
                    "give each format its own task file",
                )
        except OctlmError as exc:
            raise OctlmError(f"{where}: {exc.problem}", exc.fix) from None
    if not items:
        raise OctlmError(
            f"task file {shown_path(file)} holds no question", "add questions, one per line"
        )
    metrics = "lm-eval" if layouts[0] == "question" else "core"
    return CategoricalTask(file.stem, tuple(items), chance(tuple(items)), shown_path(file), metrics)


def is_suite(spec: str) -> bool:
    """Whether one spec names a standard suite (`SUITE[/TASK][:N]`), not a task file (a file
    of that name wins)."""
    name = spec.strip().partition(":")[0]
    return name.partition("/")[0] in SUITES and not is_file(Path(name))
