"""docs/data.md's cookbook runs as written: every ```bash block of its Cookbook section, in
order, by bash in one folder holding the small inputs the blocks name (made here from the
embedded corpus), with `octlm` meaning this checkout's `python -m octlm`.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from octlm.data.shards import ShardDataset
from octlm.hashing import file_sha256
from octlm.prepare.corpus import Document
from octlm.runlog.reader import read_log
from tests.doc_blocks import run_block, section_blocks, shim, shim_env

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# Every test here runs real `octlm` subprocesses.
pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[1] / "docs" / "data.md"
SEP = "<|endoftext|>"
SAMPLE_CHARS = 250_000  # per input file: a few hundred KB keeps the section under ~15 s


def cookbook_blocks() -> list[str]:
    return section_blocks(DOC, "Cookbook")


def pieces(works: list[Document], size: int) -> list[str]:
    """Runs of whole paragraphs of at least `size` characters, until SAMPLE_CHARS of them."""
    out, total = [], 0
    for work in works:
        current = ""
        for paragraph in work.text.split("\n\n"):
            current = f"{current}\n\n{paragraph}" if current else paragraph
            if len(current) >= size:
                out.append(current)
                total += len(current)
                current = ""
                if total >= SAMPLE_CHARS:
                    return out
    return out


def make_inputs(folder: Path, docs: list[Document]) -> None:
    """stories.txt (TinyStories-style), fineweb.parquet (FineWeb-style: text, id and url
    columns), owt.jsonl.gz (OpenWebText-style: a text field only), each from other works."""
    works = sorted(docs, key=lambda d: d.id)
    stories = pieces(works[0:3], 800)
    (folder / "stories.txt").write_text(SEP.join(stories), encoding="utf-8")
    web = pieces(works[3:6], 2000)
    table = {
        "text": web,
        "id": [f"<urn:uuid:{i:08x}>" for i in range(len(web))],
        "url": [f"https://example.org/page/{i}" for i in range(len(web))],
    }
    pq.write_table(pa.table(table), folder / "fineweb.parquet")
    with gzip.open(folder / "owt.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": text}) + "\n" for text in pieces(works[6:9], 1500))


def test_the_cookbook_has_the_seven_recipes() -> None:
    blocks = cookbook_blocks()
    assert len(blocks) == 7, blocks
    text = "".join(blocks)
    for needed in ("stories.txt", "fineweb.parquet", "owt.jsonl.gz", "--split-on", "--tokenizer"):
        assert needed in text
    assert "--val-tokens" in blocks[4] and "--val-docs" in blocks[4]
    assert "--packing bos" in blocks[5] and "--doc-mask" in blocks[5]
    assert "--data data/stories-tok:0.7,data/mixed:0.3" in blocks[6]


def test_every_cookbook_block_runs(tmp_path, corpus_docs) -> None:
    work = tmp_path / "work"
    work.mkdir()
    make_inputs(work, corpus_docs)
    env = shim_env(shim(tmp_path, "octlm"))
    for block in cookbook_blocks():
        run_block(block, work, env)
        for out in re.findall(r"--out (\S+)", block):
            path = work / out
            if out.endswith(".json"):  # `octlm tokenizer train --out tok.json`
                assert path.is_file(), out
            elif block.startswith("octlm train"):  # BOS-aligned rows, or a mixture
                records = read_log(path)
                assert records[-1]["type"] == "end" and records[-1]["step"] == 4, out
                if "--packing bos" in block:
                    assert records[0]["packing"]["train"]["packing"] == "bos", out
                else:
                    val = next(r for r in records if r["type"] == "val")
                    assert {"val_bpb/stories-tok", "val_bpb/mixed"} <= set(val), out
            else:
                dataset = ShardDataset.open(path, verify_checksums=True)
                assert len(dataset.train) > 0 and len(dataset.val) > 0, out
                if "--tokenizer tok.json" in block:  # the given file, unchanged
                    assert dataset.tokenizer_fingerprint == file_sha256(work / "tok.json")


def test_the_cookbook_toml_mixture_is_the_flag_form(tmp_path) -> None:
    from octlm.config.files import make_config

    (toml,) = section_blocks(DOC, "Cookbook", "toml")
    path = tmp_path / "mix.toml"
    path.write_text(toml, encoding="utf-8")
    assert make_config(path).data == "data/stories-tok:0.7,data/mixed:0.3"
