"""Measurement scripts, run from the repository root as `python -m bench.NAME` or
`python bench/NAME.py`; not part of the octlm package."""

DATA = "runs/demo/data"
"""The demo dataset the benches train on: `octlm prepare --out runs/demo/data --vocab-size 4096`."""
