"""TensorBoard event files from the log's records (`--log-to tensorboard`, `octlm log export`).

A resumed run purges instead of appending blindly: the writer opens with `purge_step` at the
step the log was cut back to, and TensorBoard's reader then drops every older event at or past
it, exactly the records `RunLog.truncate_after` dropped. The x axis is each record's own step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from octlm.extras import require
from octlm.trackers.records import hparams, numbers


class TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        # Imported here, not at open(): a broken install is found before the first step.
        require("tensorboard", "--log-to tensorboard")  # torch's writer needs it
        from torch.utils.tensorboard import SummaryWriter

        self.writer_class = SummaryWriter
        self.writer: Any = None

    def open(self, resumed_at: int | None) -> None:
        # A log started afresh keeps nothing: purge from the first possible step, so events of
        # an earlier attempt in the same folder (one that never checkpointed) are hidden too.
        purge = 0 if resumed_at is None else resumed_at
        self.writer = self.writer_class(log_dir=str(self.log_dir), purge_step=purge)

    def record(self, record: dict[str, Any]) -> None:
        kind, w = record["type"], self.writer
        if kind == "header":
            self._header(record)
        elif kind in ("step", "val"):
            for tag, value in numbers(record).items():
                w.add_scalar(tag, value, record["step"])
        elif kind in ("event", "hash", "end"):
            fields = {k: v for k, v in record.items() if k not in ("type", "step")}
            w.add_text(kind, "`" + json.dumps(fields, default=str) + "`", record["step"])

    def _header(self, record: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        # The config in the HParams dashboard (no metrics: the scalars above are the metrics),
        # the whole header as text beside it. Both at step 0, before any step can be written.
        for summary in hparams_summaries(hparams(record), {}):
            self.writer.file_writer.add_summary(summary, 0)
        header = json.dumps(record, indent=1, default=str)
        self.writer.add_text("header", "```\n" + header + "\n```", 0)

    def close(self, failed: bool = False) -> None:  # event files have no run state to mark
        if self.writer is not None:
            self.writer.close()
            self.writer = None
