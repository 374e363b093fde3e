"""`octlm generate --prompts FILE`: a batch of prompts in one process, each text the one
`--prompt` prints for it; bad prompt files are one-line errors."""

from __future__ import annotations

import json

import pytest

from octlm.api import load
from tests.e2e.helpers import octlm

pytestmark = pytest.mark.slow

PROMPTS = ["ROMEO:", "", "Is this a dagger", "  O", "KING HENRY:"]
"""Blank lines are skipped; the others differ in length, so the batch is left-padded."""
NEW = 16
SAMPLING = ("--max-new-tokens", str(NEW), "--temperature", "0.8", "--top-k", "40", "--seed", "5")


def test_a_file_of_prompts_prints_what_each_prompt_gets_alone(straight_run, tmp_path) -> None:
    run = straight_run()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    out = octlm("generate", str(run), "--prompts", str(prompts), *SAMPLING).stdout
    records = [json.loads(line) for line in out.splitlines()]
    kept = [p for p in PROMPTS if p.strip()]
    # Short enough for one batch (past the context, rows would go one at a time).
    loaded = load(run)
    longest = max(len(loaded.tokenizer.encode(p, add_special_tokens=False)) for p in kept)
    assert longest + 1 + NEW <= loaded.model.config.context
    assert [r["prompt"] for r in records] == kept
    for record in records:
        alone = octlm("generate", str(run), "--prompt", record["prompt"], *SAMPLING).stdout
        assert record["text"] + "\n" == alone
        assert record["text"].startswith(record["prompt"])


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "cannot be read"), ("\n  \n", "holds no prompt"), (b"\xff\xfe", "cannot be read")],
    ids=["missing", "blank", "not-utf8"],
)
def test_a_bad_prompts_file_is_one_line(straight_run, tmp_path, content, expected) -> None:
    prompts = tmp_path / "prompts.txt"
    if isinstance(content, str):
        prompts.write_text(content)
    elif content is not None:
        prompts.write_bytes(content)
    proc = octlm("generate", str(straight_run()), "--prompts", str(prompts), check=False)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr
    assert proc.stderr.startswith("octlm: error: --prompts")
