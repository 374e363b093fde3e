"""Split-vs-straight: a run stopped at K and resumed in a new process ends bit-identical.

Every run here is a real `python -m octlm train` subprocess on real shards. Each exactness
check has a negative control (a resume with the optimizer state wiped) that must differ, so
the comparison itself is shown able to fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from octlm.runlog.reader import read_log
from octlm.trainer import checkpoint as ckpt
from tests.e2e.helpers import (
    STEPS,
    assert_same_run,
    end_hash,
    octlm,
    optimizer_tensors,
    split_run,
    steps_of,
    train_args,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(straight_run):
    """Straight runs, trained once per session for each distinct set of extra flags."""
    return straight_run


@pytest.fixture(scope="module")
def straight(reference) -> dict[str, Path]:
    return {"fp32": reference(), "bf16": reference("--dtype", "bf16")}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("k", [2, 3, 6])  # inside warmup, at its edge, in the cosine
def test_split_equals_straight(tiny_dataset, straight, tmp_path, dtype, k) -> None:
    ref = straight[dtype]
    run = split_run(tiny_dataset, tmp_path / "split", k, "--dtype", dtype)
    assert end_hash(run) == end_hash(ref)
    assert steps_of(run) == steps_of(ref)  # every loss and grad norm, bit for bit
    a, b = optimizer_tensors(run), optimizer_tensors(ref)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_log_reads_as_one_run(tiny_dataset, tmp_path) -> None:
    run = split_run(tiny_dataset, tmp_path / "split", 4)
    records = read_log(run)
    steps = [r["step"] for r in records if r["type"] == "step"]
    assert steps == list(range(1, STEPS + 1))  # step numbers: the count done after each
    vals = [r["step"] for r in records if r["type"] == "val"]
    assert vals == sorted(set(vals)) == [3, 6, 8]
    resumes = [r for r in records if r.get("event") == "resume"]
    assert len(resumes) == 1 and resumes[0]["step"] == 4
    assert records[0]["type"] == "header" and records[-1]["type"] == "end"
    assert all(r["mem_mb"] > 0 for r in records if r["type"] == "step")  # CPU: resident MiB


def test_control_fresh_optimizer_differs(tiny_dataset, straight, tmp_path) -> None:
    """Negative control: wipe AdamW's moments in the checkpoint, and the run must differ."""
    out = tmp_path / "control"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "4"))
    path, sha = ckpt.find_checkpoint(out)
    read, tensors = ckpt.load_checkpoint(path, sha)
    meta = read.as_written()
    wiped = {k: (torch.zeros_like(v) if k.startswith("optim.") else v) for k, v in tensors.items()}
    header = {k: v for k, v in meta.items() if k not in ("format", "format_version")}
    ckpt.save_checkpoint(out, 4, header, wiped)
    octlm(*train_args(tiny_dataset, out, "--resume"))
    assert end_hash(out) != end_hash(straight["fp32"])
    ref_losses = [x[1] for x in steps_of(straight["fp32"])]
    losses = [x[1] for x in steps_of(out)]
    assert losses[:4] == ref_losses[:4] and losses[4:] != ref_losses[4:]


def test_sigterm_checkpoints_and_resumes_exactly(tiny_dataset, straight, tmp_path) -> None:
    out = tmp_path / "sig"
    env = {**os.environ, "OCTLM_CACHE": "/nonexistent-octlm-cache"}
    args = [sys.executable, "-m", "octlm", *train_args(tiny_dataset, out)]
    args[args.index("--steps") + 1] = str(STEPS)
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
    log = out / "log.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline:  # wait for the first step record, then interrupt
        if log.exists() and '"type": "step"' in log.read_text():
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    if "done:" in err:  # the run beat the signal; nothing to resume
        pytest.skip("run finished before SIGTERM arrived")
    assert "SIGTERM" in err and "checkpoint saved" in err
    stopped = [r for r in read_log(out) if r.get("event") == "stop"]
    assert stopped and stopped[0]["reason"] == "SIGTERM"
    octlm(*train_args(tiny_dataset, out, "--resume"))
    assert end_hash(out) == end_hash(straight["fp32"])


def test_resume_refuses_changed_trajectory(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "run"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "2"))
    proc = octlm(*train_args(tiny_dataset, out, "--resume", "--lr", "1e-3"), check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("octlm: error:")
    assert "config fingerprint" in lines[0] and "--lr 0.003 -> 0.001" in lines[0]
    # Intervals are not part of the trajectory: changing them resumes fine.
    octlm(*train_args(tiny_dataset, out, "--resume", "--val-every", "4", "--ckpt-every", "3"))


def test_new_run_refuses_existing_out(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "run"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "1"))
    before = (out / "log.jsonl").read_bytes()
    proc = octlm(*train_args(tiny_dataset, out), check=False)
    assert proc.returncode == 1 and "already holds a run" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (out / "log.jsonl").read_bytes() == before


def test_checkpoint_has_every_state_and_no_pickle(tiny_dataset, tmp_path) -> None:
    out = tmp_path / "run"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "2", "--keep-ckpts"))
    path, sha = ckpt.find_checkpoint(out)
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])  # safetensors: a JSON header, then raw tensor bytes
    meta = json.loads(header["__metadata__"]["octlm"])
    assert meta["format"] == "octlm-checkpoint" and meta["format_version"] == 1
    for key in ("train_state", "sampler", "optimizer", "rng", "fingerprints", "build", "config"):
        assert key in meta
    assert set(meta["fingerprints"]) == {"config", "data", "tokenizer"}
    assert meta["rng"]["python"] and meta["rng"]["numpy"]
    names = set(header) - {"__metadata__"}
    assert "rng.torch_cpu" in names
    assert any(k.endswith(".exp_avg") for k in names) and any(k.startswith("model.") for k in names)
    assert (out / "snapshots" / "step_000002.safetensors").is_file()
    hashed = octlm("hash", str(out / "snapshots" / "step_000002.safetensors")).stdout.split()[0]
    assert hashed == octlm("hash", str(out)).stdout.split()[0]


@pytest.fixture(scope="module")
def short_text(tmp_path_factory) -> Path:
    """Fewer tokens than one block: make_blocks pads it, so some targets are PAD (masked)."""
    path = tmp_path_factory.mktemp("blocks") / "short.txt"
    path.write_text("To be, or not to be, that is the question.\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(("--accum", "1"), id="accum1"),
        pytest.param(("--accum", "4"), id="accum4"),
        pytest.param(("--dropout", "0.1"), id="dropout"),
        pytest.param(("--grad-clip", "0"), id="no-clip"),
        pytest.param(("--deterministic-parts", "algorithms,attention"), id="det-parts"),
    ],
)
def test_split_equals_straight_variants(tiny_dataset, reference, tmp_path, variant) -> None:
    run = split_run(tiny_dataset, tmp_path / "split", 3, *variant)
    assert_same_run(run, reference(*variant))


def test_split_equals_straight_pad_masked_blocks(tiny_dataset, reference, short_text, tmp_path):
    from octlm.data.blocks import make_blocks
    from octlm.model.gpt import IGNORE_INDEX
    from octlm.tokenizer.core import Tokenizer

    blocks = make_blocks(
        [short_text.read_text()], Tokenizer.load(tiny_dataset / "tokenizer.json"), 32
    )
    assert (blocks.targets == IGNORE_INDEX).any()  # the path under test really masks targets
    flags = ("--blocks", str(short_text))
    run = split_run(tiny_dataset, tmp_path / "split", 5, *flags)
    assert_same_run(run, reference(*flags))


def test_straight_runs_are_deterministic(tiny_dataset, reference, tmp_path) -> None:
    out = tmp_path / "again"
    octlm(*train_args(tiny_dataset, out))
    assert_same_run(out, reference())


def test_intervals_do_not_touch_the_trajectory(tiny_dataset, reference, tmp_path) -> None:
    out = tmp_path / "intervals"
    octlm(*train_args(tiny_dataset, out, "--val-every", "2", "--ckpt-every", "1", "--keep-ckpts"))
    assert end_hash(out) == end_hash(reference())
    assert steps_of(out) == steps_of(reference())


def test_control_other_seed_differs(tiny_dataset, reference, tmp_path) -> None:
    out = tmp_path / "seed"
    octlm(*train_args(tiny_dataset, out, "--seed", "7"))
    assert end_hash(out) != end_hash(reference())
    assert steps_of(out)[0][1] != steps_of(reference())[0][1]


@pytest.mark.parametrize("reduction", ["collective", "tree"])
def test_control_rng_not_restored_differs_with_dropout(
    tiny_dataset, reference, tmp_path, reduction
) -> None:
    """Negative control: replace the checkpoint's torch RNG state. Under the collective sums
    dropout draws from the restored generator, so its masks then change; under the tree each
    micro-batch seeds its own draws from (seed, step, micro-batch): the run ends the same."""
    flags = ("--dropout", "0.1", "--reduction", reduction)
    out = tmp_path / "rng"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "3", *flags))
    path, sha = ckpt.find_checkpoint(out)
    read, tensors = ckpt.load_checkpoint(path, sha)
    meta = read.as_written()
    gen = torch.Generator().manual_seed(12345)
    tensors = {**tensors, "rng.torch_cpu": gen.get_state()}
    header = {k: v for k, v in meta.items() if k not in ("format", "format_version")}
    ckpt.save_checkpoint(out, 3, header, tensors)
    octlm(*train_args(tiny_dataset, out, "--resume", *flags))
    ref = reference(*flags)
    assert steps_of(out)[:3] == steps_of(ref)[:3]
    if reduction == "tree":
        assert steps_of(out) == steps_of(ref) and end_hash(out) == end_hash(ref)
        return
    assert steps_of(out)[3][1] != steps_of(ref)[3][1]
    assert end_hash(out) != end_hash(ref)


def test_diff_cli(tiny_dataset, reference, tmp_path) -> None:
    same = octlm("diff", str(reference()), str(reference()))
    assert same.returncode == 0 and same.stdout.startswith("match:")
    out = tmp_path / "seed"
    octlm(*train_args(tiny_dataset, out, "--seed", "8"))
    parted = octlm("diff", str(reference()), str(out), check=False)
    assert parted.returncode == 1
    assert "the runs part at step 1:" in parted.stdout and "loss" in parted.stdout


def test_hash_records_follow_validation(reference) -> None:
    records = read_log(reference())
    hashes = [r["step"] for r in records if r["type"] == "hash"]
    vals = [r["step"] for r in records if r["type"] == "val"]
    assert hashes == vals[:-1]  # the last validation's hash is in the end record


def test_verify_resume_cli(tiny_dataset, tmp_path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        f'model = "tiny"\ndata = "{tiny_dataset}"\nsteps = 6\nwarmup = 2\ncontext = 32\n'
        'micro_batch = 2\naccum = 2\ndtype = "fp32"\nval_every = 2\nval_batches = 1\n'
        "ckpt_every = 4\n"
    )
    proc = octlm(
        "verify-resume",
        "--config",
        str(config),
        "--split",
        "1",
        "--split",
        "4",
        "--workdir",
        str(tmp_path),
    )
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["run", "weights_sha256"]
    assert [ln.split()[0] for ln in lines[1:4]] == ["straight", "split@1", "split@4"]
    assert all(ln.rstrip().endswith("identical") for ln in lines[2:4])
    assert lines[-1].startswith("identical:")
    assert not any(p.name.startswith("octlm-verify-") for p in tmp_path.iterdir())  # cleaned up
    bad = octlm("verify-resume", "--config", str(config), "--split", "6", check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("octlm: error:")


def test_resumed_twice(tiny_dataset, straight, tmp_path) -> None:
    out = tmp_path / "twice"
    octlm(*train_args(tiny_dataset, out, "--stop-at", "2"))
    octlm(*train_args(tiny_dataset, out, "--resume", "--stop-at", "5"))
    octlm(*train_args(tiny_dataset, out, "--resume"))
    resumes = [r["step"] for r in read_log(out) if r.get("event") == "resume"]
    assert resumes == [2, 5]
    assert_same_run(out, straight["fp32"])
