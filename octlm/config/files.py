"""Settings files: a TOML file of `octlm train` keys (and a sweep's [sweep] table) read into a
`TrainConfig`, a resolved config written back as TOML, and each key's docs (`--help`).
`--config` takes a path or the name of a config shipped in the package (`tiny`,
`ablations/lr`), so an installed octlm has them too.
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any

from octlm.config import checks
from octlm.config.inputs import MAX_WEIGHT, MIN_WEIGHT, WEIGHT_RULE
from octlm.config.rl import KEY_ORDER as RL_KEYS
from octlm.config.rl import SECTIONS as RL_SECTIONS
from octlm.config.rl import RLConfig
from octlm.config.rules import UNKNOWN_KEY_FIX, section_docs, unknown_keys_problem
from octlm.config.train import SECTIONS, ConfigError, TrainConfig, config_keys

# Package data (pyproject.toml): the same files in a checkout and in an installed wheel.
SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def shipped_configs() -> list[str]:
    """The names `--config` resolves without a path: `tiny`, ..., `ablations/lr`, sorted."""
    found = SHIPPED_CONFIGS.rglob("*.toml")
    return sorted(p.relative_to(SHIPPED_CONFIGS).with_suffix("").as_posix() for p in found)


def config_path(name_or_path: str | Path) -> Path:
    """The file a `--config` value names: an existing path as given, else a shipped config's
    name. The path is tried first so that a user's own file is never shadowed by a name."""
    checks.check_path("config", name_or_path, ConfigError)
    path = Path(name_or_path)
    if path.is_file():
        return path
    names = shipped_configs()
    if str(name_or_path) in names:
        return SHIPPED_CONFIGS / f"{name_or_path}.toml"
    raise ConfigError(
        f"config file not found: {checks.shown_path(path)}",
        f"name a TOML file, or a shipped config: {', '.join(names)}",
    )


def read_toml(
    path: str | Path, *, sweep: bool = False, command: str = "octlm train"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(keys, [sweep] table) of a TOML file or shipped config of `command`'s keys (`octlm
    train`'s or `octlm rl`'s); unknown keys are errors. The [sweep] table (`grid = {key =
    [values]}`, `sets = [{...}, ...]`, `repeats`) is read only with `sweep`; the sweep checks it
    (`octlm.tools.sweep_plan.sweep_table`)."""
    path = config_path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        shown = checks.shown_path(path)
        raise ConfigError(f"{shown} is not valid TOML ({exc})", "fix the file") from None
    table = data.pop("sweep", {}) if sweep else {}  # checked by octlm.tools.sweep_plan
    _check_keys(path, data, command)
    if command == "octlm train" and isinstance(data.get("data"), dict):
        data["data"] = mixture_spec(path, data["data"])  # a [data] table of PATH = WEIGHT
    return data, table


def settings_command(path: str | Path) -> str:
    """Whose settings a TOML file holds: "octlm rl" when it names a `task` (a key only RL has,
    and one every RL settings file holds), else "octlm train"."""
    try:
        data = tomllib.loads(config_path(path).read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return "octlm train"  # read_toml says what is wrong with it
    return "octlm rl" if "task" in data else "octlm train"


def mixture_spec(path: Path, table: dict[str, Any]) -> str:
    """A [data] table of PATH = WEIGHT as the `--data` spec PATH:WEIGHT,... it means (whose
    weights `octlm.config.inputs.parse_mixture` then checks, as the flag's)."""
    fix = 'write each dataset as PATH = WEIGHT, e.g. "data/stories" = 0.7'
    if not table:
        raise ConfigError(f"{checks.shown_path(path)}: [data] names no dataset", fix)
    for name, weight in table.items():
        where = f"{checks.shown_path(path)}: the weight of {checks.shown(name)} in [data]"
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ConfigError(f"{where} is not a number ({checks.shown(weight)})", fix)
        if not MIN_WEIGHT <= weight <= MAX_WEIGHT:
            raise ConfigError(f"{where} is not {WEIGHT_RULE} ({checks.shown(weight)})", fix)
        if "," in name or not name.strip():
            raise ConfigError(
                f"{checks.shown_path(path)}: [data] names a dataset {checks.shown(name)}, which "
                "is not a path --data can hold (empty, or a comma in it)",
                "rename the folder, or train on it alone with data = PATH",
            )
    return ",".join(f"{name}:{weight}" for name, weight in table.items())


def _check_keys(path: Path, data: dict[str, Any], command: str) -> None:
    """Unknown keys are errors; one no key is near (long, or with unprintable characters) is
    quoted short and not matched against the known ones (difflib on a 5,000-character key takes
    a second)."""
    known = config_keys() if command == "octlm train" else list(RL_KEYS)
    odd = sorted(k for k in set(data) - set(known) if checks.shown(k) != repr(k))
    if odd:
        raise ConfigError(
            f"{checks.shown_path(path)}: unknown key {checks.shown(odd[0])}",
            UNKNOWN_KEY_FIX.format(command=command),
        )
    problem = unknown_keys_problem(data, known, command)
    if problem is not None:
        raise ConfigError(f"{checks.shown_path(path)}: {problem[0]}", problem[1])


def load_toml(path: str | Path) -> dict[str, Any]:
    """The train keys of a TOML file (a [sweep] table is an unknown key here)."""
    return read_toml(path)[0]


TOML_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}
"""TOML's short escapes (a basic string's other control characters are written \\uXXXX)."""


def toml_string(text: str) -> str:
    """`text` as a TOML basic string that reads back to it: the quote and backslash escaped, and
    every control character TOML forbids raw (U+0000 to U+001F, DEL) as its escape."""
    out = []
    for c in text:
        if c in TOML_ESCAPES:
            out.append(TOML_ESCAPES[c])
        elif ord(c) < 0x20 or c == "\x7f":
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def to_toml(values: dict[str, Any]) -> str:
    """A flat TOML document of str/int/float/bool values (None values are left out)."""
    lines = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = toml_string(str(value))
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


def make_config(toml_path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """TOML < overrides (flags); None overrides mean "not given" and are skipped."""
    values: dict[str, Any] = load_toml(toml_path) if toml_path is not None else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**values)  # one line per bad key, type or value


def make_rl_config(toml_path: str | Path | None = None, **overrides: Any) -> RLConfig:
    """`make_config` for `octlm rl`: its TOML keys < overrides (flags), None meaning not given."""
    values: dict[str, Any] = {}
    if toml_path is not None:
        values = read_toml(toml_path, command="octlm rl")[0]
    values.update({k: v for k, v in overrides.items() if v is not None})
    return RLConfig(**values)


def field_docs() -> dict[str, str]:
    """Each TrainConfig key's docstring (the string under its field), for `--help`: a copy, so
    a caller may change it."""
    return dict(_field_docs())


@functools.cache
def _field_docs() -> dict[str, str]:
    # Read from the source once per process: every `octlm` command builds the parser, and a
    # process that runs many (the tests, the fuzz) would parse the sources each time (~0.5 s).
    docs = {key: doc for cls in SECTIONS.values() for key, doc in section_docs(cls).items()}
    return {key: docs[key] for key in config_keys() if key in docs}  # not a derived field's


@functools.cache
def rl_field_docs() -> dict[str, str]:
    """Each RLConfig key's docstring; a key RL shares with training and documents no otherwise
    has training's (one name, one meaning)."""
    own = {key: doc for cls in RL_SECTIONS.values() for key, doc in section_docs(cls).items()}
    shared = _field_docs()
    return {key: own.get(key) or shared.get(key, "") for key in RL_KEYS}


def sectioned_toml(cfg: TrainConfig | RLConfig) -> str:
    """`cfg` as a flat TOML document (what `--config` reads back to the same config), its keys
    grouped under a comment per section, keys that do not apply to this run left out (they
    hold their defaults: `train.applicable`)."""
    blocks = []
    for name, keys in cfg.by_section().items():
        if any(value is not None for value in keys.values()):  # else nothing to write under it
            blocks.append(f"# {name}\n" + to_toml(keys))
    return "\n".join(blocks)
