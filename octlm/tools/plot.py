"""`octlm plot`: one PNG of one or more runs, read from their logs (matplotlib, no display).

Panels: training and validation loss against tokens with the unigram-entropy baseline dashed
(what a model that knows only token frequencies scores), the learning rate, the gradient norm
with the clipping threshold and clipped steps marked, and throughput. A log cut short by a kill
is drawn up to the cut. Runs of `octlm rl` alone get their mean reward and held-out pass@1 in
the first panel instead of the loss (theirs is a policy-gradient surrogate near 0). matplotlib
is optional (`pip install 'octlm[plot]'`): only this command
needs it, and without it the command says so in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octlm.config.checks import shown_path
from octlm.data.shards import MANIFEST_NAME
from octlm.errors import OctlmError
from octlm.fsutil import atomic_write
from octlm.runlog.reader import read_log, require_log
from octlm.tools.outputs import check_file_out

STEP_KEYS = ("step", "tokens", "loss", "lr", "grad_norm", "tok_per_s")
VAL_KEYS = ("step", "val_loss")
RL_STEP_KEYS = (*STEP_KEYS, "reward")
RL_VAL_KEYS = ("step", "pass@1")


@dataclass
class RunSeries:
    name: str
    header: dict[str, Any]
    steps: list[dict[str, Any]]
    vals: list[dict[str, Any]]

    @property
    def is_rl(self) -> bool:
        return self.header.get("kind") == "rl"

    @property
    def grad_clip(self) -> float:
        settings = self.header.get("rl" if self.is_rl else "config", {})
        return float(settings.get("grad_clip", 0.0) or 0.0)

    @property
    def tokens_per_step(self) -> int:
        return int(self.header.get("tokens_per_step", 0))


def load_series(run: str | Path) -> RunSeries:
    """A run's header, step and validation records (a folder or its log file)."""
    folder = require_log(run).parent
    records = read_log(run)

    def complete(kind: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
        return [r for r in records if r["type"] == kind and all(k in r for k in keys)]

    headers = [r for r in records if r["type"] == "header"]
    rl = bool(headers) and headers[0].get("kind") == "rl"
    steps = complete("step", RL_STEP_KEYS if rl else STEP_KEYS)
    if not headers or not steps:
        raise OctlmError(f"{shown_path(folder)} has no training steps logged yet", "train it first")
    return RunSeries(
        folder.name, headers[0], steps, complete("val", RL_VAL_KEYS if rl else VAL_KEYS)
    )


def clipped_points(s: RunSeries) -> list[tuple[int, float]]:
    """(step, norm) of the steps whose pre-clip norm exceeded the threshold (were shortened)."""
    if s.grad_clip <= 0:
        return []
    return [
        (r["step"], _num(r["grad_norm"])) for r in s.steps if _num(r["grad_norm"]) > s.grad_clip
    ]


def unigram_baseline(series: list[RunSeries]) -> float | None:
    """The unigram entropy of the first run's validation data, if that data is still there."""
    from octlm.data.shards import ShardDataset
    from octlm.tools.analyze import unigram_entropy

    data_dir = series[0].header.get("data_dir")
    if not data_dir or not (Path(data_dir) / MANIFEST_NAME).is_file():
        return None
    dataset = ShardDataset.open(data_dir)
    return unigram_entropy(dataset.val, dataset.manifest["tokenizer"]["vocab_size"])


def _num(value: Any) -> float:
    return float(value)  # "nan"/"inf" strings from the log parse too


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only; a one-line error when it is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise OctlmError(
            "`octlm plot` needs matplotlib, which is not installed",
            "pip install 'octlm[plot]' (or pip install matplotlib)",
        ) from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def draw_loss(ax: Any, s: RunSeries, color: str) -> None:
    """Training loss against tokens, and validation loss where the run logged one."""
    losses = [_num(r["loss"]) for r in s.steps]
    tokens = [r["tokens"] for r in s.steps]
    ax.plot(tokens, losses, color=color, lw=0.8, alpha=0.6, label=f"{s.name} train")
    if s.vals and not s.is_rl:  # an RL run's val records hold pass@k, not a loss
        val_tokens = [v["step"] * s.tokens_per_step for v in s.vals]  # steps done
        val_losses = [_num(v["val_loss"]) for v in s.vals]
        style = {"color": color, "marker": "o", "ms": 3, "lw": 1.5}
        ax.plot(val_tokens, val_losses, label=f"{s.name} val", **style)


def draw_reward(ax: Any, s: RunSeries, color: str) -> None:
    """An RL run's mean reward per step, and its held-out pass@1 at each evaluation."""
    steps = [r["step"] for r in s.steps]
    rewards = [_num(r["reward"]) for r in s.steps]
    ax.plot(steps, rewards, color=color, lw=0.8, alpha=0.6, label=f"{s.name} reward")
    if s.vals:
        passes = [_num(v["pass@1"]) for v in s.vals]
        style = {"color": color, "marker": "o", "ms": 3, "lw": 1.5}
        ax.plot([v["step"] for v in s.vals], passes, label=f"{s.name} held-out pass@1", **style)


def draw_run(axes: Any, s: RunSeries, color: str, reward: bool = False) -> None:
    """One run's lines on the four panels (loss, or with `reward` an RL run's reward, learning
    rate, gradient norm, throughput)."""
    ax_loss, ax_lr, ax_norm, ax_speed = axes.flat
    (draw_reward if reward else draw_loss)(ax_loss, s, color)
    step_ids = [r["step"] for r in s.steps]
    ax_lr.plot(step_ids, [r["lr"] for r in s.steps], color=color, label=s.name)
    norms = [_num(r["grad_norm"]) for r in s.steps]
    ax_norm.plot(step_ids, norms, color=color, lw=0.8, label=s.name)
    if s.grad_clip > 0:
        clipped = clipped_points(s)
        if clipped:
            label = f"{s.name} clipped ({len(clipped)})"
            ax_norm.scatter(*zip(*clipped, strict=True), color=color, marker="x", s=18, label=label)
        ax_norm.axhline(s.grad_clip, color=color, ls=":", lw=1)
    speeds = [r["tok_per_s"] for r in s.steps]
    ax_speed.plot(step_ids, speeds, color=color, lw=0.8, label=s.name)


def plot_runs(runs: list[str | Path], out: str | Path, unigram: bool = True) -> Path:
    """Draw `runs` into the image `out`: checked before any log is read (not a folder, a
    suffix matplotlib writes: .png, .pdf, .svg, ...; none: a PNG); missing folders are made."""
    plt = pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    out = Path(out)
    check_file_out("-o", out, tuple(FigureCanvasBase.get_supported_filetypes()))
    series = [load_series(r) for r in runs]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    ax_loss, ax_lr, ax_norm, ax_speed = axes.flat
    reward = all(s.is_rl for s in series)  # RL runs alone: what they learn, not the surrogate
    for i, s in enumerate(series):
        draw_run(axes, s, color=f"C{i % 10}", reward=reward)
    baseline = unigram_baseline(series) if unigram and not reward else None
    if baseline is not None:
        label = f"unigram entropy {baseline:.2f} nats"
        ax_loss.axhline(baseline, color="gray", ls="--", lw=1, label=label)
    if reward:
        ax_loss.set(xlabel="step", ylabel="mean reward", title="reward (dots: held-out pass@1)")
    else:
        ax_loss.set(xlabel="tokens", ylabel="loss (nats/token)", title="loss")
    ax_lr.set(xlabel="step", ylabel="learning rate", title="learning rate")
    ax_norm.set(
        xlabel="step",
        ylabel="global grad norm (before clipping)",
        yscale="log",
        title="gradient norm (dotted: clip threshold)",
    )
    ax_speed.set(xlabel="step", ylabel="tokens/s", title="throughput")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    out.parent.mkdir(parents=True, exist_ok=True)
    kind = out.suffix.lstrip(".").lower() or "png"
    try:  # whole or not at all: a failed write leaves no half image
        atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=110, format=kind))
    finally:
        plt.close(fig)
    return out
