"""Readers of what the trackers wrote, with the libraries' own parsers: TensorBoard's
EventAccumulator (which applies purges as TensorBoard shows them), and W&B's record protobuf
over the offline `.wandb` file (a LevelDB-style log of 32 KiB blocks)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

BLOCK, HEADER = 32 * 1024, 7  # W&B's transaction log: LevelDB's block and record header sizes
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def tb_accumulator(log_dir: Path):
    """The reader TensorBoard's own (Python) data provider uses: it applies a writer's
    `purge_step` to every kind of data. The older `event_accumulator` purges scalars but not
    tensors, so it would still show text written past the cut."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return acc


def _tagged(log_dir: Path, plugin: str) -> dict[str, list[Any]]:
    acc = tb_accumulator(log_dir)
    tags = acc.Tags()["tensors"]
    mine = [t for t in tags if acc.SummaryMetadata(t).plugin_data.plugin_name == plugin]
    return {t: acc.Tensors(t) for t in mine}


def tb_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.util.tensor_util import make_ndarray

    events = _tagged(log_dir, "scalars")
    return {
        t: [(e.step, make_ndarray(e.tensor_proto).item()) for e in v] for t, v in events.items()
    }


def tb_texts(log_dir: Path, tag: str) -> list[tuple[int, str]]:
    events = _tagged(log_dir, "text").get(tag + "/text_summary", [])  # where add_text puts it
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in events]


def as_float32(value: float) -> float:
    return float(np.float32(value))


def expected_scalars(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard should show of a log: every number of its step and val records, at
    the record's step, as float32 (what an event file stores)."""
    from octlm.trackers.records import numbers

    series: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record["type"] in ("step", "val"):
            for tag, value in numbers(record).items():
                series.setdefault(tag, []).append((record["step"], as_float32(value)))
    return series


def _payloads(data: bytes) -> list[bytes]:
    """The records of a `.wandb` file: a 7-byte file header, then LevelDB log blocks whose
    records are checksum (4), length (2), type (1), data; a record split across blocks comes
    in FIRST/MIDDLE/LAST pieces, and a block's tail shorter than a header is padding."""
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, out, pending = HEADER, [], b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + HEADER])
        if length == 0 and kind == 0:  # zero padding at the end of a block
            pos += left
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
    return out


def wandb_records(run_folder: Path) -> list[Any]:
    """The protobuf records of one offline run folder (`offline-run-*`)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_folder.glob("run-*.wandb")
    records = []
    for payload in _payloads(path.read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def _items(items: Any) -> dict[str, Any]:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


def wandb_history(run_folder: Path) -> list[dict[str, Any]]:
    records = wandb_records(run_folder)
    return [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]


def wandb_numbers(rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """The metric rows of a W&B history (W&B's own `_` keys and the text rows left out)."""
    out = []
    for row in rows:
        values = {k: v for k, v in row.items() if "/" in k}
        if values:
            out.append((row["step"], values))
    return out


def log_numbers(records: list[dict[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    from octlm.trackers.records import numbers

    return [(r["step"], numbers(r)) for r in records if r["type"] in ("step", "val")]


def wandb_run_ids(run_folder: Path) -> set[str]:
    return {r.run.run_id for r in wandb_records(run_folder) if r.WhichOneof("record_type") == "run"}


def wandb_exit_codes(run_folder: Path) -> list[int]:
    """The exit codes the folder's session reported when it finished (W&B shows a non-zero
    one as a failed run)."""
    records = wandb_records(run_folder)
    return [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]


def wandb_config(run_folder: Path) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for r in wandb_records(run_folder):
        if r.WhichOneof("record_type") == "config":
            config.update(_items(r.config.update))
    return config
