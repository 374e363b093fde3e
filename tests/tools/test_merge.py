"""`octlm merge`: the float32 mean of a run's last checkpoints, as a folder the other commands
read like a run; bad merges are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from octlm.generation.trained import load_weights
from octlm.hashing import weights_sha256
from octlm.tools.report import runs as report_runs
from octlm.trainer import checkpoint as ckpt
from tests.e2e.helpers import octlm, train_args

pytestmark = pytest.mark.slow

KEEP = ("--ckpt-every", "2", "--keep-ckpts")
"""8 steps: snapshots at steps 2, 4, 6 and 8, and the last two listed checkpoints."""


@pytest.fixture(scope="module")
def run(straight_run) -> Path:
    return straight_run(*KEEP)


def weights_at(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_weights(run / "snapshots" / f"step_{step:06d}.safetensors")[1]


def test_the_last_three_are_averaged_in_float32(run, tmp_path) -> None:
    out = tmp_path / "merged"
    printed = octlm("merge", str(run), "--last", "3", "-o", str(out)).stdout
    merged = load_file(out / "model.safetensors")
    parts = [weights_at(run, step) for step in (4, 6, 8)]
    for name, tensor in merged.items():
        assert tensor.dtype == torch.float32
        expected = (parts[0][name] + parts[1][name] + parts[2][name]) / 3  # oldest first
        assert torch.equal(tensor, expected), name
        torch.testing.assert_close(tensor, torch.stack([p[name] for p in parts]).mean(0))
    record = json.loads((out / "merge.json").read_text())
    assert [p["step"] for p in record["merged_from"]] == [4, 6, 8]
    assert record["weights_sha256"] == weights_sha256(merged) in printed
    assert record["weights_sha256"] != weights_sha256(parts[-1])  # control: not the last one
    again = tmp_path / "again"
    octlm("merge", str(run), "--last", "3", "-o", str(again))
    assert json.loads((again / "merge.json").read_text()) == record  # reproducible


def test_named_files_with_weights(run, tmp_path) -> None:
    files = [str(run / "snapshots" / f"step_{s:06d}.safetensors") for s in (2, 8)]
    out = tmp_path / "weighted"
    octlm("merge", *files, "--weights", "1,3", "-o", str(out))
    merged = load_file(out / "model.safetensors")
    a, b = weights_at(run, 2), weights_at(run, 8)
    for name, tensor in merged.items():
        assert torch.equal(tensor, (a[name] + 3 * b[name]) / 4), name


def test_the_merge_folder_is_read_like_a_run(run, tiny_dataset, tmp_path) -> None:
    out = tmp_path / "merged"
    octlm("merge", str(run), "--last", "2", "-o", str(out))
    digest = json.loads((out / "merge.json").read_text())["weights_sha256"]
    assert octlm("hash", str(out)).stdout.split()[0] == digest
    evals = [octlm("eval", str(folder), "--batches", "2").stdout for folder in (out, run)]
    assert "bpb" in evals[0] and evals[0].split(":")[1] != evals[1].split(":")[1]
    # A merge's eval also scores the newest checkpoint it was made of, and prints the change.
    # Each model's line is followed by what it scored: the run's own validation windows.
    merged_line, scored, last_line, last_scored, *deltas = evals[0].splitlines()
    assert [last_line, last_scored] == evals[1].splitlines()  # the run's newest checkpoint
    assert scored == last_scored.replace(
        "the run's own validation settings",
        "the validation settings of step_000008.safetensors, the newest checkpoint merged",
    )
    bpb = [float(line.split("bpb ")[1].split()[0]) for line in (merged_line, last_line)]
    assert deltas[-1].startswith("merged - last (8): bpb ")
    assert float(deltas[-1].split()[5]) == pytest.approx(bpb[0] - bpb[1], abs=2e-4)
    assert deltas[-1].endswith("(better)" if bpb[0] < bpb[1] else "(not better)")
    printed = octlm("eval", str(out), "--batches", "2", "--json").stdout.splitlines()
    records = [json.loads(line) for line in printed]  # --json: every line one JSON object
    assert records[-1]["merged_minus_last"]["bpb"]["delta"] == pytest.approx(
        bpb[0] - bpb[1], abs=2e-4
    )
    assert octlm("generate", str(out), "--prompt", "ROMEO:", "--max-new-tokens", "8").stdout
    octlm("export", str(out), str(tmp_path / "exported"), "--format", "safetensors")
    assert weights_sha256(load_file(tmp_path / "exported" / "model.safetensors")) == digest
    tuned = tmp_path / "tuned"
    octlm(*train_args(tiny_dataset, tuned, "--init-from", str(out), "--steps", "4"))
    refused = octlm(*train_args(tiny_dataset, out), check=False)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "holds merged weights" in refused.stderr and "--init-from" in refused.stderr


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("--last", "9"), "fewer than --last 9"),
        (("--last", "1"), "--last 1 must be an integer from 2"),
        (("--last", "3", "--weights", "1,2"), "2 weight(s) for 3 checkpoints"),
        (("--last", "2", "--weights", "1,-1"), "each must be a finite number > 0"),
        (("--last", "2", "--weights", "a,b"), "is not a list of numbers"),
    ],
    ids=["too-few-kept", "one", "weights-count", "negative-weight", "not-numbers"],
)
def test_a_bad_merge_is_one_line_and_writes_nothing(run, tmp_path, argv, expected) -> None:
    out = tmp_path / "merged"
    proc = octlm("merge", str(run), *argv, "-o", str(out), check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert expected in proc.stderr
    assert not out.exists()


def test_checkpoints_of_another_shape_are_refused(run, straight_run, tmp_path) -> None:
    other = straight_run("--d-model", "96")
    proc = octlm("merge", str(run), str(other), "-o", str(tmp_path / "m"), check=False)
    assert proc.returncode == 1 and "another shape" in proc.stderr, proc.stderr


def test_the_report_names_the_merge_record_as_the_checkpoint_module_does() -> None:
    assert report_runs.MERGE_RECORD == ckpt.MERGE_RECORD


def test_a_merge_scored_on_a_suite_prints_merged_minus_last_per_task(run, tmp_path) -> None:
    """`octlm eval MERGE --tasks SUITE...`: each task's centered score (bpb for a bpb task) of
    the merge against the newest checkpoint it was made of."""
    pytest.importorskip("pyarrow", reason="the suites read the package's Arrow files")
    out = tmp_path / "merged"
    octlm("merge", str(run), "--last", "2", "-o", str(out))
    spec = "core-lite/piqa:3,small-suite/lambada_bpb:2"
    printed = octlm("eval", str(out), "--tasks", spec).stdout.splitlines()
    deltas = [line for line in printed if line.startswith("merged - last (8): ")]
    assert [d.split()[4:6] for d in deltas] == [
        ["core-lite/piqa", "centered"],
        ["small-suite/lambada_bpb", "bpb"],
    ]
    merged = [line for line in printed if "task core-lite/piqa:" in line]
    last = octlm("eval", str(run), "--tasks", "core-lite/piqa:3").stdout
    centered = [float(t.split("centered ")[1].split()[0]) for t in (merged[0], last)]
    assert float(deltas[0].split()[6]) == pytest.approx(centered[0] - centered[1], abs=1e-4)
