"""--hash-tensors: per-tensor digests in the log, and `octlm diff` naming the first tensor where
two runs part. Controls with a known answer: one bit of one weight flipped in a checkpoint
(the resume's record of the weights it loaded names it), and one gradient moved by one ulp at a
known step (the loss matched, that gradient differs first). The digests change no bit, and a
resume may turn them on (they are not part of the fingerprint)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from octlm.cli.main import main
from octlm.config.shape import PRESETS
from octlm.model.gpt import GPT
from octlm.runlog.reader import read_log
from octlm.tools.rundiff import diff_folders
from octlm.trainer import checkpoint as ckpt
from octlm.trainer import loop
from octlm.trainer import step as step_module
from tests.e2e.helpers import (
    DIST_FLAGS,
    DIST_STEPS,
    dist_args,
    end_hash,
    octlm,
    run_cfg,
    steps_of,
    train_args,
)

pytestmark = pytest.mark.slow

DIGESTS = ("--hash-tensors", "--hash-every", "1")
K = 4
FLIPPED = "layers.1.attention.wq.weight"  # a weight in the middle of the model


@pytest.fixture(scope="module")
def digested(tiny_dataset: Path, tmp_path_factory) -> Path:
    """A straight run with every weight's and gradient's digest after every step. Read-only."""
    out = tmp_path_factory.mktemp("digests") / "straight"
    octlm(*train_args(tiny_dataset, out, *DIGESTS))
    return out


def test_digests_change_no_bit_and_a_resume_may_turn_them_on(digested, tiny_dataset, tmp_path):
    # Steps 1..K without digests, the rest with them: a changed fingerprint would refuse the
    # resume, a digest that touched a tensor would change the losses or the end hash.
    plain = tmp_path / "plain"
    octlm(*train_args(tiny_dataset, plain, "--stop-at", str(K)))
    octlm(*train_args(tiny_dataset, plain, "--resume", *DIGESTS))
    assert end_hash(plain) == end_hash(digested) and steps_of(plain) == steps_of(digested)
    records = [r for r in read_log(digested) if r["type"] == "tensors"]
    assert [r["step"] for r in records] == list(range(1, 9))  # the last step's too
    names = list(records[0]["weights"])
    assert FLIPPED in names and list(records[0]["grads"]) == names  # no buffers: tied, no biases
    assert all(
        len(d) == 16 for r in records for d in (*r["weights"].values(), *r["grads"].values())
    )
    loaded = [r for r in read_log(plain) if r["type"] == "tensors" and r.get("loaded")]
    assert [r["step"] for r in loaded] == [K] and "grads" not in loaded[0]
    lines, same = diff_folders(digested, plain)
    assert same, lines


def test_a_flipped_weight_bit_is_named_at_the_resume_that_loaded_it(
    digested, tiny_dataset, tmp_path, capsys
):
    out = tmp_path / "flipped"
    octlm(*train_args(tiny_dataset, out, "--stop-at", str(K), *DIGESTS))
    path, sha = ckpt.find_checkpoint(out)
    read, tensors = ckpt.load_checkpoint(path, sha)
    meta = read.as_written()
    key = ckpt.MODEL_PREFIX + FLIPPED
    flipped = tensors[key].clone()
    flipped.view(torch.int32).view(-1)[7] ^= 1  # fp32: the lowest mantissa bit of one element
    tensors[key] = flipped
    header = {k: v for k, v in meta.items() if k not in ("format", "format_version")}
    ckpt.save_checkpoint(out, K, header, tensors)
    octlm(*train_args(tiny_dataset, out, "--resume", *DIGESTS))
    assert main(["diff", str(digested), str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    want = (
        f"step {K}: {FLIPPED}'s weights differ first (as the resume loaded them; every "
        "gradient matched); the loss matched"
    )
    assert want in lines, lines
    assert "  weights that differ: " + FLIPPED in lines
    assert end_hash(out) != end_hash(digested)  # the flip is still there at the end


def test_one_ulp_in_one_gradient_is_named_and_the_loss_matched(tiny_dataset, tmp_path, monkeypatch):
    """In-process: the real backward runs, then one element of one gradient moves by one ulp at
    step BAD, in the second run only."""
    bad, runs = 3, {}
    for name in ("a", "b"):
        if name == "b":
            _nudge_gradient(monkeypatch, bad, FLIPPED)
        runs[name] = tmp_path / name
        # No clipping: a clip coefficient moved by the nudged norm would change every weight.
        cfg = run_cfg(tiny_dataset, runs[name], hash_tensors=True, hash_every=1, grad_clip=0.0)
        loop.train(cfg)
    lines, same = diff_folders(runs["a"], runs["b"])
    assert not same
    assert f"step {bad}: {FLIPPED}'s gradient differs first; the loss matched" in lines, lines
    assert f"  gradients that differ (backward order): {FLIPPED}" in lines
    # (AdamW may round the moved element to the same update: the weights can all match.)


def _nudge_gradient(monkeypatch, at_step: int, name: str) -> None:
    real = step_module._backward
    calls = {"n": 0}

    def nudged(setup, *args):
        loss = real(setup, *args)
        calls["n"] += 1  # one call per optimizer step
        if calls["n"] == at_step:
            grad = dict(setup.forward.named_parameters())[name].grad.view(-1)
            grad[0] = torch.nextafter(grad[0], torch.tensor(float("inf")))
        return loss

    monkeypatch.setattr(step_module, "_backward", nudged)


def test_fsdp_gathers_each_gradient_and_changes_no_bit(tiny_dataset, straight_run, tmp_path):
    """Under FSDP every gradient is a shard: each is gathered whole (a collective on every rank)
    and rank 0 logs its digest; the run ends on the bits of one without digests."""
    fsdp = ("--accum", "1", "--nproc", "2", "--parallel", "fsdp")
    plain, digests = straight_run(*DIST_FLAGS, *fsdp), tmp_path / "digests"
    octlm(*dist_args(tiny_dataset, digests, *fsdp, *DIGESTS))
    assert end_hash(digests) == end_hash(plain) and steps_of(digests) == steps_of(plain)
    records = [r for r in read_log(digests) if r["type"] == "tensors"]
    assert [r["step"] for r in records] == list(range(1, DIST_STEPS + 1))
    names = [n for n, _ in GPT(PRESETS["tiny"]).named_parameters()]
    assert all(list(r["grads"]) == names == list(r["weights"]) for r in records)
