"""`--config NAME`: the configs shipped as package data resolve by name; paths still work."""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.config.files import SHIPPED_CONFIGS, config_path, make_config, read_toml, shipped_configs
from octlm.config.train import ConfigError
from tests.cli_in_process import main

PACKAGE = Path(__file__).resolve().parents[2] / "octlm"


def test_the_shipped_configs_live_in_the_package_and_have_names() -> None:
    assert SHIPPED_CONFIGS == PACKAGE / "configs"
    names = shipped_configs()
    assert {"tiny", "day1-overfit", "small", "main88", "ablations/lr"} <= set(names)
    assert names == sorted(names)
    assert not (PACKAGE.parent / "configs").exists()  # one copy of each file, not two


def test_a_name_reads_the_same_settings_as_its_file() -> None:
    assert config_path("tiny") == SHIPPED_CONFIGS / "tiny.toml"
    assert make_config("tiny") == make_config(SHIPPED_CONFIGS / "tiny.toml")
    train_keys, table = read_toml("ablations/lr", sweep=True)
    assert train_keys["model"] == "tiny" and "lr" in table["grid"]


def test_a_path_wins_over_a_shipped_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("tiny").write_text("steps = 77\n")
    assert make_config("tiny").steps == 77
    assert make_config(str(tmp_path / "tiny")).steps == 77


def test_an_unknown_name_is_one_line_listing_the_shipped_ones(tmp_path: Path) -> None:
    for value in ("tinyy", "configs/tiny.toml", "../configs/tiny", str(tmp_path / "x.toml")):
        with pytest.raises(ConfigError, match="config file not found") as info:
            config_path(value)
        assert "day1-overfit, main88" in info.value.message and "\n" not in info.value.message


def test_the_cli_takes_a_name_and_refuses_a_bad_one_in_one_line(capsys) -> None:
    assert (
        main(["train", "--config", "tiny", "--steps", "3", "--warmup", "1", "--print-config"]) == 0
    )
    printed = capsys.readouterr().out
    assert "steps = 3\n" in printed and 'model = "tiny"' in printed
    assert main(["train", "--config", "nope", "--print-config"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("octlm: error: config file not found: nope; ") and err.count("\n") == 1
