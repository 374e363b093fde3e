"""One RL update: the policy-gradient loss of a step's rollouts, its gradient folded in the
training step's fixed tree, clipped, applied.

The loss is nanochat's "GRPO in quotes": on-policy (the replies were sampled by these weights,
so no ratio and no clipping of it), no KL term, advantage = reward - the group's mean, and
token-level normalisation: -sum(advantage x log p(token)) over every sampled token of the step,
divided by their count (the prompt's tokens are context, not targets).

Each prompt is one leaf of the fixed tree (`octlm/trainer/fold.py`): prompt p is micro-batch
p // W of rank p % W, as a training step's leaves are, and the `TreeReducer` folds the leaves'
gradients in an order that depends on P alone. So the update, like the rollouts, is the same
on any process count that divides the prompts into subtrees."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from octlm.config.rl import EXACT_KERNEL
from octlm.device import autocast
from octlm.model.exact import forward_exact
from octlm.model.gpt import GPT, IGNORE_INDEX
from octlm.rl.rollout import Group
from octlm.trainer.optim import set_lr
from octlm.trainer.reduction import TreeReducer, leaf_seed


@dataclass(frozen=True)
class UpdateResult:
    loss: float
    grad_norm: float
    nonfinite: bool = False
    logprob_diff: float | None = None
    """The max |sampler's log-prob - the update's| over the sampled tokens this process
    differentiated (None when none was, or the sampler kept none): 0.0 is on-policy, bitwise."""


def learning_rate(step: int, steps: int, lr: float) -> float:
    """Linear decay from `lr` at step 0 to 0 at `steps` (a pure function of the step)."""
    return lr * (1.0 - step / steps)


def group_batch(group: Group) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, targets, advantages) of one prompt's replies: a row per reply, the prompt and
    the reply, right-padded (a causal model's earlier positions never see the padding);
    targets are the reply's ids, IGNORE elsewhere."""
    rows = [group.prompt + reply for reply in group.replies]
    width = max(len(r) for r in rows) - 1
    start = len(group.prompt) - 1  # the position whose target is the reply's first id
    inputs = torch.zeros(len(rows), width, dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for i, row in enumerate(rows):
        inputs[i, : len(row) - 1] = torch.tensor(row[:-1])
        targets[i, start : len(row) - 1] = torch.tensor(row[start + 1 :])
    return inputs, targets, torch.tensor(group.advantages, dtype=torch.float32)


def policy_update(
    model: GPT,
    optimizer: torch.optim.Optimizer,
    reducer: TreeReducer,
    groups: Sequence[Group],
    *,
    sampled_tokens: int,
    lr: float,
    grad_clip: float,
    seed: int,
    step: int,
    world: int,
    rank: int,
    dtype: str,
    exact: bool = False,
    kernel: int = EXACT_KERNEL,
) -> UpdateResult:
    """Forward and backward of this process's `groups` (micro-batch m is prompt m * world +
    rank), the fixed-tree fold across processes, clip, step; the loss over `sampled_tokens`
    (the step's, every process's). With `exact` the forward is the rollouts' exact path
    (float32, no dropout, products by `kernel`): a token's log-prob is the sampler's bits."""
    device = next(model.parameters()).device
    set_lr(optimizer, lr)
    model.train()
    losses, diffs = [], []
    reducer.start()
    for micro, group in enumerate(groups):
        inputs, targets, advantages = group_batch(group)
        if any(group.advantages):  # else every reply earned the same
            # Dropout draws from the global generator: seeded from (seed, step, leaf), the same
            # prompt draws the same masks on any process.
            torch.manual_seed(leaf_seed(seed, step, micro * world + rank))
            inputs, targets = inputs.to(device), targets.to(device)
            if exact:
                logits = forward_exact(model, inputs, kernel=kernel)
            else:
                with autocast(device, dtype):
                    logits = model(inputs)
            nll = F.cross_entropy(
                logits.float().flatten(0, 1),
                targets.flatten(),
                ignore_index=IGNORE_INDEX,
                reduction="none",
            ).view(targets.shape)
            loss = (nll * advantages.to(device)[:, None]).sum() / max(1, sampled_tokens)
            loss.backward()
            losses.append(loss.detach())
            diffs += logprob_diffs(group, nll.detach())
        else:  # no gradient: the fold adds this leaf's zeros
            losses.append(torch.zeros((), device=device))
        reducer.after_micro()
    reducer.finish()
    loss_value = float(reducer.fold_values(losses).item()) if losses else 0.0
    norm = reducer.clip(grad_clip)
    if not (math.isfinite(loss_value) and math.isfinite(norm)):
        optimizer.zero_grad(set_to_none=True)
        return UpdateResult(loss_value, norm, nonfinite=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return UpdateResult(loss_value, norm, logprob_diff=max(diffs) if diffs else None)


def logprob_diffs(group: Group, nll: torch.Tensor) -> list[float]:
    """|sampler's log-prob - the update's| of each sampled token of `group` (none where the
    sampler kept no log-probs); `nll` (rows, width) is the update's per-token loss."""
    if len(group.logprobs) != len(group.replies):
        return []
    start = len(group.prompt) - 1
    out = []
    for row, kept in enumerate(group.logprobs):
        mine = (-nll[row, start : start + len(kept)]).cpu().tolist()
        out += [abs(a - b) for a, b in zip(kept, mine, strict=True)]
    return out
