"""Write the golden run folder: a micro run stopped at step 6 by the octlm of the day.

Run once, by the code whose run folders later versions must keep resuming exactly:

    OMP_NUM_THREADS=1 python tests/golden/make_golden.py tests/golden/v1-micro

It writes `data/` (a prepared dataset, vocabulary 300), `config.toml`, `run/` (the folder as a
user has it after `--stop-at 6`: one checkpoint, the log) and `expected.json`: the log records
and final weights_sha256 of the same run trained straight through in one process.
tests/test_golden.py resumes a copy of `run/` with today's code and must end on those bits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

STOP = 6
CONFIG = """\
model = "micro"
steps = 12
warmup = 3
lr = 3e-3
context = 32
micro_batch = 2
accum = 2
val_every = 4
val_batches = 2
ckpt_every = 4
keep_last = 1
dtype = "fp32"
progress = false
"""


def octlm(*args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "octlm", *args], check=True, env=env)


def main(target: Path) -> None:
    from octlm.prepare.corpus import embedded_documents

    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    docs = sorted(embedded_documents(), key=lambda d: d.id)[:6]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "docs.jsonl"
        src.write_text(
            "".join(json.dumps({"id": d.id, "text": d.text[:6000]}) + "\n" for d in docs)
        )
        octlm("prepare", str(src), "--out", str(target / "data"), "--vocab-size", "300",
              "--context", "32", "--val-fraction", "0.34")  # fmt: skip
        (target / "config.toml").write_text(CONFIG)
        common = ["train", "--config", str(target / "config.toml"), "--data", str(target / "data")]
        octlm(*common, "--out", str(target / "run"), "--stop-at", str(STOP))
        straight = Path(tmp) / "straight"
        octlm(*common, "--out", str(straight))
        records = [json.loads(x) for x in (straight / "log.jsonl").read_text().splitlines()]
    (target / "run" / ".lock").unlink(missing_ok=True)
    keep = ("type", "step", "loss", "grad_norm", "lr", "tokens", "val_loss", "val_bpb",
            "weights_sha256")  # fmt: skip
    expected = {
        "stop": STOP,
        "weights_sha256": records[-1]["weights_sha256"],
        "records": [{k: r[k] for k in keep if k in r} for r in records[1:]],
    }
    (target / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
