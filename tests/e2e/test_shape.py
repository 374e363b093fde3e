"""A model shape of the user's own (`--d-model`, `--n-layers`, ... over `--model micro`) with the
warmup-stable-decay schedule: resumes bit-exact, differs from another shape, is recorded in the
log header and the fingerprint, and exports and generates. (A changed fingerprint refused on
resume is tests/test_golden.py's control.)

One straight run, one split run and one control (real `octlm train` subprocesses, about 15 s
on a shared 2-core CPU); export and generate run in-process on the straight run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octlm.cli.main import main
from octlm.config.files import make_config
from octlm.runlog.reader import read_log
from tests.e2e.helpers import assert_same_run, end_hash, octlm, steps_of
from tests.shared import shared

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "golden" / "v1-micro" / "data"  # vocabulary 300
SHAPE = ("--d-model", "48", "--n-heads", "4", "--n-kv-heads", "1", "--n-layers", "1")
SCHEDULE = ("--schedule", "wsd", "--decay-steps", "3", "--decay-shape", "1-sqrt")


def args(out: Path, *extra: str) -> list[str]:
    return [
        "train", "--model", "micro", "--data", str(DATA), "--out", str(out), "--steps", "6",
        "--warmup", "1", "--lr", "3e-3", "--context", "16", "--micro-batch", "2", "--accum", "2",
        "--val-every", "3", "--val-batches", "1", "--ckpt-every", "2", "--dtype", "fp32",
        "--no-progress", *SCHEDULE, *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    def build(root: Path) -> None:
        octlm(*args(root / "straight", *SHAPE))
        stop = octlm(*args(root / "split", *SHAPE, "--stop-at", "4"))
        assert "stopped at step 4" in stop.stderr
        octlm(*args(root / "split", *SHAPE, "--resume"))
        octlm(*args(root / "control", *SHAPE[:-2], "--n-layers", "2"))  # another shape

    root = shared(tmp_path_factory, "shape-runs", build)
    return {name: root / name for name in ("straight", "split", "control")}


def test_custom_shape_resumes_bit_exact_and_another_shape_differs(runs) -> None:
    assert_same_run(runs["split"], runs["straight"])
    assert end_hash(runs["control"]) != end_hash(runs["straight"])
    assert steps_of(runs["control"]) != steps_of(runs["straight"])


def test_the_resolved_shape_is_in_the_header_and_the_fingerprint(runs) -> None:
    header = read_log(runs["straight"])[0]
    shape = header["model_config"]
    assert (shape["d_model"], shape["n_heads"], shape["n_kv_heads"], shape["n_layers"]) == (
        48, 4, 1, 1
    )  # fmt: skip
    assert (shape["d_ff"], shape["vocab_size"], shape["context"]) == (96, 300, 16)  # micro's d_ff
    assert header["config"]["schedule"] == "wsd"
    lrs = [r["lr"] for r in read_log(runs["straight"]) if r["type"] == "step"]
    assert lrs[:4] == [3e-3] * 4 and lrs[4] > lrs[5]  # held, then the decay's last steps
    plain = make_config(None, **{**header["config"], "d_model": None, "n_heads": None})
    assert header["fingerprints"]["config"] != plain.fingerprint_for(1)


def test_a_custom_shape_exports_and_generates(runs, tmp_path, capsys) -> None:
    hf = tmp_path / "hf"
    assert main(["export", str(runs["straight"]), str(hf)]) == 0
    config = json.loads((hf / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (48, 1)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 1)
    capsys.readouterr()
    argv = ["generate", str(runs["straight"]), "--prompt", "ROMEO:", "--max-new-tokens", "5"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")


def test_print_config_round_trips_through_config(tmp_path, capsys) -> None:
    """What --print-config prints is a --config file for the same run; nothing is written."""
    out = tmp_path / "never"
    assert main([*args(out, *SHAPE), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert not out.exists()
    assert 'schedule = "wsd"' in printed and "d_ff = 96" in printed  # the preset's, written out
    path = tmp_path / "printed.toml"
    path.write_text(printed)
    assert main(["train", "--config", str(path), "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    printed_cfg = make_config(path)
    not_given = {k: None for k in ("d_ff", "rope_base", "norm_eps", "init_std")}
    # The preset's values written out are the same run as leaving them out.
    assert printed_cfg.fingerprint_for(1) == printed_cfg.replace(**not_given).fingerprint_for(1)
    assert printed_cfg.replace(**not_given).shape.resolved() == printed_cfg.shape.resolved()
