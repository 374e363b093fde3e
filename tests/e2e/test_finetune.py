"""Masked fine-tuning resumes exactly: prompt/completion data prepared with the golden run's
tokenizer, packed at context 64, trained by real `python -m octlm train` subprocesses. Split vs
straight with accumulation 1 (random order) and 4 (epoch order), and stopped on 2 DDP processes
then resumed on 1. Controls: the same pairs with the prompt in the loss end elsewhere and count
more targets; a resume at another context (other windows) is refused in one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from octlm.data.packed import PackedWindows
from octlm.data.packing import TARGET
from octlm.data.shards import ShardDataset
from octlm.evaluate.loss import evaluate_split
from octlm.generation.trained import load_model
from octlm.prepare.corpus import embedded_documents
from octlm.runlog.reader import read_log
from octlm.tokenizer.core import Tokenizer
from tests.e2e.helpers import end_hash, octlm, steps_of
from tests.shared import shared

pytestmark = pytest.mark.slow

TOKENIZER = Path(__file__).parents[1] / "golden" / "v1-micro" / "data" / "tokenizer.json"
STEPS, CONTEXT, WINDOWS_PER_STEP = 8, 64, 8


def dialogue_pairs(limit: int) -> list[dict[str, str]]:
    """Line-and-reply pairs from the embedded plays: a speech's last line and the next speaker's
    name as the prompt, the reply's first line as the completion."""
    pairs = []
    for work in sorted(embedded_documents(), key=lambda d: d.id):
        speeches = [s.split("\n") for s in work.text.split("\n\n")]
        speeches = [s for s in speeches if len(s) > 1 and s[0].isupper() and s[0].endswith(".")]
        for a, b in zip(speeches, speeches[1:], strict=False):
            pairs.append({"prompt": f"{a[-1]}\n{b[0]}\n", "completion": b[1]})
            if len(pairs) == limit:
                return pairs
    return pairs


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    def build(root: Path) -> None:
        pairs = dialogue_pairs(1200)
        masked = write_jsonl(root / "pairs.jsonl", pairs)
        # The control: the same text with the prompt moved into the completion (so the loss).
        unmasked = write_jsonl(
            root / "unmasked.jsonl",
            [{"prompt": "", "completion": p["prompt"] + p["completion"]} for p in pairs],
        )
        for name, src in (("masked", masked), ("unmasked", unmasked)):
            octlm("prepare", str(src), "--format", "prompt-completion", "--tokenizer",
                  str(TOKENIZER), "--context", str(CONTEXT), "--out", str(root / name))  # fmt: skip

    root = shared(tmp_path_factory, "finetune-data", build)
    return {name: root / name for name in ("masked", "unmasked")}


def args(
    data: Path, out: Path, *extra: str, accum: int = 1, order: str = "random", micro: int = 0
) -> list[str]:
    micro = micro or WINDOWS_PER_STEP // accum
    return [
        "train", "--model", "micro", "--data", str(data), "--out", str(out),
        "--steps", str(STEPS), "--warmup", "2", "--lr", "3e-3", "--context", str(CONTEXT),
        "--micro-batch", str(micro), "--accum", str(accum),
        "--val-every", "4", "--val-batches", "2", "--ckpt-every", "3", "--dtype", "fp32",
        "--no-progress", "--order", order, *extra,
    ]  # fmt: skip


SETTINGS = {"accum1": {"accum": 1}, "accum4-epoch": {"accum": 4, "order": "epoch"}}


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory) -> dict[str, Path]:
    settings = {**SETTINGS, "accum2": {"accum": 2}}

    def build(root: Path) -> None:
        for name, kw in settings.items():
            octlm(*args(data["masked"], root / name, **kw))

    root = shared(tmp_path_factory, "finetune-straight", build)
    return {name: root / name for name in settings}


@pytest.mark.parametrize(("name", "k"), [("accum1", 3), ("accum4-epoch", 5)])
def test_split_equals_straight(data, straight, tmp_path, name, k) -> None:
    out, kw = tmp_path / name, SETTINGS[name]
    assert (
        f"stopped at step {k}"
        in octlm(*args(data["masked"], out, "--stop-at", str(k), **kw)).stderr
    )
    assert "resumed from" in octlm(*args(data["masked"], out, "--resume", **kw)).stderr
    assert end_hash(out) == end_hash(straight[name])
    assert steps_of(out) == steps_of(straight[name])
    vals = [r for r in read_log(out) if r["type"] == "val"]
    assert vals == [r for r in read_log(straight[name]) if r["type"] == "val"]


def test_ddp_two_processes_stopped_then_one_process_resumed(data, straight, tmp_path) -> None:
    """2 ranks x accum 1 x 4 windows, resumed by 1 process with accum 2 (from the checkpoint):
    the straight accum-2 run's windows per step, and its bits (a + b either way)."""
    out = tmp_path / "ddp"
    half = WINDOWS_PER_STEP // 2
    octlm(*args(data["masked"], out, "--nproc", "2", "--stop-at", "4", accum=1, micro=half))
    proc = octlm(*args(data["masked"], out, "--resume", accum=1, micro=half))
    assert "to keep the global batch" in proc.stderr
    assert end_hash(out) == end_hash(straight["accum2"])
    assert steps_of(out) == steps_of(straight["accum2"])


def test_control_the_prompt_in_the_loss_ends_elsewhere(data, straight, tmp_path) -> None:
    out = tmp_path / "unmasked"
    octlm(*args(data["unmasked"], out))
    assert end_hash(out) != end_hash(straight["accum1"])
    masked = [r["val_tokens"] for r in read_log(straight["accum1"]) if r["type"] == "val"]
    unmasked = [r["val_tokens"] for r in read_log(out) if r["type"] == "val"]
    assert unmasked[0] > 1.5 * masked[0]  # the prompts are scored too


def test_the_header_records_the_packing_and_validation_counts_only_targets(data, straight):
    header = read_log(straight["accum1"])[0]
    dataset = ShardDataset.open(data["masked"])
    tok = Tokenizer.load(dataset.tokenizer_path)
    val = PackedWindows.of_split(dataset, "val", CONTEXT)
    assert header["packing"]["val"]["windows"] == len(val)
    n_windows = min(2 * WINDOWS_PER_STEP, len(val))
    targets = sum(int((val.window(k)[1] != -100).sum()) for k in range(n_windows))
    logged = [r for r in read_log(straight["accum1"]) if r["type"] == "val"]
    assert logged[0]["val_tokens"] == targets
    # Only completion tokens and the EOS count: the mask's TARGET marks of those windows.
    marks = sum(
        int((val.mask.window(int(val.starts[i]), int(val.lengths[i])) == TARGET).sum())
        for i in val.members[: val.bounds[n_windows]]
    )
    assert targets == marks
    # `octlm eval`'s reading of the split agrees with the run's own validation of it.
    model, _ = load_model(straight["accum1"])
    result = evaluate_split(model, dataset, tok.token_bytes_table, batches=2,
                            micro_batch=WINDOWS_PER_STEP)  # fmt: skip
    assert result.tokens == logged[-1]["val_tokens"]
    assert result.loss == pytest.approx(logged[-1]["val_loss"], rel=1e-6)
    assert np.isfinite(result.bpb)
    # `octlm eval RUN` itself is the run's own validation: the logged number, to the bit.
    got = json.loads(octlm("eval", str(straight["accum1"]), "--json").stdout)
    assert (got["loss"], got["tokens"]) == (logged[-1]["val_loss"], targets)
    assert got["scored"] == (
        f"scored 2 batches × 8 rows × 64 tokens of val: {targets:,} targets, the rest masked "
        "(the run's own validation settings)"
    )


def test_a_resume_at_another_context_is_refused_in_one_line(data, straight, tmp_path) -> None:
    out = tmp_path / "ctx"
    shutil.copytree(straight["accum1"], out)
    changed = [a if a != str(CONTEXT) else "48" for a in args(data["masked"], out, "--resume")]
    proc = octlm(*changed, "--steps", str(STEPS + 2), "--allow-config-change", check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith("octlm: error: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "packed prompt/completion windows" in proc.stderr
