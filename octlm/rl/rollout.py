"""A step's rollouts: G replies to each of its prompts, sampled with the KV-cache generator.

Everything a rollout depends on is named: prompt p of step s is the task's problem (seed, s, p),
and its reply j is sampled from a generator seeded with sha256(seed, s, p, j). So the rollouts
are a pure function of the weights and the step: a resumed run samples what the straight run
sampled, and a prompt gives the same replies on whichever process samples it. A prompt's G
replies are decoded together (one batch per prompt on every process count: the batch's shape,
and with it every rounding, does not depend on how prompts are shared out)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from octlm.config.rl import EXACT_KERNEL
from octlm.data.chat_format import USER, reply_prompt_ids, turn_ids
from octlm.generation.sampling import generate_batch
from octlm.model.gpt import GPT
from octlm.rl.tasks import Problem, Task
from octlm.tokenizer.core import Tokenizer

HELDOUT = -1
"""The step number the held-out prompts' replies are seeded with: no training step has it."""


def reply_seed(seed: int, step: int, prompt: int, sample: int) -> int:
    """The generator seed of reply `sample` to prompt `prompt` of `step` (64 bits of sha256)."""
    blob = json.dumps(["octlm-rl", seed, step, prompt, sample]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little")


def prompt_ids(tokenizer: Tokenizer, problem: Problem) -> list[int]:
    """The conversation the model replies to: its start, the user turn, the assistant header
    (the chat format's ids, as `octlm chat` builds them)."""
    return [
        *tokenizer.start_ids,
        *turn_ids(tokenizer, USER, problem.prompt),
        *reply_prompt_ids(tokenizer),
    ]


@dataclass(frozen=True)
class Group:
    """One prompt's G replies and what they earned."""

    index: int
    """The prompt's index in its step (its leaf in the update's fixed tree)."""
    prompt: list[int]
    replies: list[list[int]]
    """Each reply's sampled ids, its closing EOS included when it emitted one."""
    rewards: list[float]
    correct: list[bool]
    cut: list[bool]
    """Stopped by the length cap, not by EOS."""
    logprobs: list[list[float]] = field(default_factory=list)
    """Each reply's tokens' log-probabilities as the sampler computed them (empty where the
    replies were not decoded as one batch): what the update's are checked against."""

    @property
    def advantages(self) -> list[float]:
        """Reward minus the group's mean (no division by its spread: nanochat's choice, which
        keeps a group that is almost all right from amplifying its few differences)."""
        if len(set(self.rewards)) == 1:  # exactly zero, not a rounding of mean - reward
            return [0.0] * len(self.rewards)
        mean = math.fsum(self.rewards) / len(self.rewards)
        return [r - mean for r in self.rewards]


def reply_text(tokenizer: Tokenizer, reply: Sequence[int]) -> str:
    ids = list(reply)
    if ids and ids[-1] == tokenizer.eos_id:
        ids = ids[:-1]
    return tokenizer.decode(ids)


def sample_group(
    model: GPT,
    tokenizer: Tokenizer,
    task: Task,
    problem: Problem,
    *,
    index: int,
    seeds: Sequence[int],
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    exact: bool = True,
    kernel: int = EXACT_KERNEL,
) -> Group:
    """Sample one reply per seed to `problem` and score each with the task's checker (`exact`:
    on the exact decode path by its `kernel` version, else the plain one: the run's `sampler`
    and `exact_kernel`)."""
    ids = prompt_ids(tokenizer, problem)
    eos = tokenizer.eos_id
    logprobs: list[list[float]] = []
    replies = generate_batch(
        model,
        [ids] * len(seeds),
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        seeds=seeds,
        stop_id=eos,
        logprobs=logprobs,
        exact=exact,
        kernel=kernel,
    )
    texts = [reply_text(tokenizer, r) for r in replies]
    return Group(
        index=index,
        prompt=ids,
        replies=replies,
        rewards=[float(task.reward(problem, t)) for t in texts],
        correct=[bool(task.correct(problem, t)) for t in texts],
        cut=[not r or r[-1] != eos for r in replies],
        logprobs=logprobs,
    )


def rollout_sha256(groups: Sequence[Group]) -> str:
    """A step's rollouts as one digest: every prompt's ids and replies, in prompt order."""
    h = hashlib.sha256()
    for g in sorted(groups, key=lambda g: g.index):
        h.update(json.dumps([g.index, g.prompt, g.replies]).encode())
    return h.hexdigest()
