"""Text generation: greedy by default, or temperature and top-k sampling with an explicit
generator, so a sample is reproducible from its seed and touches no global RNG."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from octlm.errors import OctlmError
from octlm.kvcache import KVCache, forward_cached
from octlm.model import GPT
from octlm.tokenizer.core import Tokenizer

MAX_NEW_TOKENS = 2**20
"""More is not a text anyone waits for: past the context, each new token runs the model over
the whole window again."""
SEEDS = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes


def check_sampling(
    max_new_tokens: int, temperature: float, top_k: int | None, seed: int = 0
) -> None:
    """One-line errors for settings that cannot sample: checked before a model is loaded."""
    if max_new_tokens < 0:
        raise OctlmError(
            f"--max-new-tokens {max_new_tokens} is negative", "use --max-new-tokens 0 or more"
        )
    if max_new_tokens > MAX_NEW_TOKENS:
        raise OctlmError(
            f"--max-new-tokens {max_new_tokens} is more than {MAX_NEW_TOKENS:,}",
            "generate a long text in several calls, each continuing the last",
        )
    if not SEEDS[0] <= seed <= SEEDS[1]:
        raise OctlmError(f"--seed {seed} is out of range", "use a seed from -2**63 to 2**64 - 1")
    if not 0 <= temperature < math.inf:
        raise OctlmError(
            f"--temperature {temperature} is not a finite number >= 0",
            "use --temperature 0 (greedy) or more",
        )
    if top_k is not None and top_k < 1:
        raise OctlmError(f"--top-k {top_k} keeps no token", "use --top-k 1 or more")


@torch.no_grad()
def generate(
    model: GPT,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    stop_id: int | None = None,
    cache: bool = True,
) -> list[int]:
    """Continue `prompt_ids`; temperature 0 is greedy. Returns only the new ids. With `cache`
    (the default) each new token runs the model over itself only (`octlm/kvcache.py`);
    without, over the whole context again, which gives the same tokens, slower."""
    if not prompt_ids:
        raise ValueError("the prompt must hold at least one token")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    logits_of = _Continuation(model, cache)
    new: list[int] = []
    # Dropout in train mode would draw from the global RNG and make a sample irreproducible.
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            logits = logits_of(ids)  # (1, V): the next token only
            if temperature <= 0:
                next_id = int(logits.argmax(dim=-1))
            else:
                logits = logits / temperature
                if top_k is not None and top_k < logits.shape[-1]:
                    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = torch.softmax(logits, dim=-1)
                next_id = int(torch.multinomial(probs, 1, generator=generator))
            new.append(next_id)
            if next_id == stop_id:
                break
            ids = torch.cat([ids, torch.tensor([[next_id]], device=device)], dim=1)
    finally:
        model.train(was_training)
    return new


class _Continuation:
    """The next token's float32 logits (B, V) for the ids so far, which grow by one a call."""

    def __init__(self, model: GPT, cache: bool) -> None:
        self.model = model
        self.cache = KVCache(model, 1) if cache else None
        self.fed = 0  # leading ids the cache holds

    def __call__(self, ids: Tensor) -> Tensor:
        context = self.model.config.context
        if self.cache is not None and ids.shape[1] <= context:
            logits = forward_cached(self.model, ids[:, self.fed :], self.cache)
            self.fed = ids.shape[1]
            return logits[:, -1, :].float()
        # Past the context the window slides and every position moves (RoPE restarts at the
        # window's first token), so the cached keys are stale: the full forward, as uncached.
        return self.model(ids[:, -context:])[:, -1, :].float()


def generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
) -> str:
    """`prompt` and its continuation: BOS (EOS if none) + the prompt's ids, continued until EOS or
    `max_new_tokens`, decoded."""
    check_sampling(max_new_tokens, temperature, top_k)
    # With no BOS, EOS is what precedes every document but the first in the training stream.
    start = tokenizer.start_ids or [tokenizer.eos_id]
    ids = [*start, *tokenizer.encode(prompt, add_special_tokens=False)]
    new = generate(
        model,
        ids,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        seed=seed,
        stop_id=tokenizer.eos_id,
    )
    return prompt + tokenizer.decode(new)
