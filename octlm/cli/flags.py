"""Flags from a settings class's sections: one flag per key, grouped by section in `--help`,
for `octlm train` (and the commands that take its keys) and `octlm rl` alike. Defaults stay
None so a `--config` file's value wins unless the flag is given; the config checks the values
(one line each), so argparse only converts the types."""

from __future__ import annotations

import argparse
import contextlib
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import fields
from typing import Any

from octlm.config.checks import shown_path
from octlm.config.files import config_path, settings_command
from octlm.config.rl import KEY_ORDER
from octlm.config.rules import CHANGE_IT
from octlm.config.train import config_keys
from octlm.errors import OctlmError, QuotedError

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


def setting_keys(args: argparse.Namespace) -> list[str]:
    """The settings a refusal of `args`'s command may name: `octlm train`'s keys (train,
    sweep, verify-resume) or `octlm rl`'s (rl, and verify-resume of an RL settings file) but its
    positional RUN; none for a command without settings."""
    command = getattr(args, "settings", None)
    if command == "octlm train" and args.config is not None:
        with contextlib.suppress(OctlmError):  # a file that cannot be read: the refusal says so
            command = settings_command(args.config)
    if command == "octlm rl":
        return [key for key in KEY_ORDER if key != "source" or not hasattr(args, "source")]
    return config_keys() if command == "octlm train" else []


@contextlib.contextmanager
def named_as_typed(args: argparse.Namespace, keys: Iterable[str]) -> Iterator[None]:
    """Refusals inside name each setting as the user gave it on this command: `--stop-at 9`,
    not the settings' `stop_at=9`, for a flag (or any key, without a `--config` file); a key
    the `--config` file sets (and no flag) by the file's spelling (`steps=4`, never `--steps`,
    however the check wrote it), the file named once at the end of the problem: the file is
    where it is changed. A resume's changed settings (`seed: 0 -> 1`) alike."""
    try:
        yield
    except OctlmError as exc:
        if not isinstance(exc, QuotedError):
            _name_as_given(exc, args, list(keys))
        raise


def _name_as_given(exc: OctlmError, args: argparse.Namespace, keys: list[str]) -> None:
    config = getattr(args, "config", None)
    typed = [k for k in keys if getattr(args, k, None) is not None]
    flags = typed if config else keys
    problem, fix = as_typed(exc.problem, flags, start=True), as_typed(exc.fix, flags)
    problem = as_typed(problem, ["config"])  # `config=''` (not `config file not found`)
    if not hasattr(args, "config"):  # a command without a settings file (octlm eval)
        fix = fix.replace(CHANGE_IT, "change it on the command line")
    if config:
        values = {k: v for k, v in file_values(config).items() if k in keys and k not in typed}
        problem, fix = as_in_file(problem, values), as_in_file(fix, values)
        text = f"{problem}; {fix}"
        at = {k: named_at(text, k, start=True) for k in values}
        named = sorted((k for k in values if at[k] is not None), key=lambda k: at[k] or 0)
        if named:
            problem += f" ({', '.join(named)} set in {shown_path(config)})"
    exc.problem, exc.fix = problem, fix
    exc.args = (exc.message,)


def file_values(config: str) -> dict[str, Any]:
    """The keys a `--config` file sets ({} when it cannot be read: that is the refusal)."""
    try:
        return tomllib.loads(config_path(config).read_text(encoding="utf-8"))
    except (OctlmError, OSError, ValueError):  # TOMLDecodeError, UnicodeDecodeError
        return {}


EDGE = r"(?<![\w./\\'\"-])"
"""Not inside a word, a path or a quoted value."""
CHANGE = r": (?=[^;]*? -> )"
"""After a key in a resume's changed settings: `seed: 0 -> 1`."""


def as_typed(text: str, keys: Iterable[str], start: bool = False) -> str:
    """`text` with each of `keys` named as its flag: `key=VALUE` as `--key VALUE` (`--key` or
    `--no-key` for true and false), a changed setting `key: OLD -> NEW` as `--key OLD -> NEW`,
    a key with an underscore wherever it stands, and (`start`) a key that begins the text
    (`model 'x' is unknown`)."""
    for key in sorted(keys, key=len, reverse=True):  # `eval_tasks_every` before `eval_tasks`
        flag = "--" + key.replace("_", "-")
        text = re.sub(rf"{EDGE}{key}=(true|True)\b", flag, text)
        text = re.sub(rf"{EDGE}{key}=(false|False)\b", "--no-" + flag[2:], text)
        text = re.sub(rf"{EDGE}{key}=", flag + " ", text)
        text = re.sub(rf"{EDGE}{key}{CHANGE}", flag + " ", text)
        if "_" in key:
            text = re.sub(rf"{EDGE}{key}(?![\w=/\\'\"-])", flag, text)
        elif start and text.startswith(key + " "):
            text = flag + text[len(key) :]
    return text


NOT_A_VALUE = frozenset(
    "a an and are as at but by can cannot does for from has holds in is must needs not of on "  # noqa: SIM905
    "only or reads set the to was with".split()
)
"""Words after a flag that are the sentence's, not the flag's value (`--warmup at most`)."""
VALUE = r"'[^']*'|\"[^\"]*\"|[^\s,;:()]+"


def as_in_file(text: str, values: Mapping[str, Any]) -> str:
    """`text` with each key of `values` (a `--config` file's keys and values) named as the file
    writes it, wherever a check wrote its flag: `--key VALUE` as `key=VALUE`, `--key` alone as
    `key`, `--key`/`--no-key` of a true/false key as `key=true`/`key=false`."""
    for key in sorted(values, key=len, reverse=True):
        flag = "--" + key.replace("_", "-")
        if isinstance(values[key], bool):
            text = re.sub(rf"{EDGE}--no-{flag[2:]}(?![\w-])", f"{key}=false", text)
            text = re.sub(rf"{EDGE}{flag}(?![\w-])", f"{key}=true", text)
            continue

        def spelt(m: re.Match, key: str = key, flag: str = flag) -> str:
            value = m.group(1)
            if value is None or value in NOT_A_VALUE or value.startswith("--"):
                return key + m.group(0)[len(flag) :]  # the word after it is the sentence's
            return f"{key}={value}"

        text = re.sub(rf"{EDGE}{flag}(?![\w-])(?: ({VALUE}))?", spelt, text)
    return text


def named_at(text: str, key: str, start: bool = False) -> int | None:
    """Where `text` first names the setting `key` in its own spelling (`key=...`, a changed
    `key: OLD -> NEW`, an underscored key anywhere, or, with `start`, a key beginning the
    text); None where it does not."""
    if start and text.startswith(key + " "):
        return 0
    patterns = [rf"{EDGE}{key}(=|{CHANGE})"]
    patterns += [rf"{EDGE}{key}(?![\w/\\'\"-])"] if "_" in key else []
    found = [m.start() for m in (re.search(p, text) for p in patterns) if m]
    return min(found) if found else None
