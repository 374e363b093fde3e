"""What a sweep runs: its settings from the `--grid`/`--set` flags and the file's [sweep] table,
each checked and typed where it is read, and the plan of runs (settings x repeats) it makes of
them, every setting validated before the first run starts."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from octlm.config import checks
from octlm.config.checks import shown, shown_path
from octlm.config.files import make_config, read_toml
from octlm.config.train import FIELDS, NON_TRAJECTORY_KEYS, ConfigError, TrainConfig
from octlm.errors import OctlmError

_TYPES = {k: str(f.type).replace(" | None", "") for k, f in FIELDS.items()}
_KINDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}
SWEEP_KEYS = ("grid", "sets", "repeats")
MAX_RUNS = 10_000
"""Runs one sweep may plan: each is a training process, and every setting is checked before
the first one starts, so a plan of millions would hang there instead."""


@dataclass(frozen=True)
class RunSpec:
    setting: tuple[tuple[str, Any], ...]
    repeat: int
    seed: int

    @property
    def setting_name(self) -> str:
        return ",".join(f"{k}={fmt_value(v)}" for k, v in self.setting) or "base"

    @property
    def name(self) -> str:
        return f"{self.setting_name}-r{self.repeat}"


def fmt_value(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value).lower()


def sweepable(key: Any) -> str:
    """The type of setting `key` ("int", "float", "bool", "str"); an error if it cannot be swept."""
    if key not in _TYPES:
        raise OctlmError(
            f"unknown setting {shown(key)} in a sweep", "use the keys of `octlm train`"
        )
    if key in NON_TRAJECTORY_KEYS or key == "seed":
        raise OctlmError(f"{shown(key)} cannot be swept", "sweep settings that change the run")
    return _TYPES[key]


def parse_value(key: str, text: str, flag: str = "--grid") -> Any:
    kind = sweepable(key)
    try:
        if kind == "bool":
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        return {"int": int, "float": float, "str": str}[kind](text)
    except ValueError:
        raise OctlmError(f"{key}={text!r} is not a valid {kind}", f"fix the {flag} value") from None


def table_value(key: str, value: Any, where: str) -> Any:
    """A value of the [sweep] table, already typed by TOML: it must have its setting's type (an
    int is a number too); its range is the config's to check."""
    kind = sweepable(key)
    ok = {
        "int": checks.is_int(value),
        "float": checks.is_int(value) or isinstance(value, float),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }[kind]
    if not ok:
        raise ConfigError(
            f"{where}: [sweep] {key} = {checks.shown(value)} must be {_KINDS[kind]}",
            f"write the values of {key} as its `{key} = ...` line in --config is written",
        )
    if kind == "float" and checks.is_int(value) and abs(value) < 2**1023:
        return float(value)  # as `--grid lr=1` reads it: the same run name
    return value


def parse_assignments(spec: str) -> dict[str, list[Any]]:
    """One --grid: `lr=1e-3,3e-3` -> {"lr": [0.001, 0.003]}."""
    key, sep, values = spec.partition("=")
    if not sep or not values:
        raise OctlmError(f"bad --grid {shown(spec)}", "write it as KEY=V1,V2,...")
    key = key.strip().replace("-", "_")
    return {key: [parse_value(key, v.strip()) for v in values.split(",")]}


def parse_set(spec: str) -> dict[str, Any]:
    """One explicit setting: `accum=8,steps=50` (keys changed together)."""
    out: dict[str, Any] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise OctlmError(f"bad --set {shown(spec)}", "write it as KEY=V,KEY2=V2")
        key = key.strip().replace("-", "_")
        if key in out:
            raise OctlmError(
                f"bad --set {shown(spec)}: {shown_path(key)} is given twice", "give each key once"
            )
        out[key] = parse_value(key, value.strip(), "--set")
    return out


def plan(
    base: TrainConfig, grid: dict[str, list[Any]], sets: list[dict[str, Any]], repeats: int
) -> list[RunSpec]:
    """Every explicit setting x every grid combination x repeats, in a fixed order."""
    n_runs = math.prod(len(v) for v in grid.values()) * max(1, len(sets)) * repeats
    if n_runs > MAX_RUNS:
        raise OctlmError(
            f"the sweep plans {n_runs:,} runs, more than {MAX_RUNS:,}",
            "sweep fewer values, sets or repeats (or split the sweep into several)",
        )
    keys = list(grid)
    combos = [dict(zip(keys, values, strict=True)) for values in itertools.product(*grid.values())]
    settings = [{**s, **c} for s in (sets or [{}]) for c in combos]
    specs: dict[str, RunSpec] = {}
    last_seed = base.inputs.seed + repeats - 1  # repeat r trains with seed + r
    for setting in settings:
        # Each setting is validated up front, at the largest seed a repeat of it gets.
        make_config(None, **{**base.to_dict(), **setting, "seed": last_seed})
        for r in range(repeats):
            spec = RunSpec(tuple(setting.items()), r, base.inputs.seed + r)
            if spec.name in specs:
                raise OctlmError(
                    f"two runs of the sweep are both {spec.name} (one folder for two runs)",
                    "give each grid value and each set once",
                )
            specs[spec.name] = spec
    return list(specs.values())


def base_from(config_path: str | None, overrides: dict[str, Any]) -> tuple[TrainConfig, dict]:
    """The sweep's base TrainConfig (file < flags) and the file's [sweep] table, checked."""
    train_keys, table = read_toml(config_path, sweep=True) if config_path is not None else ({}, {})
    given = {k: v for k, v in overrides.items() if v is not None}
    return make_config(None, **{**train_keys, **given}), sweep_table(table, str(config_path))


def sweep_table(table: Any, where: str) -> dict[str, Any]:
    """The [sweep] table with each part checked and typed: `grid`, a table of non-empty lists
    of values; `sets`, a non-empty list of tables of settings; `repeats`, an integer."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: sweep = {checks.shown(table)} must be a table", TABLE_FIX)
    unknown = sorted(set(table) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown [sweep] key(s) {', '.join(unknown)}", TABLE_FIX)
    checked: dict[str, Any] = {}
    if "grid" in table:
        grid = table["grid"]
        if not isinstance(grid, dict) or not grid:
            raise ConfigError(
                f"{where}: [sweep] grid = {checks.shown(grid)} must be a table of lists", TABLE_FIX
            )
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                given = f"grid.{key} = {checks.shown(values)}"
                raise ConfigError(
                    f"{where}: [sweep] {given} must be a non-empty list",
                    f"write {key} = [V1, V2, ...]",
                )
        checked["grid"] = {k: [table_value(k, v, where) for v in vs] for k, vs in grid.items()}
    if "sets" in table:
        sets = table["sets"]
        if not isinstance(sets, list) or not sets or not all(isinstance(s, dict) for s in sets):
            raise ConfigError(
                f"{where}: [sweep] sets = {checks.shown(sets)} must be a non-empty list of tables",
                TABLE_FIX,
            )
        checked["sets"] = [{k: table_value(k, v, where) for k, v in s.items()} for s in sets]
    if "repeats" in table:
        checks.check(
            f"{where}: [sweep] repeats",
            table["repeats"],
            checks.Int(1, MAX_RUNS),
            TABLE_FIX,
            ConfigError,
        )
        checked["repeats"] = table["repeats"]
    return checked


TABLE_FIX = (
    "write e.g. grid = { lr = [1e-3, 3e-3] }, sets = [{ accum = 8, steps = 50 }], repeats = 2"
)


def plan_from(
    base: TrainConfig, table: dict, *, grids: list[str], sets: list[str], repeats: int | None
) -> list[RunSpec]:
    """The plan of the flags over the checked [sweep] table: a `--grid` replaces the file's
    values of its key, `--set`s replace its sets, `--repeats` its repeats."""
    grid = dict(table.get("grid", {}))
    flagged: set[str] = set()
    for spec in grids:
        for key, values in parse_assignments(spec).items():
            if key in flagged:
                raise OctlmError(
                    f"--grid {key} is given twice", f"list every value of {key} in one --grid"
                )
            flagged.add(key)
            grid[key] = values
    explicit = [parse_set(s) for s in sets] if sets else table.get("sets", [])
    n_repeats = repeats if repeats is not None else table.get("repeats", 1)
    checks.check("--repeats", n_repeats, checks.Int(1, MAX_RUNS), "use --repeats 1 or more")
    return plan(base, grid, explicit, n_repeats)
