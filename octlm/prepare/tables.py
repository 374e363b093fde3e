"""Parquet and Arrow IPC files (file or stream format, as HF `datasets` writes its cache) read
as rows of one text column (documents) or of several (prompt and completion), with `pyarrow`
(the `octlm[data]` extra), a record batch at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any

from octlm.errors import DataError
from octlm.extras import require

PARQUET, ARROW = "parquet", "arrow"
_BATCH_ROWS = 4096


def read_rows(
    path: Path, kind: str, field: str, on_fraction: Callable[[float], None] | None = None
) -> Iterator[tuple[str | None, str]]:
    """(id or None, text) per row: the id from an `id` column if the file has one; a null text
    is an empty document. `on_fraction(f)` hears how much of the file is read (when known)."""
    columns = (Column(field, "the text column", "--text-field"),)
    for row_id, (text,) in read_columns(path, kind, columns, on_fraction):
        yield row_id, text or ""


@dataclass(frozen=True)
class Column:
    """A column to read, and how an error names it and the flag that picks another."""

    name: str
    what: str
    flag: str
    strings: bool = True
    """A column of strings; False: of lists (a chat dataset's turns), read as Python lists."""

    def hint(self) -> str:
        return f"name {self.what} with {self.flag}"


def read_columns(
    path: Path,
    kind: str,
    columns: Sequence[Column],
    on_fraction: Callable[[float], None] | None = None,
) -> Iterator[tuple[str | None, tuple[str | None, ...]]]:
    """(id or None, the row's values of `columns`, None where null) per row, in file order;
    the id from an `id` column if the file has one and it is not among `columns`."""
    pa = require("pyarrow", f"reading {path}")
    names = [c.name for c in columns]
    row = 0
    try:
        schema_names, total_rows, batches = _open(path, kind, pa, columns)
        with_id = "id" in schema_names and "id" not in names
        for batch in batches:
            values = []
            for col in columns:
                array = batch.column(batch.schema.get_field_index(col.name))
                _check_type(pa, path, col, array.type)
                values.append(array.to_pylist())
            ids = batch.column(batch.schema.get_field_index("id")).to_pylist() if with_id else None
            for i, row_values in enumerate(zip(*values, strict=True)):
                yield (None if ids is None or ids[i] is None else str(ids[i])), row_values
            row += batch.num_rows
            if on_fraction is not None and total_rows:
                on_fraction(row / total_rows)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(
            f"{path} is not a readable {kind} file ({str(exc).splitlines()[0]})",
            "check the file (it may be truncated)",
        ) from None


def _open(
    path: Path, kind: str, pa: ModuleType, columns: Sequence[Column]
) -> tuple[list[str], int, Iterator[Any]]:
    """(column names, rows if known, record batches of the wanted columns and the id)."""
    if kind == PARQUET:
        pf = import_module("pyarrow.parquet").ParquetFile(path)
        names = pf.schema_arrow.names
        _check_columns(path, names, columns)
        wanted = [c.name for c in columns]
        wanted += ["id"] if "id" in names and "id" not in wanted else []
        return names, pf.metadata.num_rows, pf.iter_batches(batch_size=_BATCH_ROWS, columns=wanted)
    ipc = import_module("pyarrow.ipc")
    try:
        reader = ipc.open_file(pa.memory_map(str(path)))
        names = reader.schema.names
        batches: Iterator[Any] = (reader.get_batch(i) for i in range(reader.num_record_batches))
        total = 0  # rows unknown without reading every batch's metadata: no fraction
    except pa.ArrowInvalid:  # not the file format: HF datasets' cache files are IPC streams
        stream = ipc.open_stream(pa.memory_map(str(path)))
        names, batches, total = stream.schema.names, iter(stream), 0
    _check_columns(path, names, columns)
    return names, total, batches


def _check_type(pa: ModuleType, path: Path, col: Column, kind: Any) -> None:
    types = pa.types
    if col.strings and not (types.is_string(kind) or types.is_large_string(kind)):
        raise DataError(f"{path} column {col.name!r} holds {kind}, not strings", col.hint())
    if not col.strings and not (types.is_list(kind) or types.is_large_list(kind)):
        raise DataError(f"{path} column {col.name!r} holds {kind}, not lists", col.hint())


def _check_columns(path: Path, names: list[str], columns: Sequence[Column]) -> None:
    for col in columns:
        if col.name not in names:
            raise DataError(
                f"{path} has no column {col.name!r} (columns: {', '.join(names)})", col.hint()
            )
