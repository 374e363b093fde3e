"""Tests for octlm.generation.sampling: greedy decoding, seeded sampling, top-k, no global RNG
use, text in and out, and settings that cannot sample refused in one line (`octlm generate` too)."""

from __future__ import annotations

import pytest
import torch

from octlm.cli.main import main
from octlm.errors import OctlmError
from octlm.generation.sampling import check_sampling, generate, generate_text
from octlm.model.gpt import GPT
from octlm.tokenizer.core import Tokenizer
from tests.unit_model import unit_config

CONTEXT = 32
PROMPT = [1, 17, 250, 3, 99]


def make_model(dropout: float = 0.0, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(unit_config(CONTEXT, dropout=dropout)).eval()


@pytest.fixture(scope="module")
def model() -> GPT:
    return make_model()


def manual_greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            window = torch.tensor([ids[-CONTEXT:]])
            ids.append(int(model(window)[0, -1].argmax()))
    return ids[len(prompt) :]


def test_greedy_equals_a_manual_argmax_loop_past_the_context(model: GPT) -> None:
    n = CONTEXT + 8  # longer than the context: the window slides
    out = generate(model, PROMPT, n)
    assert out == manual_greedy(model, PROMPT, n)
    assert len(out) == n
    assert generate(model, PROMPT, n) == out  # deterministic


def test_greedy_ignores_the_seed(model: GPT) -> None:
    assert generate(model, PROMPT, 12, seed=1) == generate(model, PROMPT, 12, seed=2)


def test_sampling_is_reproducible_from_its_seed(model: GPT) -> None:
    a = generate(model, PROMPT, 40, temperature=1.0, seed=123)
    b = generate(model, PROMPT, 40, temperature=1.0, seed=123)
    c = generate(model, PROMPT, 40, temperature=1.0, seed=124)
    assert a == b
    assert a != c
    assert a != generate(model, PROMPT, 40)  # a random-init model samples away from greedy
    assert all(0 <= t < 512 for t in a + c)


def test_top_k_one_equals_greedy(model: GPT) -> None:
    greedy = generate(model, PROMPT, 20)
    for seed in (0, 1, 2):
        assert generate(model, PROMPT, 20, temperature=1.5, top_k=1, seed=seed) == greedy


def test_top_k_samples_only_among_the_k_most_likely(model: GPT) -> None:
    k = 5
    out = generate(model, PROMPT, 30, temperature=2.0, top_k=k, seed=7)
    ids = list(PROMPT)
    with torch.no_grad():
        for token in out:
            logits = model(torch.tensor([ids[-CONTEXT:]]))[0, -1]
            assert token in set(torch.topk(logits, k).indices.tolist())
            ids.append(token)
    assert len(set(out)) > 1  # it did sample, not only take the argmax


def test_generation_does_not_touch_the_global_rng(model: GPT) -> None:
    state = torch.get_rng_state()
    generate(model, PROMPT, 20, temperature=1.0, seed=5)
    generate(model, PROMPT, 20, temperature=0.8, top_k=10, seed=6)
    generate(model, PROMPT, 5)
    assert torch.equal(torch.get_rng_state(), state)


def test_a_model_left_in_train_mode_with_dropout_still_generates_reproducibly() -> None:
    model = make_model(dropout=0.5).train()
    state = torch.get_rng_state()
    a = generate(model, PROMPT, 20, temperature=1.0, seed=5)
    assert torch.equal(torch.get_rng_state(), state)  # dropout would draw from the global RNG
    assert generate(model, PROMPT, 20, temperature=1.0, seed=5) == a
    assert generate(model, PROMPT, 20) == manual_greedy(make_model().eval(), PROMPT, 20)
    assert model.training  # the caller's mode is given back


def test_generation_stops_after_the_stop_token(model: GPT) -> None:
    full = generate(model, PROMPT, 30)
    stop = full[6]
    out = generate(model, PROMPT, 30, stop_id=stop)
    first = full.index(stop)
    assert out == full[: first + 1]


def test_zero_new_tokens_and_empty_prompt(model: GPT) -> None:
    assert generate(model, PROMPT, 0) == []
    with pytest.raises(ValueError, match="prompt"):
        generate(model, [], 5)


def test_text_is_the_prompt_and_the_decoded_continuation(model: GPT, tiny_tokenizer) -> None:
    tok: Tokenizer = tiny_tokenizer
    ids = [tok.bos_id, *tok.encode("ROMEO:", add_special_tokens=False)]
    new = generate(model, ids, 12, temperature=0.9, top_k=20, seed=3, stop_id=tok.eos_id)
    text = generate_text(model, tok, "ROMEO:", max_new_tokens=12, temperature=0.9, top_k=20, seed=3)
    assert text == "ROMEO:" + tok.decode(new)
    assert generate_text(model, tok, "ROMEO:", max_new_tokens=0) == "ROMEO:"


@pytest.mark.parametrize(
    "max_new, temperature, top_k, expected",
    [
        (-1, 0.0, None, "--max-new-tokens -1 is negative; use --max-new-tokens 0 or more"),
        (8, -0.5, None, "--temperature -0.5 is not a finite number >= 0; use --temperature 0"),
        (8, float("nan"), None, "--temperature nan is not a finite number >= 0"),
        (8, 1.0, 0, "--top-k 0 keeps no token; use --top-k 1 or more"),
        (8, 1.0, -3, "--top-k -3 keeps no token"),
    ],
)
def test_settings_that_cannot_sample_are_one_line_errors(
    model: GPT, tiny_tokenizer, max_new, temperature, top_k, expected
) -> None:
    with pytest.raises(OctlmError) as info:
        check_sampling(max_new, temperature, top_k)
    assert info.value.message.startswith(expected) and "\n" not in info.value.message
    with pytest.raises(OctlmError, match="^--"):
        generate_text(
            model, tiny_tokenizer, "a", max_new_tokens=max_new, temperature=temperature, top_k=top_k
        )
    check_sampling(0, 0.0, 1)  # the smallest accepted settings


@pytest.mark.parametrize(
    "flags", [["--max-new-tokens", "-2"], ["--temperature", "-1"], ["--top-k", "0"]]
)
def test_the_cli_refuses_them_before_it_loads_a_model(tmp_path, capsys, flags) -> None:
    # The run does not exist: the settings are refused first, in one line.
    assert main(["generate", str(tmp_path / "no-run"), "--prompt", "x", *flags]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"octlm: error: {flags[0]} {flags[1]}"), err


def test_batch_rows_with_seeds_of_their_own_equal_each_sample_alone_uncached(model: GPT) -> None:
    """Several samples of one prompt in one cached batch (row i from `seeds[i]`): each row is
    the uncached `generate` of that seed, and the seeds make the rows differ."""
    from octlm.generation.sampling import generate_batch

    seeds = [11, 12, 13, 14]
    prompts = [PROMPT, PROMPT, PROMPT[:3], PROMPT]
    rows = generate_batch(model, prompts, 12, temperature=1.0, seeds=seeds, stop_id=7)
    alone = [
        generate(model, p, 12, temperature=1.0, seed=s, stop_id=7, cache=False)
        for p, s in zip(prompts, seeds, strict=True)
    ]
    assert rows == alone
    assert rows[0] != rows[1]  # control: another seed samples another reply
    with pytest.raises(ValueError, match="2 seeds for 4 prompts"):
        generate_batch(model, prompts, 4, temperature=1.0, seeds=[1, 2])
