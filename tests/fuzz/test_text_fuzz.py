"""The fuzz of the generation side's text (tests/fuzz/text_inputs.py) in the fast lane:
`fuzz_count(150)` malformed cases per format, each accepted or refused in one line with
nothing on disk changed; bench/fuzz_inputs.py runs thousands through the same `run`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.harness import fuzz_count
from tests.fuzz.text_inputs import FORMATS


@pytest.mark.parametrize("name", FORMATS)
def test_malformed_text_is_accepted_or_refused_in_one_line(name: str, tmp_path: Path) -> None:
    failures = FORMATS[name](0, fuzz_count(150), tmp_path)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])
