"""`octlm.tools.subrun`, the one launcher of training runs: the TOML every launch reads, the
command line, the last error line, and the torchrun relaunch (no process is started here; the
tools' real launches run in tests/e2e)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from octlm.config.files import load_toml
from octlm.config.train import TrainConfig
from octlm.tools import subrun


def test_the_shared_toml_holds_every_setting_but_the_per_launch_ones(tmp_path: Path) -> None:
    cfg = TrainConfig(
        model="micro",
        context=32,
        steps=9,
        warmup=2,
        data="rel/data",
        out="x",
        resume=True,
        stop_at=3,
    )
    path = subrun.write_config(cfg, tmp_path / "new" / "config.toml")
    values = load_toml(path)
    assert values["data"] == str(Path("rel/data").resolve())  # runs may start anywhere
    assert values["steps"] == 9 and values["seed"] == cfg.seed
    assert not set(values) & set(subrun.PER_LAUNCH_KEYS)
    given = {k for k, v in cfg.to_dict().items() if v is not None}  # TOML has no None
    assert set(values) == given - set(subrun.PER_LAUNCH_KEYS)


def test_the_command_line_puts_the_flags_last_so_they_win(tmp_path: Path) -> None:
    argv = subrun.train_argv(tmp_path / "c.toml", tmp_path / "run", "--resume", "--lr", "0.1")
    assert argv[:4] == [sys.executable, "-m", "octlm", "train"]
    assert argv[4:] == [
        *("--config", str(tmp_path / "c.toml"), "--out", str(tmp_path / "run")),
        *("--no-progress", "--resume", "--lr", "0.1"),
    ]


@pytest.mark.parametrize(
    "stderr, last",
    [
        ("step 1\noctlm: error: boom; fix it\n\n", "octlm: error: boom; fix it"),
        ("Traceback ...\n  File x\nValueError: bad\n", "ValueError: bad"),
        ("", "(no output)"),
    ],
)
def test_the_last_error_line(stderr: str, last: str) -> None:
    assert subrun.last_line(stderr) == last
