"""The fast lane's share of the TOML config fuzz (tests/fuzz/toml_inputs.py): a few hundred
malformed variants of the shipped configs, each printed or refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from octlm.config.files import make_config, make_rl_config, sectioned_toml
from octlm.errors import OctlmError
from tests.fuzz.harness import fuzz_count
from tests.fuzz.toml_inputs import run, shipped_configs, toml_variants


@pytest.mark.slow  # 200 variants through `octlm train --print-config` (in process): 4 s
def test_malformed_configs_are_printed_or_refused_in_one_line(tmp_path: Path) -> None:
    failures = run(seed=0, n=fuzz_count(200), root=tmp_path)
    assert not failures, "\n".join(failures[:10])


def test_the_variants_are_the_same_for_a_seed_and_differ_from_the_config() -> None:
    text = shipped_configs()[0].read_text(encoding="utf-8")
    first, again = list(toml_variants(text, 7, 20)), list(toml_variants(text, 7, 20))
    assert first == again and sum(v != text.encode() for v in first) >= 18


PATHS = st.text(min_size=1, max_size=40)


def reads_back(folder: Path, data: str, out: str) -> None:
    """Training's and RL's printed settings, with these paths, read back to the same text."""
    for make, values in (
        (make_config, {"data": data, "out": out, "model": "tiny", "context": 32}),
        (make_rl_config, {"source": data, "out": out, "task": "count"}),
    ):
        try:
            cfg = make(**values)
        except OctlmError:
            assume(False)
        printed = sectioned_toml(cfg)
        (folder / "run.toml").write_text(printed, encoding="utf-8")
        again = make(folder / "run.toml")
        assert sectioned_toml(again) == printed and again.run.out == out


@settings(max_examples=fuzz_count(150), derandomize=True, deadline=None)
@given(PATHS, PATHS)
def test_print_config_reads_back_whatever_a_path_holds(tmp_path_factory, data, out) -> None:
    """`--print-config` of training and RL settings whose paths hold any characters (a
    newline, ESC, DEL, a quote, a backslash) is TOML that reads back to the same settings."""
    reads_back(tmp_path_factory.mktemp("printed"), data, out)


@pytest.mark.parametrize("path", ["a\nb", "runs/\x1b[31mred", "d\x7fel", 'q"\\\t\r\x00'])
def test_print_config_reads_back_a_path_with_a_control_character(tmp_path, path) -> None:
    """The cases the fuzz found: a newline, ESC, DEL (and NUL in `out`, refused as a path)."""
    reads_back(tmp_path, "data", path if "\x00" not in path else path.replace("\x00", ""))
