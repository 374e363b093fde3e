"""pass@1 and pass@k on a task's held-out prompts: k replies sampled per prompt, each from a
generator seeded by (seed, prompt, sample) alone, so every evaluation of every run samples
with the same seeds and two scores differ by their weights only.

pass@1 is the expected share of correct replies (c / k per prompt, averaged); pass@k the share
of prompts with at least one correct reply among the k (Chen et al. 2021's estimator with
n = k). With several processes each scores the prompts p with p % W == its rank and the counts
are gathered: integers, the same on any process count."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from octlm.config.rl import EXACT_KERNEL, RLConfig
from octlm.evaluate.protocol import GenerativeTask
from octlm.model.gpt import GPT
from octlm.rl.rollout import HELDOUT, reply_seed, sample_group
from octlm.rl.run import check_lengths
from octlm.rl.tasks import Problem, Task
from octlm.tokenizer.core import Tokenizer


@dataclass(frozen=True)
class HeldoutScore:
    prompts: int
    k: int
    pass1: float
    passk: float
    reward: float
    """The mean reward of every sampled reply."""
    cut: float
    """The share of replies cut at the length cap."""

    def fields(self) -> dict[str, float | int]:
        """The score as a log record's fields."""
        return {
            "pass@1": self.pass1,
            f"pass@{self.k}": self.passk,
            "heldout_reward": self.reward,
            "heldout_cut": self.cut,
            "heldout_prompts": self.prompts,
        }

    def line(self) -> str:
        """The score as `octlm eval` prints it."""
        return (
            f"pass@1 {self.pass1:.4f}  pass@{self.k} {self.passk:.4f}  reward {self.reward:.4f}  "
            f"cut {self.cut:.4f}  ({self.prompts} held-out prompts, {self.k} replies each)"
        )


def count_correct(
    model: GPT,
    tokenizer: Tokenizer,
    task: Task,
    problems: Sequence[Problem],
    indices: Sequence[int],
    *,
    k: int,
    seed: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    exact: bool = True,
    kernel: int = EXACT_KERNEL,
) -> list[tuple[int, int, float, int]]:
    """(prompt index, correct replies, summed reward, cut replies) of each prompt in `indices`."""
    out = []
    for p in indices:
        group = sample_group(
            model,
            tokenizer,
            task,
            problems[p],
            index=p,
            seeds=[reply_seed(seed, HELDOUT, p, j) for j in range(k)],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            exact=exact,
            kernel=kernel,
        )
        out.append((p, sum(group.correct), math.fsum(group.rewards), sum(group.cut)))
    return out


def summarise(counts: Sequence[tuple[int, int, float, int]], k: int) -> HeldoutScore:
    """Every prompt's counts (any order; each prompt once) as the score."""
    ordered = sorted(counts)
    n = len(ordered)
    return HeldoutScore(
        prompts=n,
        k=k,
        pass1=math.fsum(c / k for _, c, _, _ in ordered) / n,
        passk=sum(c > 0 for _, c, _, _ in ordered) / n,
        reward=math.fsum(r for _, _, r, _ in ordered) / (n * k),
        cut=sum(x for *_, x in ordered) / (n * k),
    )


def score_heldout(
    model: GPT,
    tokenizer: Tokenizer,
    task: Task,
    *,
    prompts: int,
    k: int,
    seed: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None = None,
    exact: bool = True,
    kernel: int = EXACT_KERNEL,
    rank: int = 0,
    world: int = 1,
    gather: Callable[[object], list[object]] | None = None,
) -> HeldoutScore:
    """The task's first `prompts` held-out problems, scored (see the module doc)."""
    problems = task.heldout(prompts)
    mine = range(rank, len(problems), world)
    sampling = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k}
    sampling.update(exact=exact, kernel=kernel)
    counts = count_correct(model, tokenizer, task, problems, mine, k=k, seed=seed, **sampling)
    every = [c for part in gather(counts) for c in part] if gather else counts  # type: ignore[union-attr]
    return summarise(every, k)


def heldout_task(task: Task, settings: RLConfig) -> GenerativeTask:
    """`task` as the task protocol's generative kind: its held-out pass@1 and pass@k, sampled
    with `settings` as `octlm rl` samples its held-out evaluation (the lengths checked first)."""

    def scored(model: GPT, tokenizer: Tokenizer, context: int) -> HeldoutScore:
        check_lengths(settings, task, tokenizer, context)
        k, prompts, sampling = settings.pass_k, settings.eval_prompts, settings.policy.sampling()
        return score_heldout(
            model, tokenizer, task, prompts=prompts, k=k, seed=settings.seed, **sampling
        )

    return GenerativeTask(task.name, scored)
