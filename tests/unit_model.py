"""The model shape of the unit tests: the tiny preset cut to 2 layers of width 64 at vocabulary
512, fast enough to build, train and decode in a test."""

from __future__ import annotations

from typing import Any

from octlm.config.shape import ModelConfig, preset
from octlm.config.train import TrainConfig


def unit_config(context: int, **options: Any) -> ModelConfig:
    """That shape with `context` positions and any other `ModelConfig` fields in `options`."""
    shape = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 128}
    return preset("tiny", vocab_size=512, context=context, **shape, **options)


def optimizer_for(model: Any, cfg: TrainConfig) -> Any:
    """The run's optimizer as `build_run` builds it: the config's optimizer section, the
    schedule's peak as the starting rate."""
    from octlm.trainer.optim import build_optimizer

    return build_optimizer(model, cfg.optim, cfg.lr_schedule.lr)
