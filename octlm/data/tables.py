"""Parquet and Arrow IPC files (file or stream format, as HF `datasets` writes its cache) read
as rows of one text column, with `pyarrow` (the `octlm[data]` extra), a record batch at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
    pa = require("pyarrow", f"reading {path}")
    row = 0
    try:
        names, total_rows, batches = _open(path, kind, pa, field)
        for batch in batches:
            column = batch.column(batch.schema.get_field_index(field))
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                raise DataError(
                    f"{path} column {field!r} holds {column.type}, not strings",
                    "name the text column with --text-field",
                )
            ids = _ids(batch, names, field)
            for i, text in enumerate(column.to_pylist()):
                yield (None if ids is None or ids[i] is None else str(ids[i])), text or ""
            row += len(column)
            if on_fraction is not None and total_rows:
                on_fraction(row / total_rows)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(
            f"{path} is not a readable {kind} file ({str(exc).splitlines()[0]})",
            "check the file (it may be truncated)",
        ) from None


def _ids(batch: Any, names: list[str], field: str) -> list[Any] | None:
    if "id" not in names or field == "id":
        return None
    return batch.column(batch.schema.get_field_index("id")).to_pylist()


def _open(
    path: Path, kind: str, pa: ModuleType, field: str
) -> tuple[list[str], int, Iterator[Any]]:
    """(column names, rows if known, record batches of the text and id columns)."""
    if kind == PARQUET:
        pf = import_module("pyarrow.parquet").ParquetFile(path)
        names = pf.schema_arrow.names
        _check_column(path, names, field)
        columns = [field] + (["id"] if "id" in names and field != "id" else [])
        return names, pf.metadata.num_rows, pf.iter_batches(batch_size=_BATCH_ROWS, columns=columns)
    ipc = import_module("pyarrow.ipc")
    try:
        reader = ipc.open_file(pa.memory_map(str(path)))
        names = reader.schema.names
        batches: Iterator[Any] = (reader.get_batch(i) for i in range(reader.num_record_batches))
        total = 0  # rows unknown without reading every batch's metadata: no fraction
    except pa.ArrowInvalid:  # not the file format: HF datasets' cache files are IPC streams
        stream = ipc.open_stream(pa.memory_map(str(path)))
        names, batches, total = stream.schema.names, iter(stream), 0
    _check_column(path, names, field)
    return names, total, batches


def _check_column(path: Path, names: list[str], field: str) -> None:
    if field not in names:
        raise DataError(
            f"{path} has no column {field!r} (columns: {', '.join(names)})",
            "name the text column with --text-field",
        )
