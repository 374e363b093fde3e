"""Fuzz of the text that comes into octlm's generation side, three formats through their real
doors in this process:

- `prompts`: a prompts file (`octlm generate RUN --prompts FILE`), now and then the first line
  as `--prompt` instead, and odd sampling flags (nan, -0, 1e309, 41 digits...);
- `chat_lines`: the lines typed into `octlm chat RUN` (its stdin, bytes that are not UTF-8
  kept as `surrogateescape` does), now and then with a mutated `--system`;
- `messages`: the turns given to `octlm.chat(run, messages)`, mutated as JSON (a wrong type, a
  missing field, a lone surrogate...) or as the text of that JSON.

Each case must be accepted, or refused as the house refuses (`harness.problems`: one line
`octlm: error: PROBLEM; FIX`, a non-zero exit, no traceback, nothing on disk changed); the API
may raise only an `OctlmError` whose message is one such line. The model is a random micro
model of a tiny chat dataset (`make_chat_run`, built once per call under `root`), so a case
that is accepted decodes a token or two in milliseconds. `run(seed, n, root)` runs all three;
`FORMATS` names each one's own `run`.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tests.fuzz.harness import (
    MAX_LINE_CHARS,
    NUMBER_SWAPS,
    mutate_bytes,
    mutate_json,
    problems,
    run_cli,
    snapshot,
    variants,
)

LINES = ["Who goes there?", "Nay, answer me.", "Long live the king!", "Bernardo?", "He."]
VALID_PROMPTS = "\n".join(LINES).encode() + b"\n"
VALID_CHAT = b"Who goes there?\n/reset\nLong live the king!\n\nBernardo?\n"
VALID_MESSAGES = [
    {"role": "system", "content": "Speak."},
    {"role": "user", "content": "Who goes there?"},
    {"role": "assistant", "content": "Nay, answer me."},
    {"role": "user", "content": "Long live the king!"},
]
SAMPLING_FLAGS = ("--max-new-tokens", "--temperature", "--top-k", "--seed")
CONTEXT = 32


def make_chat_run(root: Path) -> Path:
    """A chat-capable run under `root`: a tiny tokenizer, a chat dataset prepared from a few
    conversations, and a random micro model's checkpoint that names both; returns the run."""
    from octlm.cli.main import main
    from octlm.config.shape import preset
    from octlm.hashing import file_sha256
    from octlm.model.gpt import GPT
    from octlm.tokenizer.core import Tokenizer
    from octlm.trainer.checkpoint import save_checkpoint

    if (root / "run").is_dir():
        return root / "run"
    Tokenizer.train([" ".join(LINES)] * 20, vocab_size=300).save(root / "tokenizer.json")
    with (root / "talk.jsonl").open("w", encoding="utf-8") as f:
        for i in range(40):
            turns = [{"role": "user", "content": LINES[i % 5]}]
            turns.append({"role": "assistant", "content": LINES[(i + 1) % 5]})
            f.write(json.dumps({"messages": turns}) + "\n")
    data = root / "chat"
    args = ["prepare", str(root / "talk.jsonl"), "--format", "chat", "--context", str(CONTEXT)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*args, "--tokenizer", str(root / "tokenizer.json"), "--out", str(data)]) == 0
    torch.manual_seed(0)
    config = preset("micro", vocab_size=300, context=CONTEXT)
    weights = {f"model.{k}": v.contiguous() for k, v in GPT(config).state_dict().items()}
    meta = {
        "model_config": config.to_dict(),
        "data_dir": str(data),
        "fingerprints": {"tokenizer": file_sha256(data / "tokenizer.json")},
        "train_state": {"step": 1},
    }
    save_checkpoint(root / "run", 1, meta, weights)
    return root / "run"


def text_of(data: bytes) -> str:
    """Bytes as `octlm` receives them as an argument or a line: undecodable bytes kept as the
    lone surrogates `surrogateescape` makes of them."""
    return data.decode("utf-8", errors="surrogateescape")


def odd_flags(rng: random.Random) -> list[str]:
    """`--max-new-tokens 1`, and in a quarter of the cases some sampling flags with odd values
    (`--flag=VALUE`, so that argparse reads `-inf` as a value)."""
    flags = ["--max-new-tokens", "1"]
    if rng.random() < 0.25:
        flags += [f"{f}={rng.choice(NUMBER_SWAPS)}" for f in SAMPLING_FLAGS if rng.random() < 0.5]
    return flags


Case = Callable[[Path, Path, bytes, random.Random], list[str]]
"""(run, work folder, a variant, the seeded draws) -> the problems of that case."""


def cases_of(seed: int, n: int, root: Path, case: Case, valid: bytes) -> list[str]:
    """Each of `n` variants of `valid` through `case`, run in `root/work`; the failures as
    `case N (seed S): problem` lines."""
    run = make_chat_run(fresh(root / "fixture"))
    work, rng, failures = fresh(root / "work"), random.Random(seed), []
    for i, data in enumerate(variants(valid, seed, n)):
        failures += [f"case {i} (seed {seed}): {p}" for p in case(run, work, data, rng)]
        for leftover in work.iterdir():  # each case starts from an empty folder
            leftover.unlink()
    return failures


def fresh(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def prompts_case(run: Path, work: Path, data: bytes, rng: random.Random) -> list[str]:
    (work / "prompts.txt").write_bytes(data)
    if rng.random() < 0.2:
        given = ["--prompt", text_of(data.split(b"\n")[0])]
    else:
        given = ["--prompts", "prompts.txt"]
    outcome = run_cli(["generate", str(run), *given, *odd_flags(rng)], work)
    return [f"{p} [generate {given[0]}, {data[:80]!r}]" for p in problems(outcome)]


def chat_case(run: Path, work: Path, data: bytes, rng: random.Random) -> list[str]:
    flags = odd_flags(rng)
    if rng.random() < 0.3:
        flags += ["--system", text_of(mutate_bytes(b"Speak as a player.", rng))]
    outcome = run_cli(["chat", str(run), *flags], work, stdin=text_of(data))
    return [f"{p} [chat {flags}, {data[:80]!r}]" for p in problems(outcome)]


def run_prompts(seed: int, n: int, root: Path) -> list[str]:
    """`n` malformed prompts files (and `--prompt`s) through `octlm generate`."""
    return cases_of(seed, n, root, prompts_case, VALID_PROMPTS)


def run_chat_lines(seed: int, n: int, root: Path) -> list[str]:
    """`n` malformed inputs typed into `octlm chat`."""
    return cases_of(seed, n, root, chat_case, VALID_CHAT)


def odd_messages(seed: int, n: int) -> Iterator[Any]:
    """`n` malformed message lists: JSON mutations of a valid one, or its text mutated."""
    rng = random.Random(seed)
    texts = variants(json.dumps(VALID_MESSAGES).encode(), seed, n)
    for data in texts:
        if rng.random() < 0.6:
            value: Any = VALID_MESSAGES
            for _ in range(rng.randint(1, 3)):
                value = mutate_json(value, rng)
            yield value
            continue
        try:
            yield json.loads(text_of(data))
        except ValueError:
            yield text_of(data)  # not JSON: the text itself, a str where a list belongs


def api_problems(call: Callable[[], Any], root: Path) -> list[str]:
    """What `call` broke of the API's rule: no exception but an `OctlmError` of one line of
    bounded length with a fix, and nothing on disk changed."""
    from octlm.errors import OctlmError

    before, found = snapshot(root), []
    try:
        call()
    except OctlmError as exc:
        message = str(exc)
        if "\n" in message or len(message) > MAX_LINE_CHARS or not exc.fix:
            found.append(f"not one line with a fix: {message[:300]!r}")
    except Exception as exc:  # noqa: BLE001 (whatever else escapes is the finding)
        found.append(f"{type(exc).__name__}: {str(exc)[:200]}")
    if snapshot(root) != before:
        found.append("changed files")
    return found


def run_messages(seed: int, n: int, root: Path) -> list[str]:
    """`n` malformed message lists through `octlm.chat`, the run loaded once."""
    import octlm

    run = make_chat_run(fresh(root / "fixture"))
    loaded = octlm.load(run)
    failures = []
    for i, messages in enumerate(odd_messages(seed, n)):
        call = lambda m=messages: octlm.chat(loaded, m, max_new_tokens=1)  # noqa: E731
        for p in api_problems(call, root):
            failures.append(f"case {i} (seed {seed}): {p} [octlm.chat {messages!r:.200}]")
    return failures


FORMATS: dict[str, Callable[[int, int, Path], list[str]]] = {
    "prompts": run_prompts,
    "chat_lines": run_chat_lines,
    "messages": run_messages,
}


def run(seed: int, n: int, root: Path) -> list[str]:
    """`n` cases of each format (in `root/NAME`); the failures, each naming its format."""
    return [
        f"{name}: {failure}"
        for name, each in FORMATS.items()
        for failure in each(seed, n, fresh(root / name))
    ]
