"""One field of one line of a task file, checked: its type and range, with an error that names
the field (the file and the line are added by the reader)."""

from __future__ import annotations

from octlm.config.checks import is_int, shown
from octlm.errors import OctlmError

LINE_FIX = "fix that line of the task file (docs/evaluation.md: task files)"


class TaskLineError(OctlmError):
    """One field of one line of a task file is wrong: `field` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field {field!r}: {problem}", LINE_FIX)


def text_field(record: dict, key: str, default: str | None = None) -> str:
    """`record[key]`, a string encodable as UTF-8 (no lone surrogate)."""
    if key not in record and default is not None:
        return default
    if key not in record:
        raise TaskLineError(key, "is missing")
    return checked_text(record[key], key)


def checked_text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TaskLineError(name, f"must be a string, not {shown(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise TaskLineError(name, f"holds a lone surrogate ({shown(value)})") from None
    return value


def texts_field(record: dict, key: str, where: str = "") -> tuple[str, ...]:
    """`record[key]`, a non-empty list of strings."""
    value = record.get(key)
    name = f"{where}{key}"
    if key not in record:
        raise TaskLineError(name, "is missing")
    if not isinstance(value, list) or not value:
        raise TaskLineError(name, f"must be a non-empty list of strings, not {shown(value)}")
    return tuple(checked_text(v, f"{name}[{i}]") for i, v in enumerate(value))


def index_field(record: dict, key: str, choices: int) -> int:
    """`record[key]`, the right choice's index: an integer (or its digits, as HellaSwag's
    files write it) from 0 to `choices` - 1."""
    if key not in record:
        raise TaskLineError(key, "is missing")
    value = record[key]
    digits = isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 20
    if (is_int(value) or digits) and 0 <= int(value) < choices:
        return int(value)
    if is_int(value) or digits:
        raise TaskLineError(
            key, f"{key} {shown(value)} is not one of the choices (0 to {choices - 1})"
        )
    raise TaskLineError(key, f"must be an integer from 0 to {choices - 1}, not {shown(value)}")
