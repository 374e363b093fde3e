"""Trackers: TensorBoard and W&B fed the same records as `log.jsonl` (docs/trackers.md)."""
