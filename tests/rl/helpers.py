"""What the RL test modules share: the chat fine-tune an `octlm rl` run starts from, built
once per session (tests/shared.py). Test modules import from here, never from each other."""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.tokenizer.core import Tokenizer
from tests.e2e.helpers import octlm
from tests.shared import shared

CONTEXT = 64
RL = ("--task", "addition:1", "--steps", "4", "--prompts", "4", "--samples", "4")
RL += ("--max-new-tokens", "6", "--eval-every", "2", "--eval-prompts", "8", "--pass-k", "2")
RL += ("--ckpt-every", "2", "--lr", "3e-4", "--no-progress")
"""The tests' RL run: 4 steps of 4 prompts x 4 replies, held-out scores at 2 and 4."""


def chat_source(tiny_tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A micro model fine-tuned on 1-digit addition conversations (the chat format): a module's
    `source` fixture returns it."""

    def build(root: Path) -> None:
        tiny_tokenizer.save(root / "tokenizer.json")
        chats, tokenizer = str(root / "add.jsonl"), str(root / "tokenizer.json")
        octlm("rl-data", "--task", "addition:1", "--count", "400", "--out", chats)
        octlm("prepare", chats, "--format", "chat", "--tokenizer", tokenizer,
              "--context", str(CONTEXT), "--out", str(root / "data"))  # fmt: skip
        octlm("train", "--model", "micro", "--data", str(root / "data"), "--out", str(root / "ft"),
              "--steps", "30", "--warmup", "3", "--lr", "3e-3", "--context", str(CONTEXT),
              "--micro-batch", "16", "--accum", "1", "--order", "epoch", "--val-every", "0",
              "--dtype", "fp32", "--no-progress")  # fmt: skip

    return shared(tmp_path_factory, "rl-source", build) / "ft"
