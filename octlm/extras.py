"""Optional dependencies: imported where a feature needs them, with a one-line way to get them."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from octlm.errors import OctlmError

EXTRAS = {
    "pyarrow": "data",
    "zstandard": "data",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "gguf": "gguf",
    "starlette": "serve",
    "uvicorn": "serve",
}
"""Which `octlm[...]` extra brings each optional package."""


def require(module: str, needed_for: str) -> ModuleType:
    """`module`, or an error naming the extra to install (`needed_for`: what wanted it)."""
    try:
        return import_module(module)
    except ImportError:
        package = module.split(".")[0]
        extra = EXTRAS.get(package)
        how = f"pip install 'octlm[{extra}]'" if extra else f"pip install {package}"
        raise OctlmError(
            f"{needed_for} needs the {package} package, which is not installed",
            f"install it with `{how}`",
        ) from None
