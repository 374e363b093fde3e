"""Text generation: greedy by default, or temperature and top-k sampling with an explicit
generator, so a sample is reproducible from its seed and touches no global RNG."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from octlm.config.rl import EXACT_KERNEL
from octlm.errors import OctlmError
from octlm.generation.prompts import fit_prompts
from octlm.model.exact import ExactCache, forward_exact
from octlm.model.gpt import GPT
from octlm.model.kvcache import KVCache, forward_cached, left_padded
from octlm.model.packed import PackedWeights
from octlm.tokenizer.core import Tokenizer

MAX_NEW_TOKENS = 2**20
"""More is not a text anyone waits for: past the context, each new token runs the model over
the whole window again."""
SEEDS = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes
EXACT = True
"""The default of `exact` in the functions below (`octlm/model/exact.py`): every sampling
call here is seeded (`seed` defaults to 0), and a seed promises the same text whatever the
batch and the cache. `exact=False` is the plain path: faster at batch 1 on a small model
(docs/performance.md), its tokens equal to the exact path's up to a rounding near a tie."""
BATCH = 64
"""Prompts decoded together at most (`generate_texts`): a prompts file of any length runs in
batches of this many, each row's text the same as alone, its cache's memory bounded."""


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
    exact: bool = EXACT,
    kernel: int = EXACT_KERNEL,
) -> list[int]:
    """Continue `prompt_ids`; temperature 0 is greedy. Returns only the new ids. With `cache`
    (the default) each new token runs the model over itself only (`octlm/model/kvcache.py`);
    without, over the whole context again, which gives the same tokens, slower. With `exact`
    (`octlm/model/exact.py`) every token's logits are the bits the full forward of the sequence
    gives there, cached or not, alone or in a batch; `kernel` is its products' version (an RL
    run's own, `octlm/model/exact_products.py`)."""
    if not prompt_ids:
        raise ValueError("the prompt must hold at least one token")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    logits_of = Continuation(model, cache, exact, kernel)
    new: list[int] = []
    # Dropout in train mode would draw from the global RNG and make a sample irreproducible.
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            next_id = choose(logits_of(ids), temperature, top_k, generator)
            new.append(next_id)
            if next_id == stop_id:
                break
            ids = torch.cat([ids, torch.tensor([[next_id]], device=device)], dim=1)
    finally:
        model.train(was_training)
    return new


@torch.no_grad()
def generate_batch(
    model: GPT,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    stop_id: int | None = None,
    seeds: Sequence[int] | None = None,
    exact: bool = EXACT,
    logprobs: list[list[float]] | None = None,
    kernel: int = EXACT_KERNEL,
) -> list[list[int]]:
    """`generate` of each prompt, in one batch: the prompts left-padded to one length, each row
    sampling from a generator of its own seeded with `seed` (or row i with `seeds[i]`: several
    samples of one prompt), so a row's tokens are the ones its prompt gets alone with that
    seed. Prompts that would run past the context go one at a time (the sliding window moves
    each row's positions differently). With `exact` the rows are padded on the right and each
    row's logits are its own bits whatever the batch (`octlm/model/exact.py`); without, a
    left-padded row agrees with its prompt alone up to rounding. A `logprobs` list given is
    filled, on the batched path, with each row's sampled tokens' log-probabilities under the
    model (float32 log-softmax of the logits, before temperature and top-k): what an RL
    update differentiates."""
    if logprobs is not None:
        logprobs[:] = [[] for _ in prompts]
    row_seeds = list(seeds) if seeds is not None else [seed] * len(prompts)
    if len(row_seeds) != len(prompts):
        raise ValueError(f"{len(row_seeds)} seeds for {len(prompts)} prompts")
    longest = max((len(p) for p in prompts), default=0)
    if len(prompts) < 2 or longest + max_new_tokens > model.config.context:
        sampling = {"temperature": temperature, "top_k": top_k, "kernel": kernel}
        return [
            generate(model, p, max_new_tokens, stop_id=stop_id, seed=s, exact=exact, **sampling)
            for p, s in zip(prompts, row_seeds, strict=True)
        ]
    if min(len(p) for p in prompts) == 0:
        raise ValueError("every prompt must hold at least one token")
    device = next(model.parameters()).device
    build = functools.partial(_exact_rows, kernel=kernel) if exact else _left_padded_rows
    logits_of = build(model, prompts, device)
    generators = [torch.Generator(device=device).manual_seed(s) for s in row_seeds]
    new: list[list[int]] = [[] for _ in prompts]
    live = set(range(len(prompts)))
    was_training = model.training
    model.eval()
    try:
        for step in range(max_new_tokens):
            last = [row[-1] if row else 0 for row in new]
            logits = logits_of(step, torch.tensor(last, device=device).unsqueeze(1)).float()
            for b in sorted(live):
                new[b].append(choose(logits[b : b + 1], temperature, top_k, generators[b]))
                keep_logprob(logprobs, b, logits, new[b][-1])
                if new[b][-1] == stop_id:
                    live.discard(b)
            if not live:
                break
    finally:
        model.train(was_training)
    return new


def keep_logprob(kept: list[list[float]] | None, row: int, logits: Tensor, token: int) -> None:
    """Append to kept[row] the float32 log-softmax of `token` in logits[row] (if kept)."""
    if kept is not None:
        kept[row].append(float(torch.log_softmax(logits[row : row + 1], -1)[0, token]))


def _left_padded_rows(
    model: GPT, prompts: list[list[int]], device: torch.device
) -> Callable[[int, Tensor], Tensor]:
    """The next logits (B, V) at each step of a batch: the prompts left-padded to one length
    (step 0), then each row's last token (B, 1) through the cache."""
    rows, pad = left_padded(prompts, device)
    cache = KVCache(model, len(prompts))
    packed = PackedWeights()  # for this call only: the model may change after it

    def logits_of(step: int, ids: Tensor) -> Tensor:
        logits = forward_cached(model, ids if step else rows, cache, pad=pad, linear=packed.linear)
        return logits[:, -1, :]

    return logits_of


def _exact_rows(
    model: GPT, prompts: list[list[int]], device: torch.device, *, kernel: int
) -> Callable[[int, Tensor], Tensor]:
    """`_left_padded_rows` on the exact path: the prompts padded on the right, each row at its
    own positions (row b's new token n at position len(prompt b) + n), so its keys and queries
    sit where they sit alone."""
    longest = max(len(p) for p in prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    rows = torch.tensor([p + [0] * (longest - len(p)) for p in prompts], device=device)
    cache = ExactCache(model, len(prompts), kernel)

    def logits_of(step: int, ids: Tensor) -> Tensor:
        if not step:
            return forward_exact(model, rows, cache, at=lengths - 1)[:, -1, :]
        return forward_exact(model, ids, cache, lengths + (step - 1))[:, -1, :]

    return logits_of


def choose(
    logits: Tensor,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator,
    top_p: float | None = None,
) -> int:
    """The next id from one row's float32 logits (1, V): the argmax at temperature 0, else a
    draw from `generator` after temperature, top-k and (`top_p` below 1) nucleus sampling."""
    if temperature <= 0:
        return int(logits.argmax(dim=-1))
    scaled = logits / temperature
    if not bool(torch.isfinite(scaled).all()):  # a temperature so small (1e-320) that the
        return int(logits.argmax(dim=-1))  # logits overflow: its limit, greedy
    logits = scaled
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1:
        probs = nucleus(probs, top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def nucleus(probs: Tensor, top_p: float) -> Tensor:
    """`probs` (1, V) with only the likeliest tokens whose mass reaches `top_p` kept (the
    first always): the others zeroed, which `torch.multinomial` never draws."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # the mass ahead of each token
    dropped = before >= top_p
    # The first is kept by itself, not by 0 >= top_p being false: a top_p below float32's
    # least (5e-324, a valid request) is 0.0 against a float32 tensor, which would drop all.
    dropped[..., 0] = False
    sorted_probs = sorted_probs.masked_fill(dropped, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


class Continuation:
    """The next token's float32 logits (1, V) for the ids so far, which grow by one or more a
    call (a chat adds a turn): with a cache, only the ids it does not hold yet run. With
    `exact`, the logits are the exact path's (`octlm/model/exact.py`): the same bits cached or
    not."""

    def __init__(
        self, model: GPT, cache: bool, exact: bool = EXACT, kernel: int = EXACT_KERNEL
    ) -> None:
        self.model = model
        self.exact = exact
        self.kernel = kernel
        self.cache: KVCache | ExactCache | None = None
        if cache:
            self.cache = ExactCache(model, 1, kernel) if exact else KVCache(model, 1)

    def __call__(self, ids: Tensor) -> Tensor:
        context = self.model.config.context
        if self.exact:
            return self._exact(ids, context)
        if self.cache is not None and ids.shape[1] <= context:
            # The cache's own count of what it holds: a call interrupted (Ctrl-C in a chat)
            # before the forward finished has not advanced it, and the next call redoes it.
            logits = forward_cached(self.model, ids[:, self.cache.length :], self.cache)
            return logits[:, -1, :].float()
        # Past the context the window slides and every position moves (RoPE restarts at the
        # window's first token), so the cached keys are stale: the full forward, as uncached.
        return self.model(ids[:, -context:])[:, -1, :].float()

    def _exact(self, ids: Tensor, context: int) -> Tensor:
        last = torch.tensor([min(ids.shape[1], context) - 1], device=ids.device)
        if isinstance(self.cache, ExactCache) and ids.shape[1] <= context:
            held = self.cache.length
            start = torch.tensor([held], device=ids.device)
            logits = forward_exact(self.model, ids[:, held:], self.cache, start, at=last - held)
            self.cache.length = ids.shape[1]  # after the forward: an interrupted call is redone
            return logits[:, -1, :].float()
        logits = forward_exact(self.model, ids[:, -context:], at=last, kernel=self.kernel)
        return logits[:, -1, :].float()


def generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    exact: bool = EXACT,
) -> str:
    """`prompt` and its continuation: BOS (EOS if none) + the prompt's ids, continued until EOS or
    `max_new_tokens`, decoded."""
    sampling = {"temperature": temperature, "top_k": top_k, "seed": seed, "exact": exact}
    return generate_texts(model, tokenizer, [prompt], max_new_tokens=max_new_tokens, **sampling)[0]


def generate_texts(
    model: GPT,
    tokenizer: Tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    exact: bool = EXACT,
) -> list[str]:
    """`generate_text` of each prompt, decoded in one batch (`generate_batch`): each text is
    the one its prompt gets alone."""
    check_sampling(max_new_tokens, temperature, top_k)
    fit_prompts(prompts)
    # With no BOS, EOS is what precedes every document but the first in the training stream.
    start = tokenizer.start_ids or [tokenizer.eos_id]
    ids = [[*start, *tokenizer.encode(p, add_special_tokens=False)] for p in prompts]
    sampling = {"temperature": temperature, "top_k": top_k, "seed": seed, "exact": exact}
    new = []
    for at in range(0, len(ids), BATCH):
        batch = ids[at : at + BATCH]
        new += generate_batch(model, batch, max_new_tokens, stop_id=tokenizer.eos_id, **sampling)
    return [p + tokenizer.decode(n) for p, n in zip(prompts, new, strict=True)]


def long_prompt_notes(tokenizer: Tokenizer, prompts: list[str], context: int) -> list[str]:
    """A note for each prompt that alone fills the model's context: the model then sees only
    the last `context` tokens of it (the window slides), whatever --max-new-tokens says."""
    start = tokenizer.start_ids or [tokenizer.eos_id]
    notes = []
    for number, prompt in enumerate(prompts, 1):
        length = len(start) + len(tokenizer.encode(prompt, add_special_tokens=False))
        if length >= context:
            which = "the prompt" if len(prompts) == 1 else f"prompt {number}"
            notes.append(
                f"note: {which} is {length:,} tokens, which alone fills the model's context of "
                f"{context}: the model sees its last {context} tokens"
            )
    return notes
