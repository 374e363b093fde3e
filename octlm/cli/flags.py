"""Flags from a settings class's sections: one flag per key, grouped by section in `--help`,
for `octlm train` (and the commands that take its keys) and `octlm rl` alike. Defaults stay
None so a `--config` file's value wins unless the flag is given; the config checks the values
(one line each), so argparse only converts the types."""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import fields
from typing import Any

from octlm.config.rules import CHANGE_IT
from octlm.errors import OctlmError

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


@contextlib.contextmanager
def named_as_typed(args: argparse.Namespace, keys: Iterable[str]) -> Iterator[None]:
    """Refusals inside name each setting as the user typed it on this command: `--stop-at 9`,
    not the settings' `stop_at=9`. With a `--config` file, a key no flag gave keeps the file's
    spelling (`steps=4`): the file is where it is changed."""
    try:
        yield
    except OctlmError as exc:
        config = getattr(args, "config", None)
        flags = [k for k in keys if not config or getattr(args, k, None) is not None]
        problem, fix = as_typed(exc.problem, flags, start=True), as_typed(exc.fix, flags)
        problem = as_typed(problem, ["config"])  # `config=''` (not `config file not found`)
        if not hasattr(args, "config"):  # a command without a settings file (octlm eval)
            fix = fix.replace(CHANGE_IT, "change it on the command line")
        exc.problem, exc.fix = problem, fix
        exc.args = (exc.message,)
        raise


EDGE = r"(?<![\w./\\'\"-])"
"""Not inside a word, a path or a quoted value."""


def as_typed(text: str, keys: Iterable[str], start: bool = False) -> str:
    """`text` with each of `keys` named as its flag: `key=VALUE` as `--key VALUE` (`--key` or
    `--no-key` for true and false), a key with an underscore wherever it stands, and (`start`)
    a key that begins the text (`model 'x' is unknown`)."""
    for key in sorted(keys, key=len, reverse=True):  # `eval_tasks_every` before `eval_tasks`
        flag = "--" + key.replace("_", "-")
        text = re.sub(rf"{EDGE}{key}=(true|True)\b", flag, text)
        text = re.sub(rf"{EDGE}{key}=(false|False)\b", "--no-" + flag[2:], text)
        text = re.sub(rf"{EDGE}{key}=", flag + " ", text)
        if "_" in key:
            text = re.sub(rf"{EDGE}{key}(?![\w=/\\'\"-])", flag, text)
        elif start and text.startswith(key + " "):
            text = flag + text[len(key) :]
    return text
