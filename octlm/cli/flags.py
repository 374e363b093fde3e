"""Flags from a settings class's sections: one flag per key, grouped by section in `--help`,
for `octlm train` (and the commands that take its keys) and `octlm rl` alike. Defaults stay
None so a `--config` file's value wins unless the flag is given; the config checks the values
(one line each), so argparse only converts the types."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

FLAG_TYPES = {"int": int, "float": float, "str": str}


def add_config_flags(
    parser: argparse.ArgumentParser,
    sections: Mapping[str, type],
    docs: Mapping[str, str],
    choices: Mapping[str, tuple[str, ...]] | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """`--config` and a flag per key of `sections` (`skip`: keys the command takes otherwise,
    such as a positional argument)."""
    parser.add_argument("--config", help="TOML file with the same keys as these flags")
    for name, section in sections.items():
        about = (section.__doc__ or "").split("\n\n")[0].replace("\n    ", " ")
        group = parser.add_argument_group(f"{name} settings", about)
        for f in fields(section):
            if not f.init or f.name in skip:  # derived keys (a --data mixture's parts)
                continue
            flag, kind = "--" + f.name.replace("_", "-"), str(f.type).replace(" | None", "")
            default = f" (default: {f.default})" if f.default is not None else ""
            about_key = " ".join(docs.get(f.name, "").split()).replace("%", "%%")  # argparse's %
            kw: dict[str, Any] = {"default": None, "help": about_key + default}
            if kind == "bool":
                group.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
            else:
                allowed = (choices or {}).get(f.name)
                group.add_argument(flag, type=FLAG_TYPES[kind], choices=allowed, **kw)


def given_values(args: argparse.Namespace, keys: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The keys' values on the command line (None: not given)."""
    return {key: getattr(args, key) for key in keys}
