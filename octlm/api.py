"""The Python API behind `import octlm` (README "From Python"): train a run in this process,
open a trained run, sample from it. Each is the call its CLI command makes, with Python values
in and out instead of flags and printed lines; errors stay `OctlmError`s (raised, not printed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from octlm.config import TrainConfig
from octlm.config_files import make_config
from octlm.model import GPT
from octlm.runlog import read_log
from octlm.sampling import generate_text
from octlm.tokenizer.core import Tokenizer
from octlm.trained import load_model, run_tokenizer
from octlm.trainer.loop import train as train_run


@dataclass(frozen=True)
class RunResult:
    """What `train` returns: where the run is and how it ended."""

    out: Path
    step: int
    """Steps done (the checkpoint's step)."""
    weights_sha256: str | None
    """The final weights' hash; None when the run stopped before its last step."""
    stopped_early: bool
    """Stopped by --stop-at or a signal (Ctrl-C): resume with `resume=True`."""
    last_loss: float | None
    """The training loss of the last step this call ran (None if it ran none)."""
    val_loss: float | None
    """The loss of the log's last validation (None if the run has not validated)."""


class LoadedRun(NamedTuple):
    """A trained run opened for use. A NamedTuple rather than a frozen dataclass so that
    `model, tokenizer, meta = octlm.load(run)` unpacks."""

    model: GPT
    tokenizer: Tokenizer
    meta: dict[str, Any]
    """The checkpoint's metadata: model_config, train_state, fingerprints, data_dir, path."""


def train(config: TrainConfig | str | Path, **overrides: Any) -> RunResult:
    """Train a run in this process and return how it ended.

    `config` is a TrainConfig, or what `--config` takes (a shipped name such as "tiny", or a
    TOML path); `overrides` are TrainConfig fields (`steps=50, out="runs/nb"`), as flags are.
    Ctrl-C (a notebook's interrupt) finishes the step, checkpoints and returns with
    `stopped_early`; a second one raises KeyboardInterrupt. The signal handlers are put back
    afterwards, and a run started off the main thread installs none."""
    if isinstance(config, TrainConfig):
        cfg = dataclasses.replace(config, **overrides)
    else:
        cfg = make_config(config, **overrides)
    done = train_run(cfg)
    vals = [r for r in read_log(cfg.out) if r.get("type") == "val"]
    return RunResult(
        out=Path(cfg.out),
        step=done.step,
        weights_sha256=done.weights_sha256,
        stopped_early=done.stopped_early,
        last_loss=done.last_loss,
        val_loss=vals[-1]["val_loss"] if vals else None,
    )


def load(run: str | Path, device: str = "cpu", data: str | Path | None = None) -> LoadedRun:
    """A run folder, checkpoint or snapshot: its model (eval mode, on `device`), the tokenizer
    of the dataset it trained on (or of `data`, checked against the run), and its metadata."""
    model, info = load_model(run, device=device)
    return LoadedRun(model, run_tokenizer(info, data), {**info.meta, "path": str(info.path)})


def generate(
    run: LoadedRun | tuple[GPT, Tokenizer, dict[str, Any]] | str | Path,
    prompt: str,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
) -> str:
    """`prompt` and its continuation, as `octlm generate` prints it: greedy at temperature 0,
    else sampled with top-k from a generator seeded with `seed` (the same text every time).
    `run` is what `load` returned (or its three parts), or a path to load first."""
    loaded = LoadedRun(*run) if isinstance(run, tuple) else load(run)
    sampling = {"temperature": temperature, "top_k": top_k, "seed": seed}
    return generate_text(
        loaded.model, loaded.tokenizer, prompt, max_new_tokens=max_new_tokens, **sampling
    )
