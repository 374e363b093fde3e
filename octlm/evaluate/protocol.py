"""The task protocol: the one type each kind of task is, read by `octlm eval --tasks`, `octlm
train --eval-tasks` and the val records, and the one place a task's kind is branched on.

Two kinds, after nanochat's `Task` (categorical and generative; its fine-tune data, its
evaluation and its RL read one type):

- **categorical** (`items.CategoricalTask`): items whose options are scored by the model's
  log-likelihood, never sampled: octlm's multiple-choice files (lm-eval's acc and acc_norm),
  the standard suites and files in their formats (mc, schema, lm, bpb: CORE's and OLMo's
  rules). One scorer, `scoring.score_categorical`, for all of them.
- **generative** (`GenerativeTask`): verifiable problems (`octlm/rl/tasks.py`) whose held-out
  prompts are answered by sampled replies and checked: pass@1 and pass@k. Sampling sits above
  this room (the trainer imports it; `generation/` imports the trainer), so a generative task
  carries its scorer, built by `octlm/rl/heldout.py` `heldout_task`; `read_tasks` is handed
  the resolver of such names by its caller (`octlm eval`; the trainer's `--eval-tasks` has
  none: it scores categorical tasks only).

A spec may mix kinds (`--tasks next_line,addition:2`): each task's numbers are a function of
the weights and its own settings alone (categorical scoring runs in eval mode under
`fork_rng`; a generative task's replies are sampled from generators seeded by (seed, prompt,
reply)), so neither its place in the list nor its company changes a number, and one model
load serves both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from octlm.config.checks import shown
from octlm.config.run import task_specs
from octlm.errors import OctlmError
from octlm.evaluate.items import CategoricalTask
from octlm.evaluate.scoring import TaskResult, aggregate, score_categorical
from octlm.evaluate.suites import suite_tasks
from octlm.evaluate.tasks import is_file, is_suite, load_task
from octlm.tokenizer.core import Tokenizer

KINDS = ("categorical", "generative")


class GenerativeScore(Protocol):
    """pass@1 and pass@k of a generative task (`octlm/rl/heldout.py` `HeldoutScore`): its
    log fields (`pass@1`, `pass@K`, ...) and its printed line."""

    def fields(self) -> dict[str, float | int]: ...

    def line(self) -> str: ...


@dataclass(frozen=True)
class GenerativeTask:
    """A verifiable task scored by sampling: `score(model, tokenizer, context)` samples and
    checks the replies to its held-out prompts with the settings it was built with."""

    name: str
    score: Callable[[nn.Module, Tokenizer, int], GenerativeScore] = field(compare=False)


AnyTask = CategoricalTask | GenerativeTask
AnyScore = TaskResult | GenerativeScore
Resolver = Callable[[str], GenerativeTask | None]
"""A generative task's name -> the task; None for a name that is not one."""


def kind_of(task: AnyTask) -> str:
    return "generative" if isinstance(task, GenerativeTask) else "categorical"


def read_part(part: str, label: str, generative: Resolver | None) -> list:
    """The tasks of one spec of `read_tasks`' list."""
    found = None if generative is None or is_file(Path(part)) else generative(part)
    if found is not None:
        return [found]
    if is_suite(part):
        suite = part.partition("/")[0].partition(":")[0]
        return [replace(t, name=f"{suite}/{t.name}") for t in suite_tasks(part)]
    return [load_task(path, limit) for path, limit in task_specs(label, part)]


def read_tasks(specs: str, label: str = "--tasks", generative: Resolver | None = None) -> list:
    """Comma-separated specs of any kind as tasks (at least one): `FILE[:N]`,
    `SUITE[/TASK][:N]` (its tasks named `SUITE/TASK`) and, with a `generative` resolver, a
    generative task's name (`addition:2`, `count`); a file of the name wins. Two of one name
    are refused (their numbers would mix)."""
    tasks: list[AnyTask] = []
    for part in (p.strip() for p in specs.split(",") if p.strip()):
        try:
            tasks += read_part(part, label, generative)
        except OctlmError as exc:  # the setting named first: which of the command's options
            if label not in exc.problem:
                exc.problem = f"{label}: {exc.problem}"
                exc.args = (exc.message,)
            raise
    if not tasks:
        task_specs(label, specs)  # its one line for a list that names nothing
    names = [t.name for t in tasks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise OctlmError(
            f"two task files share the name {shown(twice[0])}",
            "rename one (the name is the file's stem)",
        )
    suites = {n.partition("/")[0] for n in names if "/" in n}
    clash = sorted(suites & set(names))
    if clash:  # its centered/NAME and bpb/NAME would be the suite's aggregate keys
        raise OctlmError(
            f"task file {shown(clash[0])} is named like the suite beside it: their numbers "
            "would share one key",
            "rename the file (the name is the file's stem)",
        )
    return tasks


def score(
    model: nn.Module, task: AnyTask, tok: Tokenizer, context: int, device: torch.device
) -> AnyScore:
    """`task` scored by `model`, by its kind's rule (see the module docstring)."""
    if isinstance(task, GenerativeTask):
        return task.score(model, tok, context)
    return score_categorical(model, task, tok, context, device)


def task_fields(scores: dict[str, AnyScore]) -> dict[str, float]:
    """Flat log fields (trackers chart them as `val/...`): an lm-eval file's `acc/NAME` and
    `acc_norm/NAME`; a suite task's `acc/SUITE/TASK` (its format's accuracy), `centered/...`
    and `bpb/...` (its gold bits per byte), and each suite's `centered/SUITE` and `bpb/SUITE`
    (`scoring.aggregate`); a generative task's `pass@1/NAME`, `pass@K/NAME` and its held-out
    reward, cut share and prompts."""
    out: dict[str, float] = {}
    suites: dict[str, list[TaskResult]] = {}
    for name, s in scores.items():
        if not isinstance(s, TaskResult):
            out |= {f"{key}/{name}": value for key, value in s.fields().items()}
        elif s.metrics == "lm-eval":
            out[f"acc/{name}"], out[f"acc_norm/{name}"] = s.acc_sum, s.acc_char
        else:
            if s.centered is not None:
                out[f"acc/{name}"], out[f"centered/{name}"] = s.metric, s.centered
            out[f"bpb/{name}"] = s.bpb
            if "/" in name:  # a suite's task; a task file in a standard format stands alone
                suites.setdefault(name.partition("/")[0], []).append(s)
    for suite, results in suites.items():
        out |= {f"{key}/{suite}": value for key, value in aggregate(results).items()}
    return out


def score_line(name: str, s: AnyScore) -> str:
    """One task's numbers, as `octlm eval` and the progress line print them."""
    if not isinstance(s, TaskResult):
        return f"{name}: {s.line()}"
    if s.metrics == "lm-eval":
        return f"{name}: acc {s.acc_sum:.4f}  acc_norm {s.acc_char:.4f}  ({s.items} questions)"
    if s.centered is None:
        return f"{name}: bpb {s.bpb:.4f}  ({s.items} items)"
    return (
        f"{name}: acc {s.metric:.4f}  centered {s.centered:+.4f}  (chance {s.baseline:.3f}, "
        f"{s.kind}, {s.items} items)"
    )


def progress_part(name: str, s: AnyScore) -> str:
    """One task's part of the training progress line: an lm-eval file's acc_norm on the line,
    any other task's `score_line` on its own."""
    if isinstance(s, TaskResult) and s.metrics == "lm-eval":
        return f"  {name} acc_norm {s.acc_char:.3f}"
    return f"\n  {score_line(name, s)}"


def headline(name: str, s: AnyScore) -> tuple[str, float, bool]:
    """(label, value, whether higher is better): the number two models are compared by (a
    merge against its newest checkpoint)."""
    if not isinstance(s, TaskResult):
        return f"{name} pass@1", s.fields()["pass@1"], True
    if s.metrics == "lm-eval":
        return f"{name} acc_norm", s.acc_char, True
    if s.centered is not None:
        return f"{name} centered", s.centered, True
    return f"{name} bpb", s.bpb, False
