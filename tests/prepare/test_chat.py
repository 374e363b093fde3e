"""`octlm prepare --format chat`: conversations from JSON lines or a Parquet column of turn
lists, written as the chat format's ids with only assistant turns as targets; bad turns and
misplaced flags are one-line errors that leave nothing at --out."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from octlm.data.chat_format import Message, encode_chat
from octlm.data.shards import ShardDataset
from octlm.errors import DataError
from octlm.prepare.pairs import PairsConfig, prepare_pairs, summary_lines
from octlm.tokenizer.core import Tokenizer
from tests import octlm_process

TOKENIZER = Path(__file__).parents[1] / "golden" / "v1-micro" / "data" / "tokenizer.json"
CHATS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"What is {i} and {i}?"},
        {"role": "assistant", "content": f"{2 * i}."},
        {"role": "user", "content": "And twice that?"},
        {"role": "assistant", "content": f"{4 * i}."},
    ]
    for i in range(30)
]


def config(tmp_path: Path, *inputs: Path, **kw) -> PairsConfig:
    base = {"out": tmp_path / "out", "inputs": tuple(map(str, inputs)), "tokenizer": TOKENIZER}
    return PairsConfig(**{**base, "context": 256, "format": "chat", **kw})


def written_conversations(ds: ShardDataset, split: str) -> list[tuple[list[int], list[int]]]:
    streams = (getattr(ds, split), getattr(ds, f"{split}_mask"))
    tokens, mask = (np.asarray(s.window(0, len(s))) for s in streams)
    starts = [*np.flatnonzero(mask == 2).tolist(), len(mask)]
    return [
        (tokens[a:b].tolist(), mask[a:b].tolist()) for a, b in zip(starts, starts[1:], strict=False)
    ]


def test_conversations_are_written_in_the_chat_format(tmp_path) -> None:
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    manifest = prepare_pairs(config(tmp_path, src))
    assert manifest["chat_template"] == {"version": 1}
    train = manifest["splits"]["train"]
    assert train["assistant_turns"] == 2 * train["documents"] and train["merged_headers"] == 0
    assert "assistant turns" in "\n".join(summary_lines(manifest, tmp_path / "out"))
    tok = Tokenizer.load(TOKENIZER)
    expected = {
        tuple(encode_chat(tok, [Message(**m) for m in c]).ids): encode_chat(
            tok, [Message(**m) for m in c]
        ).marks
        for c in CHATS
    }
    ds = ShardDataset.open(tmp_path / "out", verify_checksums=True)
    seen = 0
    for split in ("train", "val"):
        for ids, marks in written_conversations(ds, split):
            assert expected[tuple(ids)] == marks
            seen += 1
    assert seen == len(CHATS)


def test_a_parquet_column_of_turn_lists_gives_the_same_dataset(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    ids = [f"chats.jsonl:{i + 1}" for i in range(len(CHATS))]  # JSON lines' ids: same split
    pq.write_table(pa.table({"id": ids, "messages": CHATS}), tmp_path / "chats.parquet")
    a = prepare_pairs(config(tmp_path, src))
    b = prepare_pairs(config(tmp_path, tmp_path / "chats.parquet", out=tmp_path / "pq"))
    assert a["fingerprint"] == b["fingerprint"]
    pq.write_table(pa.table({"messages": ["not a list"]}), tmp_path / "flat.parquet")
    with pytest.raises(DataError, match="column 'messages' holds string, not lists"):
        prepare_pairs(config(tmp_path, tmp_path / "flat.parquet", out=tmp_path / "flat"))


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ({"turns": []}, "has no field 'messages'"),
        ({"messages": [{"role": "narrator", "content": "x"}]}, "message 1 has role 'narrator'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "has no assistant turn"),
        ({"messages": [{"role": "assistant", "content": "<|eos|>"}]}, "special token '<|eos|>'"),
    ],
)
def test_a_bad_conversation_is_one_line_naming_it(tmp_path, line, match) -> None:
    src = tmp_path / "chats.jsonl"
    src.write_text(json.dumps({"messages": CHATS[0]}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(DataError, match=f"chats.jsonl:2.*{match}".replace("|", r"\|")):
        prepare_pairs(config(tmp_path, src))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_cli_refuses_flags_of_the_other_format_in_one_line(tmp_path) -> None:
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    cases = {
        ("--format", "chat", "--prompt-field", "q"): "--prompt-field and --completion-field "
        "have no effect with --format chat",
        ("--format", "prompt-completion", "--messages-field", "m"): "--messages-field has no "
        "effect",
        ("--messages-field", "m"): "(--messages-field: --format chat)",
    }
    for flags, message in cases.items():
        proc = octlm_process.run(
            ["prepare", str(src), "--tokenizer", str(TOKENIZER), "--out", "o", *flags],
            dict(os.environ),
            cwd=tmp_path,
            timeout=300,
        )
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "o").exists()
