"""The Python API behind `import octlm` (README "From Python"): train a run in this process,
open a trained run, sample from it, chat with it. Each is the call its CLI command makes, with
Python values in and out instead of flags and printed lines; errors stay `OctlmError`s
(raised, not printed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from octlm.config import checks
from octlm.config.files import make_config, make_rl_config
from octlm.config.rl import RLConfig
from octlm.config.train import TrainConfig
from octlm.data.chat_format import check_chat_dataset
from octlm.data.shards import load_manifest
from octlm.errors import OctlmError
from octlm.generation.chat import ChatSession, reply_to
from octlm.generation.prompts import check_prompts, check_turns
from octlm.generation.sampling import SEEDS, check_sampling, generate_texts
from octlm.generation.trained import load_model, run_tokenizer
from octlm.model.gpt import GPT
from octlm.rl.loop import RLResult
from octlm.rl.loop import rl as rl_run
from octlm.runlog.reader import read_log
from octlm.tokenizer.core import Tokenizer
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
    cfg = _settings(config, overrides, TrainConfig, "a shipped name such as 'tiny'")
    done = train_run(cfg)
    vals = [r for r in read_log(cfg.run.out) if r.get("type") == "val"]
    return RunResult(
        out=Path(cfg.run.out),
        step=done.step,
        weights_sha256=done.weights_sha256,
        stopped_early=done.stopped_early,
        last_loss=done.last_loss,
        val_loss=vals[-1]["val_loss"] if vals else None,
    )


def train_rl(config: RLConfig | str | Path, **overrides: Any) -> RLResult:
    """Run reinforcement learning in this process, as `octlm rl` does, and return how it ended.

    `config` is an RLConfig, or a TOML file of `octlm rl`'s keys (what `octlm rl
    --print-config` writes); `overrides` are its keys (`source="runs/ft", task="addition",
    out="runs/rl", steps=20`), as flags are. Interrupts behave as in `train`."""
    cfg = _settings(config, overrides, RLConfig, "'rl.toml' (octlm rl --print-config)")
    return rl_run(cfg)


def _settings(config: Any, overrides: dict[str, Any], kind: type, example: str) -> Any:
    """`config` (a `kind`, or a TOML path or shipped name) with `overrides` over it, checked."""
    name = kind.__name__
    if not isinstance(config, kind | str | os.PathLike):
        raise OctlmError(
            f"config={checks.shown(config)} is not a {name}, a TOML path or a shipped name",
            f"pass octlm.{name}(...), a path such as 'run.toml', or {example}",
        )
    if isinstance(config, kind):
        return config.replace(**overrides)
    make = make_config if kind is TrainConfig else make_rl_config
    return make(config, **overrides)


def load(run: str | Path, device: str = "cpu", data: str | Path | None = None) -> LoadedRun:
    """A run folder, checkpoint or snapshot: its model (eval mode, on `device`), the tokenizer
    of the dataset it trained on (or of `data`, checked against the run), and its metadata."""
    checks.check_path("run", run)
    checks.check("device", device, checks.Text(), "use 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'")
    if data is not None:
        checks.check_path("data", data)
    model, info = load_model(run, device=device)
    return LoadedRun(
        model, run_tokenizer(info, data), {**info.as_written(), "path": str(info.path)}
    )


def generate(
    run: LoadedRun | tuple[GPT, Tokenizer, dict[str, Any]] | str | Path,
    prompt: str | list[str],
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
) -> str | list[str]:
    """`prompt` and its continuation, as `octlm generate` prints it: greedy at temperature 0,
    else sampled with top-k from a generator seeded with `seed` (the same text every time).
    A list of prompts is decoded as one batch and gives a list of texts, each the one its
    prompt gets alone (`octlm generate --prompts`). `run` is what `load` returned (or its
    three parts), or a path to load first."""
    prompts = check_prompts(prompt)
    _check_sampling(max_new_tokens, temperature, top_k, seed)
    loaded = _loaded(run)
    sampling = {"temperature": temperature, "top_k": top_k, "seed": seed}
    texts = generate_texts(
        loaded.model, loaded.tokenizer, prompts, max_new_tokens=max_new_tokens, **sampling
    )
    return texts if isinstance(prompt, list) else texts[0]


def chat(
    run: LoadedRun | tuple[GPT, Tokenizer, dict[str, Any]] | str | Path,
    messages: list[dict[str, str]],
    *,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
) -> str:
    """The model's reply to `messages` ({"role": "system" | "user" | "assistant", "content":
    text} each, oldest first, the last the user's), as `octlm chat` would give it after those
    turns: the chat format's ids (`octlm.data.chat_format`), decoded over the key/value cache.
    `run` is a chat fine-tune: what `load` returned, its three parts, or a path."""
    turns = check_turns(messages)
    _check_sampling(max_new_tokens, temperature, top_k, seed)
    loaded = _loaded(run)
    where = loaded.meta.get("path", "the run")
    check_chat_dataset(load_manifest(Path(loaded.meta.get("data_dir") or "")), where)
    sampling = {"temperature": temperature, "top_k": top_k, "seed": seed}
    session = ChatSession(loaded.model, loaded.tokenizer, max_new_tokens=max_new_tokens, **sampling)
    return reply_to(session, turns)


def _loaded(run: Any) -> LoadedRun:
    """What `generate` samples from: a loaded run as it is, or a path loaded first."""
    if not isinstance(run, tuple):
        return load(run)
    parts = (GPT, Tokenizer, dict)
    if len(run) != 3 or not all(isinstance(x, t) for x, t in zip(run, parts, strict=True)):
        raise OctlmError(
            f"run={checks.shown(run)} is not what octlm.load returns (model, tokenizer, meta)",
            "pass octlm.load(...)'s result, or a run folder's path",
        )
    return LoadedRun(*run)


def _check_sampling(max_new_tokens: Any, temperature: Any, top_k: Any, seed: Any) -> None:
    """The CLI's checks of the sampling settings (its messages), and the types and bounds that
    argparse sees to on the command line, before anything is loaded."""
    numbers = checks.is_int(max_new_tokens) and isinstance(temperature, int | float)
    if numbers and (top_k is None or checks.is_int(top_k)):
        check_sampling(max_new_tokens, temperature, top_k)  # the seed: checked below, by name
    fix = "see help(octlm.generate)"
    checks.check("max_new_tokens", max_new_tokens, checks.Int(0), fix)
    checks.check("temperature", temperature, checks.Number(0), fix)
    if top_k is not None:
        checks.check("top_k", top_k, checks.Int(1), fix)
    checks.check("seed", seed, checks.Int(*SEEDS), "use a seed torch takes")
