"""Weights & Biases from the log's records (`--log-to wandb`; `WANDB_MODE=offline` works with
no network and no key).

The run id lives in `OUT/wandb_id`, so a resume continues the same W&B run (`resume="allow"`).
Every value is charted against `step`, the record's own step, never W&B's internal counter,
which only grows. W&B cannot take back what it was sent: steps a crash made the log drop and
the resume computed again appear twice there (docs/trackers.md). The log and TensorBoard don't.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from octlm.extras import require
from octlm.trackers.records import hparams, numbers

ID_FILE = "wandb_id"


class WandbSink:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.wandb = require("wandb", "--log-to wandb")
        self.run: Any = None

    def _run_id(self, resumed_at: int | None) -> str:
        path = self.out / ID_FILE
        if resumed_at is not None and path.is_file():
            return path.read_text().strip()
        # A log started afresh is a new run: an old id here belonged to an attempt it dropped.
        run_id = secrets.token_hex(6)  # W&B ids: letters, digits, - and _
        path.write_text(run_id + "\n")
        return run_id

    def open(self, resumed_at: int | None) -> None:
        settings = self.wandb.Settings(
            console="off",  # the progress bar and octlm's messages stay on the terminal as is
            x_disable_stats=True,  # no sampling thread competing with training for the CPU
            save_code=False,
        )
        self.run = self.wandb.init(
            project=os.environ.get("WANDB_PROJECT", "octlm"),
            name=self.out.resolve().name,
            id=self._run_id(resumed_at),
            resume="allow",
            dir=None if "WANDB_DIR" in os.environ else str(self.out),
            settings=settings,
        )
        self.run.define_metric("step")
        for group in ("train/*", "val/*", "event", "end"):
            self.run.define_metric(group, step_metric="step")

    def record(self, record: dict[str, Any]) -> None:
        kind = record["type"]
        if kind == "header":
            self.run.config.update(hparams(record), allow_val_change=True)
        elif kind in ("step", "val"):
            self.run.log({"step": record["step"], **numbers(record)})
        elif kind in ("event", "end"):
            fields = {k: v for k, v in record.items() if k not in ("type", "step")}
            self.run.log({"step": record["step"], kind: json.dumps(fields, default=str)})
            if kind == "end":
                self.run.summary.update({"weights_sha256": record["weights_sha256"]})

    def close(self, failed: bool = False) -> None:
        if self.run is not None:
            # A run that ended in an error shows as failed, not finished. A clean stop
            # (--stop-at, a signal) is a finished session: its resume reopens the same run.
            self.run.finish(exit_code=1 if failed else 0)
            self.run = None
