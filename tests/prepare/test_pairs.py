"""`octlm prepare --format prompt-completion`: what it writes (shards, a loss-mask stream, a
version-2 manifest whose fingerprint covers the mask) and what it refuses: one line naming the
file and line, nothing at --out."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from octlm.data.packed import example_bounds
from octlm.data.packing import CONTEXT, START, TARGET
from octlm.data.shards import MASKED_MANIFEST_VERSION, ShardDataset
from octlm.errors import DataError
from octlm.prepare.pairs import PairsConfig, prepare_pairs
from octlm.prepare.split import SplitRule
from octlm.tokenizer.core import Tokenizer
from tests import octlm_process

TOKENIZER = Path(__file__).parents[1] / "golden" / "v1-micro" / "data" / "tokenizer.json"
PAIRS = [
    {"prompt": f"Question {i}: what is {i} and {i}?\nAnswer:", "completion": f" {2 * i}."}
    for i in range(40)
]


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def config(tmp_path: Path, *inputs: Path, **kw) -> PairsConfig:
    base = {"out": tmp_path / "out", "inputs": tuple(map(str, inputs)), "tokenizer": TOKENIZER}
    return PairsConfig(**{**base, "context": 64, **kw})


def test_writes_tokens_a_mask_and_a_version_2_manifest(tmp_path) -> None:
    src = jsonl(tmp_path / "pairs.jsonl", PAIRS)
    manifest = prepare_pairs(config(tmp_path, src))
    assert manifest["manifest_version"] == MASKED_MANIFEST_VERSION
    assert manifest["loss_mask"]["version"] == 1
    ds = ShardDataset.open(tmp_path / "out", verify_checksums=True)
    assert ds.masked and len(ds.train_mask) == len(ds.train)
    assert manifest["splits"]["val"]["documents"] == 4  # 10% of 40 examples
    tok = Tokenizer.load(ds.tokenizer_path)
    assert ds.tokenizer_fingerprint == Tokenizer.load(TOKENIZER).fingerprint
    starts, lengths = example_bounds(ds.train_mask)
    texts = set()
    for start, n in zip(starts.tolist(), lengths.tolist(), strict=True):
        ids = ds.train.window(start, n)
        marks = ds.train_mask.window(start, n)
        assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and marks[0] == START
        prompt = tok.decode(ids[marks == CONTEXT])
        completion = tok.decode(ids[marks == TARGET])
        texts.add((prompt, completion))
    expected = {(p["prompt"], p["completion"]) for p in PAIRS}
    assert texts < expected and len(texts) == 36
    assert manifest["splits"]["train"]["targets"] == int(
        (np.asarray(ds.train_mask.shards[0]) == TARGET).sum()
    )


def test_the_fingerprint_covers_the_mask(tmp_path) -> None:
    src = jsonl(tmp_path / "pairs.jsonl", PAIRS)
    prepare_pairs(config(tmp_path, src))
    out = tmp_path / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["splits"]["train"]["mask_shards"][0]["sha256"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="was edited"):
        ShardDataset.open(out)


def test_the_same_ids_split_the_same_way_and_gzip_reads_the_same(tmp_path) -> None:
    a = prepare_pairs(config(tmp_path, jsonl(tmp_path / "a.jsonl", PAIRS)))
    with gzip.open(tmp_path / "a.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in PAIRS))
    b = prepare_pairs(config(tmp_path, tmp_path / "a.jsonl.gz", out=tmp_path / "b"))
    # ids are NAME:LINE: another file name splits the examples in another way...
    assert a["splits"]["val"]["document_ids_sha256"] != b["splits"]["val"]["document_ids_sha256"]
    with_ids = [{**p, "id": f"q{i}"} for i, p in enumerate(PAIRS)]
    c = prepare_pairs(config(tmp_path, jsonl(tmp_path / "c.jsonl", with_ids), out=tmp_path / "c"))
    d = prepare_pairs(
        config(tmp_path, jsonl(tmp_path / "d.jsonl", with_ids[::-1]), out=tmp_path / "d")
    )
    # ...while records' own ids decide it whatever the file or the order.
    assert c["splits"]["val"]["documents"] == d["splits"]["val"]["documents"] == 4
    val_c = ShardDataset.open(tmp_path / "c").val
    val_d = ShardDataset.open(tmp_path / "d").val
    assert sorted(val_c.window(0, len(val_c))) == sorted(val_d.window(0, len(val_d)))


def test_parquet_and_arrow_tables_prepare_like_the_same_json_lines(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{"id": f"q{i}", **p} for i, p in enumerate(PAIRS)]
    ref = prepare_pairs(config(tmp_path, jsonl(tmp_path / "ref.jsonl", rows), out=tmp_path / "j"))
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "pairs.parquet", row_group_size=7)  # several batches
    with (
        pa.OSFile(str(tmp_path / "pairs.arrow"), "wb") as sink,
        pa.ipc.new_file(sink, table.schema) as writer,
    ):
        writer.write_table(table, max_chunksize=9)
    want = ShardDataset.open(tmp_path / "j")
    for name in ("pairs.parquet", "pairs.arrow"):
        out = tmp_path / name.removeprefix("pairs.")
        got = prepare_pairs(config(tmp_path, tmp_path / name, out=out))
        ds = ShardDataset.open(out)
        assert (
            got["splits"]["val"]["document_ids_sha256"]
            == (ref["splits"]["val"]["document_ids_sha256"])
        )  # the id column decides the split, as the JSON lines' "id" does
        for split in ("train", "val"):
            a, b = getattr(ds, split), getattr(want, split)
            assert np.array_equal(a.window(0, len(a)), b.window(0, len(b))), (name, split)
            m, n = getattr(ds, f"{split}_mask"), getattr(want, f"{split}_mask")
            assert np.array_equal(m.window(0, len(m)), n.window(0, len(n))), (name, split)


def test_bad_tables_are_one_line_and_write_nothing(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    cases = {
        "no column": (
            {"question": ["a"], "completion": ["b"]},
            "has no column 'prompt' (columns: question, completion); name the prompt column "
            "with --prompt-field",
        ),
        "null": ({"prompt": ["a", "b"], "completion": ["c", None]}, "row 2: column 'completion'"),
        "not strings": (
            {"prompt": ["a"], "completion": [3]},
            "column 'completion' holds int64, not strings; name the completion column with "
            "--completion-field",
        ),
    }
    for name, (columns, says) in cases.items():
        src = tmp_path / "x.parquet"
        pq.write_table(pa.table(columns), src)
        with pytest.raises(DataError) as err:
            prepare_pairs(config(tmp_path, src))
        assert says in f"{err.value.problem}; {err.value.fix}", name
        assert not (tmp_path / "out").exists(), name


BAD = {
    "missing": (
        [{"prompt": "a", "completion": "b"}, {"prompt": "a"}],
        "x.jsonl:2 has no field 'completion'",
    ),
    "number": ([{"prompt": 3, "completion": "b"}], "x.jsonl:1: field 'prompt' holds a int"),
    "null": ([{"prompt": "a", "completion": None}], "field 'completion' holds a NoneType"),
    "list": ([["a", "b"]], "x.jsonl:1 is not a JSON object"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_lines_name_the_file_and_line_and_write_nothing(tmp_path, case) -> None:
    rows, says = BAD[case]
    src = jsonl(tmp_path / "x.jsonl", rows * 3 if case != "missing" else rows)
    with pytest.raises(DataError) as err:
        prepare_pairs(config(tmp_path, src))
    assert says in str(err.value)
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["x.jsonl"]


def test_refusals_of_the_rule_and_the_fields(tmp_path) -> None:
    src = jsonl(tmp_path / "pairs.jsonl", PAIRS)
    with pytest.raises(DataError, match="--val-tokens does not apply"):
        prepare_pairs(config(tmp_path, src, split=SplitRule()))
    with pytest.raises(DataError, match="both 'prompt'"):
        prepare_pairs(config(tmp_path, src, completion_field="prompt"))
    with pytest.raises(DataError, match="no field 'question'"):
        prepare_pairs(config(tmp_path, src, prompt_field="question"))
    with pytest.raises(DataError, match="no train example fits in --context 8"):
        prepare_pairs(config(tmp_path, src, context=8))
    assert not (tmp_path / "out").exists()


def octlm(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return octlm_process.run([*map(str, args)], dict(os.environ), cwd=cwd, timeout=300)


@pytest.mark.slow
def test_the_cli_says_one_line_and_exits_1(tmp_path) -> None:
    jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "completion": 1}])
    jsonl(tmp_path / "good.jsonl", PAIRS)
    base = ["prepare", "--format", "prompt-completion", "--out", "out"]
    cases = {
        "bad line": ([*base, "bad.jsonl", "--tokenizer", TOKENIZER], "bad.jsonl:1: field"),
        "no tokenizer": ([*base, "good.jsonl"], "needs --tokenizer"),
        "text field": ([*base, "good.jsonl", "--tokenizer", TOKENIZER, "--text-field", "q"],
                       "--text-field has no effect"),
        "fields without format": (["prepare", "good.jsonl", "--prompt-field", "q", "--out", "o"],
                                  "need --format prompt-completion"),
    }  # fmt: skip
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = {k: pool.submit(octlm, *a, cwd=tmp_path) for k, (a, _) in cases.items()}
        for name, future in results.items():
            proc = future.result()
            assert proc.returncode == 1, (name, proc.stderr)
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("octlm: error: "), (name, proc.stderr)
            assert cases[name][1] in lines[0], (name, lines[0])
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()
    good = octlm(*base, "good.jsonl", "--tokenizer", TOKENIZER, "--context", "64", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert "packed windows, padding" in good.stdout
