"""Chat data for the fine-tune that teaches a task's reply format before `octlm rl`: conversations
of one user turn (the prompt) and one assistant turn (the canonical answer), written as the JSON
lines `octlm prepare --format chat` reads (`octlm rl-data`).

The problems come from the task's "chat" stream: never a held-out problem, and not the problems
`octlm rl` trains on (its stream is "train"), so neither the evaluation nor the first RL steps
are answered in the fine-tune. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from octlm.data.chat_format import ASSISTANT, USER
from octlm.fsutil import atomic_write
from octlm.rl.tasks import Problem, Task

CHAT_STREAM = "chat"


def conversation(problem: Problem) -> dict[str, Any]:
    """One chat record: the prompt as the user's turn, the answer as the assistant's."""
    turns = [
        {"role": USER, "content": problem.prompt},
        {"role": ASSISTANT, "content": problem.answer},
    ]
    return {"messages": turns}


def chat_problems(task: Task, count: int, seed: int) -> Iterator[Problem]:
    """The first `count` problems of `task`'s chat stream under `seed`."""
    return (task.draw(CHAT_STREAM, seed, i) for i in range(count))


def write_chat_data(task: Task, count: int, out: str | Path, seed: int = 0) -> Path:
    """Write `count` conversations of `task` to `out` (JSON lines, one conversation a line),
    atomically: a failure leaves no file, or the one that was there. Parent folders are made.
    The caller checks `out` and the numbers (`octlm.cli.tasks`)."""
    out = Path(out)
    lines = (
        json.dumps(conversation(p), ensure_ascii=False) + "\n"
        for p in chat_problems(task, count, seed)
    )

    def write(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(lines)

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, write)
    return out
