"""`--workers N`: the dataset folder is the same bytes for 1, 2 and 3 worker processes, on a
mixed corpus cut into many chunks (so every worker gets work and results arrive out of order)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import octlm.prepare.writer as writer_module
from octlm.prepare.sources import ReadOptions
from octlm.prepare.split import SplitRule
from octlm.prepare.text import PrepareConfig, prepare

pytestmark = pytest.mark.slow  # starts worker processes

SEP = "<|endoftext|>"


@pytest.fixture(scope="module")
def mixed(corpus_docs, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    folder = root / "corpus"
    folder.mkdir()
    texts = [d.text[k : k + 1500] for d in corpus_docs[:12] for k in range(0, 30_000, 1500)]
    (folder / "a_stories.txt").write_text(SEP.join(texts[:80]))
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts[80:160])
    (folder / "b_web.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    pq.write_table(pa.table({"text": texts[160:]}), folder / "c_rows.parquet", row_group_size=16)
    return folder


def build(folder, out, workers: int, split: SplitRule) -> dict[str, bytes]:
    cfg = PrepareConfig(
        out=out,
        inputs=(str(folder),),
        read=ReadOptions(split_on=SEP),
        split=split,
        vocab_size=400,
        context=32,
        shard_tokens=20_000,
        workers=workers,
    )
    prepare(cfg, progress=False)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize(
    "split",
    [SplitRule(), SplitRule(val_fraction=None, val_tokens=3000)],
    ids=["fraction", "val-tokens"],
)
def test_shards_are_byte_identical_for_1_2_and_3_workers(mixed, tmp_path, monkeypatch, split):
    monkeypatch.setattr(writer_module, "CHUNK_CHARS", 20_000)  # ~20 chunks per worker count
    folders = {n: build(mixed, tmp_path / f"w{n}", n, split) for n in (1, 2, 3)}
    assert len(folders[1]) > 4  # several shards, manifest and tokenizer
    assert folders[1] == folders[2] == folders[3]
    manifest = json.loads(folders[1]["manifest.json"])
    assert manifest["encoder"]["piecewise"] + manifest["encoder"]["hf"] == sum(
        manifest["splits"][s]["documents"] for s in ("train", "val")
    )


def test_workers_start_from_a_script_without_a_main_guard(mixed, tmp_path):
    # multiprocessing's spawn would re-run this script in every worker; octlm's workers are
    # fresh interpreters that import only octlm, so a plain script (or stdin, or a notebook)
    # works as it is.
    script = tmp_path / "plain.py"
    script.write_text(
        "from pathlib import Path\n"
        "from octlm.prepare.text import PrepareConfig, prepare\n"
        "from octlm.prepare.sources import ReadOptions\n"
        f"cfg = PrepareConfig(out=Path({str(tmp_path / 'd')!r}), inputs=({str(mixed)!r},),\n"
        "    read=ReadOptions(split_on='<|endoftext|>'), vocab_size=300, context=16, workers=2)\n"
        "print(prepare(cfg, progress=False)['fingerprint'])\n"
    )
    for argv in ([str(script)], ["-"]):
        stdin = script.read_text() if argv == ["-"] else None
        done = subprocess.run(
            [sys.executable, *argv], input=stdin, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.strip()) == 64
        shutil.rmtree(tmp_path / "d")
