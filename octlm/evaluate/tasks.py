"""Multiple-choice tasks scored by the model, as lm-evaluation-harness scores them: which
continuation of a context the model finds likeliest (`acc`), and likeliest per character of the
continuation (`acc_norm`, lm-eval's length-normalised accuracy).

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

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from octlm.errors import OctlmError
from octlm.tokenizer.core import Tokenizer

BATCH = 16
SHIPPED = Path(__file__).resolve().parents[1] / "assets" / "tasks"
"""Tasks octlm ships, named by their stem: next_line, "which line follows this one" among four
lines of the works the embedded corpus' default split holds out (scripts/build_tasks.py)."""


@dataclass(frozen=True)
class Question:
    context: str
    choices: tuple[str, ...]
    gold: int
    delimiter: str = " "


@dataclass(frozen=True)
class Task:
    name: str
    questions: tuple[Question, ...]


@dataclass(frozen=True)
class TaskScore:
    acc: float
    acc_norm: float
    questions: int


def question_of(record: dict, where: str) -> Question:
    """One line of a task file, in any of the three layouts (see the module docstring)."""
    if "ctx" in record and "endings" in record:  # HellaSwag
        return Question(record["ctx"], tuple(record["endings"]), int(record["label"]))
    if "answerKey" in record:  # ARC
        labels, texts = record["choices"]["label"], record["choices"]["text"]
        context = f"Question: {record['question']}\nAnswer:"
        return Question(context, tuple(texts), labels.index(record["answerKey"]))
    if not {"context", "choices", "gold"} <= set(record):
        raise OctlmError(
            f"{where} has none of the task layouts (keys {sorted(record)})",
            'write {"context": ..., "choices": [...], "gold": N} (or HellaSwag or ARC lines)',
        )
    return Question(
        record["context"],
        tuple(record["choices"]),
        int(record["gold"]),
        record.get("delimiter", " "),
    )


def read_task(spec: str) -> Task:
    """`FILE` or `FILE:N` (its first N questions) as a Task named by the file's stem."""
    path, _, count = spec.rpartition(":") if spec.rpartition(":")[2].isdigit() else (spec, "", "")
    limit = int(count) if count else None
    file = Path(path)
    if not file.is_file() and (SHIPPED / f"{path}.jsonl").is_file():
        file = SHIPPED / f"{path}.jsonl"
    if not file.is_file():
        shipped = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.jsonl")))
        raise OctlmError(
            f"task file {file} does not exist",
            f"pass a JSON-lines task file, or a task octlm ships: {shipped}",
        )
    questions = []
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if limit is not None and len(questions) == limit:
                break
            if not line.strip():
                continue
            where = f"{file}:{number}"
            try:
                question = question_of(json.loads(line), where)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
                raise OctlmError(
                    f"{where} is not a task question ({exc})", "fix that line of the task file"
                ) from None
            if not question.choices or not 0 <= question.gold < len(question.choices):
                raise OctlmError(f"{where}: gold {question.gold} is not one of the choices",
                                 "give the index of the right choice, from 0")  # fmt: skip
            questions.append(question)
    if not questions:
        raise OctlmError(f"task file {file} holds no question", "add questions, one per line")
    return Task(file.stem, tuple(questions))


def read_tasks(specs: str) -> list[Task]:
    """`FILE[:N],FILE[:N]` as tasks; two of one name are refused (their numbers would mix)."""
    tasks = [read_task(s.strip()) for s in specs.split(",") if s.strip()]
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise OctlmError("two task files share a name", "rename one (the name is the file's stem)")
    return tasks


def encode_pair(tok: Tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split: trailing spaces of the context go to the continuation; the continuation's
    tokens follow the context's in the encoding of both together; BOS first when there is one."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    start = [] if tok.bos_id is None else [tok.bos_id]
    whole = start + tok.encode(context + continuation, add_special_tokens=False)
    head = start + tok.encode(context, add_special_tokens=False)
    return head, whole[len(head) :]


@torch.no_grad()
def logliks(
    model: nn.Module, pairs: list[tuple[list[int], list[int]]], context: int, device: torch.device
) -> list[float]:
    """Sum of log-probabilities of each continuation after its context (cut from the left so
    that context + continuation - 1 tokens fit `context` positions), in batches of BATCH."""
    out: list[float] = []
    for i in range(0, len(pairs), BATCH):
        rows = []
        for head, tail in pairs[i : i + BATCH]:
            ids = (head + tail)[-(context + 1) :]
            # A continuation longer than the context itself is scored on its last tokens.
            rows.append((ids, min(len(tail), len(ids) - 1)))
        width = max(len(ids) - 1 for ids, _ in rows)
        x = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (ids, _) in enumerate(rows):
            x[r, : len(ids) - 1] = torch.tensor(ids[:-1])
        logp = F.log_softmax(model(x.to(device)).float(), dim=-1).cpu()
        for r, (ids, n) in enumerate(rows):
            targets = torch.tensor(ids[-n:])
            positions = torch.arange(len(ids) - 1 - n, len(ids) - 1)
            out.append(float(logp[r, positions, targets].sum()))
    return out


def score_task(
    model: nn.Module, task: Task, tok: Tokenizer, context: int, device: torch.device
) -> TaskScore:
    """acc and acc_norm of `model` on `task` (eval mode, generators untouched)."""
    pairs = [
        encode_pair(tok, q.context, q.delimiter + c) for q in task.questions for c in q.choices
    ]
    was_training = model.training
    model.eval()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        scores = logliks(model, pairs, context, device)
    model.train(was_training)
    right = right_norm = 0
    at = 0
    for q in task.questions:
        ll = scores[at : at + len(q.choices)]
        at += len(q.choices)
        # lm-eval divides by the choice's characters, its delimiter not counted.
        norm = [x / max(1, len(c)) for x, c in zip(ll, q.choices, strict=True)]
        right += int(max(range(len(ll)), key=ll.__getitem__) == q.gold)
        right_norm += int(max(range(len(norm)), key=norm.__getitem__) == q.gold)
    n = len(task.questions)
    return TaskScore(right / n, right_norm / n, n)


def task_fields(scores: dict[str, TaskScore]) -> dict[str, float]:
    """Flat log fields: `acc/NAME` and `acc_norm/NAME` (trackers chart them as `val/acc/NAME`)."""
    out: dict[str, float] = {}
    for name, s in scores.items():
        out[f"acc/{name}"], out[f"acc_norm/{name}"] = s.acc, s.acc_norm
    return out
