"""The batch decoding thread in this process, on a random unit model: each row's tokens are
the ones `generate` gives its prompt alone with its seed, whether it decodes alone, beside
others, or joins a batch already running; rows that end or are cancelled leave it."""

from __future__ import annotations

import queue

import pytest
import torch

from octlm.generation.sampling import generate, nucleus
from octlm.model.exact import forward_exact
from octlm.model.gpt import GPT
from octlm.serve.batching import End, Row, Scheduler, Token
from tests.unit_model import unit_config


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(unit_config(48)).eval()


def collect(rows: list[Row], events: queue.Queue, timeout: float = 30) -> dict[int, list]:
    out: dict[int, list] = {i: [] for i in range(len(rows))}
    ended = 0
    while ended < len(rows):
        k, event = events.get(timeout=timeout)
        out[k].append(event)
        ended += isinstance(event, End)
    return out


def make_rows(prompts, events, **sampling) -> list[Row]:
    return [
        Row(
            p,
            sampling.get("max_tokens", 8),
            lambda e, k=k: events.put((k, e)),
            temperature=1.0,
            top_k=sampling.get("top_k"),
            top_p=sampling.get("top_p"),
            seed=100 + k,
        )  # fmt: skip
        for k, p in enumerate(prompts)
    ]


def tokens(events: list) -> list[int]:
    return [e.id for e in events if isinstance(e, Token)]


def assert_alone_bits(model: GPT, prompt: list[int], events: list, max_tokens: int, seed: int):
    """A row's tokens are `generate`'s alone with its seed, and each token's log-probability is
    the bit its whole sequence's full forward alone gives (`forward_exact` without a cache)."""
    drawn = [e for e in events if isinstance(e, Token)]
    assert [e.id for e in drawn] == generate(model, prompt, max_tokens, temperature=1.0, seed=seed)
    sequence = torch.tensor([prompt + [e.id for e in drawn]])
    with torch.no_grad():
        full = torch.log_softmax(forward_exact(model, sequence)[0].float(), dim=-1)
    for i, event in enumerate(drawn):
        assert event.logprob == float(full[len(prompt) - 1 + i, event.id])


def test_rows_decoded_together_draw_their_seeds_tokens(model) -> None:
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10], [11, 12]]
    events: queue.Queue = queue.Queue()
    scheduler = Scheduler(model, max_batch=8)
    rows = make_rows(prompts, events, top_k=20)
    scheduler.submit(rows)  # all waiting before the thread starts: one batch
    scheduler.start()
    try:
        got = collect(rows, events)
    finally:
        scheduler.close()
    assert scheduler.widest == len(prompts)
    for k, p in enumerate(prompts):
        alone = generate(model, p, 8, temperature=1.0, top_k=20, seed=100 + k)
        assert tokens(got[k]) == alone
        assert got[k][-1] == End("length")


def test_a_row_joins_a_running_batch_and_a_cancelled_one_leaves(model) -> None:
    events: queue.Queue = queue.Queue()
    scheduler = Scheduler(model, max_batch=8)
    first = make_rows([[1, 2, 3, 4, 5, 6]], events, max_tokens=30)
    scheduler.start()
    try:
        scheduler.submit(first)
        seen = events.get(timeout=30)  # the first row's first token: its batch is running
        late = Row([7, 8], 5, lambda e: events.put((1, e)), temperature=1.0, seed=7)
        gone = Row([9], 40, lambda e: None, temperature=1.0, seed=9)
        scheduler.submit([late, gone])
        gone.cancelled.set()
        got = collect([first[0], late], events)
        got[0].insert(0, seen[1])
    finally:
        scheduler.close()
    assert scheduler.widest == 2  # the late row decoded beside the first
    assert tokens(got[1]) == generate(model, [7, 8], 5, temperature=1.0, seed=7)
    assert tokens(got[0]) == generate(model, [1, 2, 3, 4, 5, 6], 30, temperature=1.0, seed=100)
    assert scheduler.load()["running"] == 0 and scheduler.load()["waiting"] == 0


def test_top_p_keeps_the_likeliest_tokens_whose_mass_reaches_it() -> None:
    probs = torch.tensor([[0.1, 0.5, 0.3, 0.1]])
    assert nucleus(probs, 0.5).tolist() == [[0.0, 0.5, 0.0, 0.0]]
    assert nucleus(probs, 0.7)[0].tolist() == [0.0, 0.5, probs[0, 2].item(), 0.0]
    assert int((nucleus(probs, 0.85) > 0).sum()) == 3  # 0.5 + 0.3 < 0.85: one of the 0.1s too
    assert nucleus(probs, 1e-9).tolist() == [[0.0, 0.5, 0.0, 0.0]]  # the first always stays
    # found by tests/fuzz/test_serve_fuzz.py: a top_p that is 0.0 in float32 kept nothing
    assert nucleus(probs, 5e-324).tolist() == [[0.0, 0.5, 0.0, 0.0]]


def test_a_late_longer_prompt_joins_at_once_with_its_full_forward_bits(model) -> None:
    """On the exact path a newcomer needs no room behind the batch: a prompt longer than the
    running row's length joins at the next step, and every token's log-probability is the bit
    its whole sequence's full forward alone gives (`forward_exact` without a cache)."""
    events: queue.Queue = queue.Queue()
    scheduler = Scheduler(model, max_batch=8)
    first = make_rows([[1, 2]], events, max_tokens=30)
    scheduler.start()
    try:
        scheduler.submit(first)
        events.get(timeout=30)
        prompt = list(range(3, 23))  # 20 tokens: past the first row's length when it joins
        late = Row(prompt, 6, lambda e: events.put((1, e)), temperature=1.0, seed=5, logprobs=0)
        scheduler.submit([late])
        got = collect([first[0], late], events)
    finally:
        scheduler.close()
    assert scheduler.widest == 2
    assert_alone_bits(model, prompt, got[1], max_tokens=6, seed=5)


def test_seeded_rows_decode_exactly_beside_unseeded_ones_on_the_plain_path(model) -> None:
    """A request without a seed decodes on the plain path (`exact=False`), in its own batch
    beside the exact one: both kinds run in the same steps, and the seeded row keeps its full
    forward's bits while plain rows come and go."""
    events: queue.Queue = queue.Queue()
    scheduler = Scheduler(model, max_batch=8)
    prompt = [5, 6, 7, 8, 9]
    seeded = Row(prompt, 12, lambda e: events.put((0, e)), temperature=1.0, seed=3, logprobs=0)
    plain = [
        Row([1 + k, 2, 3], 4 + 3 * k, lambda e, k=k: events.put((1 + k, e)), exact=False)
        for k in range(3)
    ]
    scheduler.submit([plain[0], seeded, *plain[1:]])
    scheduler.start()
    try:
        got = collect([seeded, *plain], events)
    finally:
        scheduler.close()
    assert scheduler.load()["running"] == 0
    assert scheduler.forwards > 12  # two kinds of batch: a forward each per step while both run
    for k, row in enumerate(plain):  # greedy plain rows: every token, then their end
        assert len(tokens(got[1 + k])) == row.max_tokens and got[1 + k][-1] == End("length")
    assert_alone_bits(model, prompt, got[0], max_tokens=12, seed=3)


def test_plain_rows_prefilled_together_and_joining_keep_their_own_logits(model) -> None:
    """Unseeded rows of different prompt lengths prefilled in one left-padded pass, then shorter
    ones joining the running batch right-aligned: every token's log-probability is the one its
    whole sequence's full forward alone gives (to float rounding: the plain path), and greedy
    picks its argmax. A row copied to the wrong slots or rotated at the wrong positions would
    be far off (the control: the same tokens scored one position off)."""
    events: queue.Queue = queue.Queue()
    scheduler = Scheduler(model, max_batch=8)
    prompts = [[3, 9, 4], [7, 1, 8, 2, 6, 5, 9], [2, 2, 5, 1, 3], [4, 6], [8, 3, 1, 7]]
    rows = [
        Row(p, 10, lambda e, k=k: events.put((k, e)), logprobs=0, exact=False)
        for k, p in enumerate(prompts)
    ]
    scheduler.submit(rows[:3])
    scheduler.step()  # stepped here, not on its thread: the last two join the running batch
    scheduler.submit(rows[3:])
    while scheduler.running() or scheduler.waiting:
        scheduler.step()
    got = collect(rows, events)
    assert scheduler.widest == 5  # the joiners decoded in the same batch as the first three
    off = 0.0
    for k, prompt in enumerate(prompts):
        drawn = [e for e in got[k] if isinstance(e, Token)]
        assert len(drawn) == 10
        sequence = torch.tensor([prompt + [e.id for e in drawn]])
        with torch.no_grad():
            full = torch.log_softmax(model(sequence)[0].float(), dim=-1)
        for i, event in enumerate(drawn):
            at = full[len(prompt) - 1 + i]
            assert abs(event.logprob - float(at[event.id])) < 1e-4
            assert float(at.max()) - float(at[event.id]) < 1e-4  # greedy: the argmax
            off = max(off, abs(event.logprob - float(full[len(prompt) - 2 + i, event.id])))
    assert off > 1e-2
