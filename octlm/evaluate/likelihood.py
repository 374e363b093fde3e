"""How a model scores a continuation after a context, as lm-evaluation-harness does: the split
of the text into context and continuation tokens, and one batched forward that gives each
continuation's summed log-probability, its token count and whether greedy decoding would have
written it (every token the argmax)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from octlm.model.exact import forward_exact
from octlm.model.gpt import GPT
from octlm.tokenizer.core import Tokenizer

BATCH = 16
EXACT = True
"""Score through the exact path (`octlm/model/exact.py`) by default: a continuation's numbers are
then the same bits whatever batch it shares and whatever `batch` is. Applies to an octlm `GPT`;
another module (a Hugging Face model) runs its own forward."""


@dataclass(frozen=True)
class Continuation:
    loglik: float
    """Sum of the continuation tokens' log-probabilities (natural log)."""
    tokens: int
    """How many tokens were scored (the continuation's, or its last ones that fit)."""
    greedy: bool
    """Every scored token is the model's argmax at its position."""


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
def continuations(
    model: nn.Module,
    pairs: list[tuple[list[int], list[int]]],
    context: int,
    device: torch.device,
    *,
    batch: int = BATCH,
    exact: bool = EXACT,
) -> list[Continuation]:
    """Each continuation's numbers after its context (cut from the left so that context +
    continuation - 1 tokens fit `context` positions), in batches of BATCH rows padded on the
    right (a causal model's earlier positions never see the padding). The rows are batched
    longest first, as lm-eval does, so a batch pads little; the order depends on the pairs
    alone, so the same pairs give the same numbers. Only the scored positions' logits go
    through the log-softmax and back to the host. With `exact` (an octlm GPT), each row's
    numbers do not depend on `batch` or on the other rows, bit for bit."""
    if not pairs:
        return []
    order = sorted(range(len(pairs)), key=lambda i: (-len(pairs[i][0]) - len(pairs[i][1]), i))
    found = _batched(model, [pairs[i] for i in order], context, device, batch, exact)
    out: list[Continuation] = [found[0]] * len(pairs)
    for at, i in enumerate(order):
        out[i] = found[at]
    return out


def _batched(
    model: nn.Module,
    pairs: list[tuple[list[int], list[int]]],
    context: int,
    device: torch.device,
    batch: int,
    exact: bool,
) -> list[Continuation]:
    out: list[Continuation] = []
    exact = exact and isinstance(model, GPT)
    for i in range(0, len(pairs), batch):
        rows = []
        for head, tail in pairs[i : i + batch]:
            ids = (head + tail)[-(context + 1) :]
            # A continuation longer than the context itself is scored on its last tokens.
            rows.append((ids, min(len(tail), len(ids) - 1)))
        width = max(len(ids) - 1 for ids, _ in rows)
        x = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (ids, _) in enumerate(rows):
            x[r, : len(ids) - 1] = torch.tensor(ids[:-1])
        x = x.to(device)
        logits = forward_exact(model, x) if exact else model(x)  # (B, width, V)
        # A position's log-softmax reads its own logits only: over the scored positions alone
        # it gives the bits it gives over the whole (B, width, V) batch, without the work.
        at_row = torch.tensor([r for r, (_, n) in enumerate(rows) for _ in range(n)])
        at_col = torch.tensor([p for ids, n in rows for p in range(len(ids) - 1 - n, len(ids) - 1)])
        targets = torch.tensor([t for ids, n in rows for t in ids[len(ids) - n :]]).to(device)
        logp = F.log_softmax(logits[at_row.to(device), at_col.to(device)].float(), dim=-1)
        picked = logp.gather(1, targets[:, None])[:, 0].cpu()  # (N,): each target's log-prob
        hits = (logp.argmax(dim=-1) == targets).cpu()
        start = 0
        for _, n in rows:  # a row's sum over its own tokens, on the host as before
            end = start + n
            out.append(Continuation(float(picked[start:end].sum()), n, bool(hits[start:end].all())))
            start = end
    return out


def scored_quietly(
    model: nn.Module, pairs: list[tuple[list[int], list[int]]], context: int, device: torch.device
) -> list[Continuation]:
    """`continuations` in eval mode with every generator restored after, the model's mode put
    back: scoring never moves a training bit."""
    was_training = model.training
    model.eval()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        scored = continuations(model, pairs, context, device)
    model.train(was_training)
    return scored
