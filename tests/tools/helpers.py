"""Run folders the tool tests share, made in-process: a log as the trainer writes one, the marks a
kill or a bad disk leaves in it, and a tiny checkpoint. Test modules import from here, never
from each other.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from octlm.runlog.reader import LOG_NAME
from octlm.runlog.writer import RunLog
from octlm.trainer.checkpoint import save_checkpoint

TOKENS_PER_STEP = 64
CUT_LINE = '{"type": "step", "step": 99, "loss": 4.'  # a line a kill cut short
GARBAGE_LINE = "\x00\x00 not json \ufffd"


def loss_at(step: int) -> float:
    return 5.0 - step / 10


def write_log(
    folder: Path,
    steps: int = 6,
    *,
    losses: dict[int, float] | None = None,
    hashes: dict[int, str] | None = None,
    end: bool = True,
    first: int = 1,
) -> Path:
    """A log as a run writes it: a header, steps `first`..`steps` (numbered as the log numbers
    them: the count done after each) with a validation and a weights hash after every even
    step, and (with `end`) the end record. `losses` and `hashes` replace the values at those
    steps (the end record's hash is that of step `steps`)."""
    losses, hashes = losses or {}, hashes or {}
    log = RunLog(folder)
    log.open()
    if first == 1:
        config = {"steps": steps, "warmup": 2, "lr": 1e-3, "min_lr_ratio": 0.1, "grad_clip": 1.0}
        log.header({"config": config, "tokens_per_step": TOKENS_PER_STEP, "data_dir": None})
    for n in range(first, steps + 1):
        log.write(
            "step",
            step=n,
            loss=losses.get(n, loss_at(n)),
            lr=1e-3,
            grad_norm=0.5 + n / 4,
            tokens=TOKENS_PER_STEP * n,
            dt=0.1,
            tok_per_s=640.0,
            mfu=None,
            elapsed=0.1 * n,
        )
        if n % 2 == 0:
            log.write("val", step=n, val_loss=5.5 - n / 10, val_ppl=200.0, val_bpb=2.0)
            log.write("hash", step=n, weights_sha256=hashes.get(n, f"{n:064x}"))
    if end:
        log.write("end", step=steps, weights_sha256=hashes.get(steps, f"{steps:064x}"))
    log.close()
    return folder


def append_line(folder: Path, text: str, newline: bool = True) -> None:
    with open(folder / LOG_NAME, "a", encoding="utf-8") as f:
        f.write(text + ("\n" if newline else ""))


def insert_line(folder: Path, index: int, text: str) -> None:
    """Put `text` in the log as line `index` (0 = before the header)."""
    path = folder / LOG_NAME
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines.insert(index, text + "\n")
    path.write_text("".join(lines), encoding="utf-8")


def write_checkpoint(folder: Path, step: int, moment: float = 1.0) -> Path:
    """A tiny checkpoint in `folder`: one weight and one AdamW moment (`moment` fills it)."""
    tensors = {"model.w": torch.zeros(3), "optim.0.exp_avg": torch.full((3,), moment)}
    return save_checkpoint(folder, step, {"train_state": {"step": step}}, tensors)


def write_rl_log(folder: Path) -> Path:
    """A log as `octlm rl` writes one: its header (`kind` rl, its settings, no config), steps
    with rollout numbers, and held-out pass@1 and pass@4 (pass@16 at the last: a later K)."""
    log = RunLog(folder)
    log.open()
    settings = {"task": "addition", "source": "ft", "prompts": 4, "samples": 4, "steps": 4}
    settings |= {"max_new_tokens": 8, "pass_k": 4, "grad_clip": 0.5, "lr": 1e-4}
    source = {"path": "ft/checkpoints/step_000030.safetensors", "step": 30}
    model = {"n_layers": 2, "d_model": 64}
    log.header({"kind": "rl", "rl": settings, "model_config": model, "source": source, "world": 2})
    for s in range(1, 5):
        rollout = {"reward": 0.1 * s, "correct": 0.25, "cut": float("nan") if s == 3 else 0.0}
        log.write("step", step=s, loss=-0.01, lr=1e-4, grad_norm=1.0, **rollout, reply_len=2.5,
                  tokens=40 * s, tok_per_s=100.0)  # fmt: skip
        if s % 2 == 0:
            passes = {"pass@1": 0.2 * s, "pass@4": 0.3 * s} | ({"pass@16": 1.0} if s == 4 else {})
            log.write("val", step=s, **passes, heldout_reward=0.5, heldout_cut=0.0)
    log.close()
    return folder


EXPORT_CONTEXT = 64  # prompt + generated tokens fit, so nothing slides its window


def export_run_args(data: Path, out: Path) -> list[str]:
    """`octlm train` of the tiny run the export tests export: 40 steps (~2 s), enough for
    attention to matter, so a RoPE layout error would show."""
    args = ["train", "--model", "tiny", "--data", data, "--out", out, "--context", EXPORT_CONTEXT]
    args += ["--steps", 40, "--warmup", 5, "--lr", "3e-3", "--dtype", "fp32", "--micro-batch", 4]
    args += ["--accum", 1, "--val-every", 1000, "--val-batches", 1, "--no-progress"]
    return [str(a) for a in args]


def assert_one_error_line(proc: subprocess.CompletedProcess[str], expected: str) -> None:
    """A refused command: non-zero, no traceback, one `octlm: error:` line holding `expected`."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("octlm: error: ") and expected in lines[0], lines[0]
