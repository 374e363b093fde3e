"""`octlm plot`: on real tiny runs a PNG with every panel, several runs overlaid (slow: they are
trained by `python -m octlm`, forked as tests/octlm_process.py starts the suite's commands);
in-process, logs a kill or a bad disk damaged, and an install without matplotlib (one error
line saying how to get it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from octlm.errors import OctlmError
from octlm.tools.plot import (
    clipped_points,
    draw_run,
    load_series,
    plot_runs,
    pyplot,
    unigram_baseline,
)
from tests import octlm_process
from tests.cli_in_process import main
from tests.tools.helpers import (
    CUT_LINE,
    GARBAGE_LINE,
    append_line,
    insert_line,
    write_log,
    write_rl_log,
)


@pytest.fixture(scope="module")
def runs(tiny_dataset, tmp_path_factory) -> list[Path]:
    out = []
    for seed, clip in ((1, "1.0"), (2, "0.5")):
        run = tmp_path_factory.mktemp("plot") / f"seed{seed}"
        args = ["train", "--model", "tiny", "--data", str(tiny_dataset), "--out", str(run)]
        args += ["--steps", "6", "--warmup", "2", "--context", "32", "--micro-batch", "2"]
        args += ["--accum", "2", "--dtype", "fp32", "--val-every", "2", "--val-batches", "1"]
        args += ["--grad-clip", clip, "--seed", str(seed), "--no-progress"]
        proc = octlm_process.run(args, dict(os.environ))  # forked, as the suite's commands
        assert proc.returncode == 0, proc.stderr[-2000:]
        out.append(run)
    return out


@pytest.mark.slow
def test_plot_writes_a_png_with_all_panels(runs, tmp_path) -> None:
    import matplotlib.image

    png = tmp_path / "sub" / "runs.png"
    proc = octlm_process.run(["plot", *map(str, runs), "-o", str(png)], dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(png)
    assert image.shape[0] > 500 and image.shape[1] > 800
    assert image[..., :3].std() > 0.05  # not a blank canvas


@pytest.mark.slow
def test_series_and_baseline(runs, tiny_dataset) -> None:
    series = load_series(runs[0])
    assert [r["step"] for r in series.steps] == list(range(1, 7))
    assert [v["step"] for v in series.vals] == [2, 4, 6]
    assert series.grad_clip == 1.0 and series.tokens_per_step == 2 * 2 * 32
    baseline = unigram_baseline([series])
    assert baseline is not None and 0 < baseline < 6.3  # below ln(512)


@pytest.mark.slow
def test_clipped_steps_are_marked(runs, tmp_path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    series = load_series(runs[1])
    expected = [(r["step"], r["grad_norm"]) for r in series.steps if r["grad_norm"] > 0.5]
    assert expected, "a 0.5 threshold clips the first steps of a fresh model"
    assert clipped_points(series) == expected
    unclipped = load_series(runs[0])
    assert all(n > 1.0 for _, n in clipped_points(unclipped))
    plot_runs([runs[1]], tmp_path / "one.png")
    plt.close("all")


@pytest.mark.slow
def test_plot_bad_input(tmp_path) -> None:
    with pytest.raises(OctlmError, match="no run log"):
        plot_runs([tmp_path], tmp_path / "x.png")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "octlm",
            "plot",
            str(tmp_path / "nope"),
            "-o",
            str(tmp_path / "x.png"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and proc.stderr.startswith("octlm: error: no run log")
    assert "Traceback" not in proc.stderr


def test_a_damaged_log_is_plotted_as_far_as_it_is_readable(tmp_path: Path) -> None:
    run = write_log(tmp_path / "run", end=False)
    insert_line(run, 3, GARBAGE_LINE)
    insert_line(run, 5, '{"type": "step", "step": 2}')  # parses, but holds no numbers
    append_line(run, CUT_LINE, newline=False)  # the last line, cut by a kill
    series = load_series(run)
    assert [r["step"] for r in series.steps] == list(range(1, 7))
    assert [v["step"] for v in series.vals] == [2, 4, 6]
    png = plot_runs([run / "log.jsonl"], tmp_path / "cut.png")  # the log file names it too
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pyplot().close("all")


def test_an_rl_run_is_plotted_with_its_reward_and_held_out_pass_at_1(tmp_path: Path) -> None:
    """`octlm rl`'s log: its val records hold pass@K, not val_loss; its clipping is its own.
    Alone, its first panel is the reward; beside a training run, both losses."""
    plt = pyplot()
    rl = load_series(write_rl_log(tmp_path / "rl"))
    assert rl.is_rl and rl.grad_clip == 0.5
    assert [r["step"] for r in rl.steps] == [1, 2, 3, 4] and [v["step"] for v in rl.vals] == [2, 4]
    fig, axes = plt.subplots(2, 2)
    draw_run(axes, rl, "C0", reward=True)
    reward, passes = axes.flat[0].get_lines()
    assert list(reward.get_ydata()) == [r["reward"] for r in rl.steps]
    assert list(passes.get_xdata()) == [2, 4] and list(passes.get_ydata()) == [0.4, 0.8]
    plt.close(fig)
    for runs in ([tmp_path / "rl"], [tmp_path / "rl", write_log(tmp_path / "train")]):
        png = plot_runs(runs, tmp_path / f"{len(runs)}.png")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plt.close("all")


def test_a_log_without_steps_is_one_error_line(tmp_path: Path, capsys) -> None:
    run = write_log(tmp_path / "run", steps=0, end=False)
    append_line(run, CUT_LINE, newline=False)
    assert main(["plot", str(run), "-o", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"octlm: error: {run} has no training steps logged yet; train it first"]


def test_without_matplotlib_plot_says_how_to_get_it(tmp_path: Path, monkeypatch, capsys) -> None:
    run = write_log(tmp_path / "run")
    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: import fails
    with pytest.raises(OctlmError, match="needs matplotlib"):
        pyplot()
    assert main(["plot", str(run), "-o", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "pip install 'octlm[plot]'" in err[0], err
    assert err[0].startswith("octlm: error: `octlm plot` needs matplotlib, which is not installed")
    assert not (tmp_path / "x.png").exists()
