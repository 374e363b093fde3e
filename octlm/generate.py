"""Text generation: greedy by default, or temperature and top-k sampling with an explicit
generator, so a sample is reproducible from its seed and touches no global RNG."""

from __future__ import annotations

import torch

from octlm.model import GPT


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
) -> list[int]:
    """Continue `prompt_ids`; temperature 0 is greedy. Returns only the new ids."""
    if not prompt_ids:
        raise ValueError("the prompt must hold at least one token")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    context = model.config.context
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    new: list[int] = []
    # Dropout in train mode would draw from the global RNG and make a sample irreproducible.
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            logits = model(ids[:, -context:])[:, -1, :].float()  # (1, V): the next token only
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
