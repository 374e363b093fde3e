"""The data surface's fuzz in the fast lane: `fuzz_count(150)` malformed cases per format
(task files of each layout, the `--data` string, the TOML [data] table), each refused in one
line without a traceback and without a change on disk, or accepted (tests/fuzz/data_inputs.py)."""

from __future__ import annotations

import pytest

from tests.fuzz.data_inputs import FORMATS
from tests.fuzz.harness import fuzz_count


@pytest.mark.parametrize("name", FORMATS)
def test_malformed_data_inputs_are_refused_in_one_line(name, tmp_path) -> None:
    failures = FORMATS[name](seed=50, n=fuzz_count(150), root=tmp_path)
    assert not failures, "\n".join(failures[:20])
