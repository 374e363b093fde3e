"""`octlm eval RUN`: by default the run's own validation (its micro-batch, context, val_batches
and dtype, read from the checkpoint), so the loss it prints is the run's logged `val_loss` at
the checkpoint's step, to the bit; a flag that changes what is scored says so in the line, and
a file that records no settings is scored at the defaults, saying so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from octlm.runlog.reader import read_log
from octlm.trainer import checkpoint as ckpt
from tests.e2e.helpers import STEPS, octlm, train_args

pytestmark = pytest.mark.slow

OWN = (
    "scored 2 batches × 2 rows × 32 tokens = 128 tokens of val (the run's own validation settings)"
)
"""The standard tiny run's validation (tests/e2e/helpers.py train_args): 2 batches of 2."""


def logged_val(run: Path, step: int) -> dict:
    (record,) = [r for r in read_log(run) if r["type"] == "val" and r["step"] == step]
    return record


def evaluated(*args: str) -> dict:
    return json.loads(octlm("eval", *args, "--json").stdout)


def test_eval_prints_the_logged_validation_of_its_step(straight_run) -> None:
    run = straight_run()
    logged = logged_val(run, STEPS)
    got = evaluated(str(run))
    assert got["step"] == STEPS
    assert got["loss"] == logged["val_loss"]  # the same bits, not approximately
    assert (got["bpb"], got["tokens"]) == (logged["val_bpb"], logged["val_tokens"])
    assert got["scored"] == OWN
    lines = octlm("eval", str(run)).stdout.splitlines()
    assert lines[0].endswith(f"val: loss {logged['val_loss']:.4f}  ppl {logged['val_ppl']:.3f}  "
                             f"bpb {logged['val_bpb']:.4f}  (128 tokens)")  # fmt: skip
    assert lines[1:] == [OWN]
    # A flag at the run's own value changes nothing; another micro-batch is another number.
    assert evaluated(str(run), "--micro-batch", "2", "--dtype", "fp32") == got
    other = evaluated(str(run), "--micro-batch", "4")
    assert other["loss"] != logged["val_loss"] and other["tokens"] == 256
    assert other["scored"] == (
        "scored 2 batches × 4 rows × 32 tokens = 256 tokens of val "
        "(not the run's validation: --micro-batch 4)"
    )


@pytest.mark.parametrize(
    ("kind", "scored"),
    [
        ("overfit", "2 batches × 2 rows × 32 tokens = 128 tokens of the run's memorised training "
                    "windows"),
        ("mixture", "5 rows (3 batches of up to 2) × 32 tokens = 160 tokens of val of the "
                    "mixture's 2 datasets"),
    ],
    ids=["overfit", "mixture"],
)  # fmt: skip
def test_runs_that_validate_elsewhere_too(kind, scored, tiny_dataset, few_speeches, tmp_path):
    """An overfit run validates on the blocks it memorises, a mixture on each dataset's val."""
    data, extra = tiny_dataset, ("--overfit-blocks", "4")
    if kind == "mixture":  # the few speeches' val split is one window
        data, extra = Path(f"{tiny_dataset}:0.5,{few_speeches}:0.5"), ()
    out = tmp_path / "run"
    octlm(*train_args(data, out, *extra))
    logged, got = logged_val(out, STEPS), evaluated(str(out))
    assert (got["loss"], got["tokens"]) == (logged["val_loss"], logged["val_tokens"])
    assert got["scored"] == f"scored {scored} (the run's own validation settings)"


def test_a_file_without_the_settings_is_scored_at_the_defaults(straight_run, tmp_path) -> None:
    """An older checkpoint whose config lacks keys, and one with no config at all."""
    path, _ = ckpt.find_checkpoint(straight_run())
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["octlm"])
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    for key in ("val_batches", "micro_batch"):
        del meta["config"][key]
    old = tmp_path / "old.safetensors"
    save_file(tensors, old, {"octlm": json.dumps(meta)})
    got = evaluated(str(old))
    assert got["tokens"] == 40 * 16 * 32
    assert got["scored"] == (
        "scored 40 batches × 16 rows × 32 tokens = 20,480 tokens of val (the run's own validation "
        "settings; val_batches not recorded: the default 40; micro_batch not recorded: the "
        "default 16)"
    )
    del meta["config"]
    save_file(tensors, old, {"octlm": json.dumps(meta)})
    assert evaluated(str(old))["scored"] == (
        "scored 40 batches × 16 rows × 32 tokens = 20,480 tokens of val (old.safetensors records "
        "no run settings: the defaults, 40 batches of 16, fp32)"
    )
