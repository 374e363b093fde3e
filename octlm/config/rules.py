"""What a setting may be and what it is for, declared on the field itself and checked where a
config is built: the one check every door shares (flags, a TOML file, a sweep, the Python API).

Each field of a settings section (`octlm.config.train`'s sections) is made by one of three
markers that say its role in the resume fingerprint and carry its rule: `trajectory` (it decides
the numbers a run computes), `new_trajectory` (the same, added after runs existed: left out of
the fingerprint while at its default, so older run folders keep theirs) and `setting` (where
files go, how often to look: not one computed bit). The ranges' reasons are in
`octlm.config.checks`; the shape keys are checked once resolved (`octlm.config.shape`).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import field
from typing import Any

from octlm.config import checks
from octlm.errors import OctlmError

CHANGE_IT = "change it on the command line or in --config"
UNKNOWN_KEY_FIX = "see `{command} --help` for the keys (flags with - replaced by _)"
Rule = checks.Int | checks.Number | checks.Bool | checks.Text


class ConfigError(OctlmError):
    """A bad setting in a TOML file or on the command line."""


def require(ok: bool, problem: str, fix: str = CHANGE_IT) -> None:
    if not ok:
        raise ConfigError(problem, fix)


def trajectory(default: Any, rule: Rule | None = None) -> Any:
    """A setting that decides the numbers a run computes: part of the resume fingerprint."""
    return field(default=default, metadata={"trajectory": True, "rule": rule})


def new_trajectory(default: Any, rule: Rule | None = None) -> Any:
    """A trajectory setting added after runs existed: `trajectory()` leaves it out while it has
    its default, so the fingerprint of every run folder written before it stays the same."""
    return field(default=default, metadata={"trajectory": True, "omit_default": True, "rule": rule})


def setting(default: Any, rule: Rule | None = None) -> Any:
    """Where files go, how often to look, when to stop: changes not a single computed bit."""
    return field(default=default, metadata={"trajectory": False, "rule": rule})


def fill_sections(
    config: Any,
    args: tuple[Any, ...],
    keys: dict[str, Any],
    sections: dict[str, type],
    order: tuple[str, ...],
    command: str,
) -> None:
    """Build each section of `config` (a frozen `TrainConfig` or `RLConfig`) from its flat keys,
    after refusing positional values and unknown keys: the one constructor both share."""
    name = type(config).__name__
    if args:
        raise ConfigError(
            f"{name} takes its settings by name, not {len(args)} positional value(s)",
            f"write {name}(key=value, ...): see `{command} --help` for the keys",
        )
    problem = unknown_keys_problem(keys, list(order), command)
    if problem is not None:
        raise ConfigError(*problem)
    owner = {f.name: section for section, cls in sections.items() for f in dataclasses.fields(cls)}
    for section, cls in sections.items():
        part = {k: v for k, v in keys.items() if owner[k] == section}
        object.__setattr__(config, section, cls(**part))


def field_rule(f: dataclasses.Field) -> Rule:
    """The rule of one field: the one it declares, else from its type (true/false, a non-empty
    string). A number must declare its range: there is no sensible default for one."""
    declared = f.metadata.get("rule")
    if declared is not None:
        return declared
    kind = str(f.type).replace(" | None", "")
    if kind == "bool":
        return checks.Bool()
    if kind == "str":
        return checks.Text()
    raise TypeError(f"the settings field {f.name} ({kind}) declares no rule: give it its range")


def is_optional(f: dataclasses.Field) -> bool:
    return "None" in str(f.type)


def check_section(section: Any, skip: tuple[str, ...] = ()) -> None:
    """Each field of a settings section alone: its type (TOML and Python hand over anything)
    and its range; -0.0 stored as 0.0 (the same run). `skip`: fields checked elsewhere."""
    for f in dataclasses.fields(section):
        if f.name in skip or not f.init:
            continue
        value = getattr(section, f.name)
        if value is None and is_optional(f):
            continue
        problem = checks.problem(f.name, value, field_rule(f))
        if problem is not None:
            raise ConfigError(problem, CHANGE_IT)
        if isinstance(value, float) and value == 0:
            object.__setattr__(section, f.name, 0.0)


def declared_rules(cls: type, skip: tuple[str, ...] = ()) -> dict[str, Rule]:
    """Every field's rule, computed when the section's module loads: a number field without its
    range fails at import, not at the first run that sets it."""
    return {f.name: field_rule(f) for f in dataclasses.fields(cls) if f.init and f.name not in skip}


def section_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string under it), for `--help`."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:], strict=False):
        is_doc = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
        if isinstance(node, ast.AnnAssign) and is_doc and isinstance(nxt.value.value, str):
            docs[node.target.id] = nxt.value.value  # type: ignore[attr-defined]
    return docs


def unknown_keys_problem(
    names: Any, known: list[str], command: str = "octlm train"
) -> tuple[str, str] | None:
    """(problem, fix) naming the keys of `names` that are not in `known` (with the nearest known
    name when a key looks like a misspelling); None when every key is known. `command`: whose
    keys they are (its --help lists them)."""
    unknown = sorted(set(names) - set(known))
    if not unknown:
        return None
    near = [m[0] for k in unknown if (m := difflib.get_close_matches(k, known, n=1))]
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    return f"unknown key(s) {', '.join(unknown)}{hint}", UNKNOWN_KEY_FIX.format(command=command)
