"""--init-from with shape keys: the source decides the shape; keys that agree with it pass."""

from __future__ import annotations

import pytest

from octlm.config.shape import PRESETS
from octlm.config.train import TrainConfig
from octlm.trainer.init_from import InitFromError, check_preset, check_shape_keys

SOURCE = PRESETS["tiny"].to_dict()


def test_shape_keys_equal_to_the_source_pass():
    check_shape_keys(TrainConfig(init_from="src", d_model=SOURCE["d_model"]), SOURCE)
    check_shape_keys(TrainConfig(init_from="src"), SOURCE)


def test_a_shape_key_that_contradicts_the_source_is_refused_naming_it():
    cfg = TrainConfig(init_from="src", model="tiny", context=64, n_layers=SOURCE["n_layers"] + 2)
    with pytest.raises(InitFromError, match=r"has another shape: n_layers 6 vs the source's 4"):
        check_shape_keys(cfg, SOURCE)


def test_a_preset_from_a_config_file_yields_to_the_source():
    """check_preset only acts on a `--model` flag: without one it reads nothing (the source
    named here does not exist), since a config file's preset yields to the source."""
    check_preset(TrainConfig(init_from="no/such/source", model="tiny", context=64), None)
    with pytest.raises(InitFromError, match="--init-from no/such/source does not exist"):
        check_preset(TrainConfig(init_from="no/such/source", model="tiny", context=64), "tiny")
