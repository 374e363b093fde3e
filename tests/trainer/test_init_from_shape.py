"""--init-from with shape keys: the source decides the shape; keys that agree with it pass."""

from __future__ import annotations

import pytest

from octlm.config.shape import PRESETS
from octlm.config.train import TrainConfig
from octlm.trainer.init_from import (
    InitFromError,
    check_preset,
    check_preset_shape,
    check_shape_keys,
)

SOURCE = PRESETS["tiny"].to_dict()


def test_shape_keys_equal_to_the_source_pass():
    check_shape_keys(TrainConfig(init_from="src", d_model=SOURCE["d_model"]), SOURCE)
    check_shape_keys(TrainConfig(init_from="src"), SOURCE)


def test_a_shape_key_that_contradicts_the_source_is_refused_naming_it():
    cfg = TrainConfig(init_from="src", model="tiny", context=64, n_layers=SOURCE["n_layers"] + 2)
    with pytest.raises(InitFromError, match=r"has another shape: n_layers 6 vs the source's 4"):
        check_shape_keys(cfg, SOURCE)


def test_a_source_that_cannot_be_read_is_refused_before_any_run_with_or_without_a_preset_flag():
    """check_preset reads the source whether or not a `--model` flag was typed (sweep and
    verify-resume call it before their first run, so a missing source is one line, not a failed
    run per setting); only a typed flag is then held to the source's shape."""
    for flag in (None, "tiny"):
        with pytest.raises(InitFromError, match="--init-from no/such/source does not exist"):
            check_preset(TrainConfig(init_from="no/such/source", model="tiny", context=64), flag)


def test_a_typed_preset_of_another_shape_than_the_source_is_refused():
    other = {**SOURCE, "n_layers": SOURCE["n_layers"] + 2}
    with pytest.raises(InitFromError, match="n_layers"):
        check_preset_shape(TrainConfig(init_from="src", model="tiny", context=64), other)
    check_preset_shape(TrainConfig(init_from="src", model="tiny", context=64), SOURCE)
