"""octlm: train small GPT-style language models with a loop that resumes bit for bit.

From Python (README "From Python"):

    import octlm
    result = octlm.train("tiny", steps=50, out="runs/nb")   # or octlm.train(octlm.TrainConfig())
    model, tokenizer, meta = octlm.load(result.out)
    print(octlm.generate(result.out, "ROMEO:", temperature=0.8, top_k=40, seed=1))
    records = octlm.read_log(result.out)
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Any

import octlm.numerics

# Before anything of octlm imports torch: MKL and OpenMP read their settings when they start.
octlm.numerics.pin()

__version__ = "0.1.0"

# The one exception to "no re-exports" (docs/architecture.md): this facade is the public Python
# API, so a notebook needs `import octlm` and no map of the rooms. The names resolve on first
# use (PEP 562 `__getattr__`): the training side imports torch (1.5 s), and `octlm prepare` and
# `octlm --help`, which import this package first, must start without it.
_PUBLIC = {
    "TrainConfig": "octlm.config.train",
    "RLConfig": "octlm.config.rl",
    "train": "octlm.api",
    "train_rl": "octlm.api",
    "load": "octlm.api",
    "generate": "octlm.api",
    "chat": "octlm.api",
    "read_log": "octlm.runlog.reader",
    "RunResult": "octlm.api",
    "RLResult": "octlm.rl.loop",
    "LoadedRun": "octlm.api",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'octlm' has no attribute {name!r}")
    for public, module in _PUBLIC.items():  # all at once: one import binds every name
        setattr(sys.modules[__name__], public, getattr(import_module(module), public))
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
