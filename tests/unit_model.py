"""The model shape of the unit tests: the tiny preset cut to 2 layers of width 64 at vocabulary
512, fast enough to build, train and decode in a test."""

from __future__ import annotations

from typing import Any

from octlm.config.shape import ModelConfig, preset


def unit_config(context: int, **options: Any) -> ModelConfig:
    """That shape with `context` positions and any other `ModelConfig` fields in `options`."""
    shape = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 128}
    return preset("tiny", vocab_size=512, context=context, **shape, **options)
