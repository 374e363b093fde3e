"""The fast lane's share of the TOML config fuzz (tests/fuzz/toml_inputs.py): a few hundred
malformed variants of the shipped configs, each printed or refused in one line."""

from __future__ import annotations

from pathlib import Path

from tests.fuzz.harness import fuzz_count
from tests.fuzz.toml_inputs import run, shipped_configs, toml_variants


def test_malformed_configs_are_printed_or_refused_in_one_line(tmp_path: Path) -> None:
    failures = run(seed=0, n=fuzz_count(200), root=tmp_path)
    assert not failures, "\n".join(failures[:10])


def test_the_variants_are_the_same_for_a_seed_and_differ_from_the_config() -> None:
    text = shipped_configs()[0].read_text(encoding="utf-8")
    first, again = list(toml_variants(text, 7, 20)), list(toml_variants(text, 7, 20))
    assert first == again and sum(v != text.encode() for v in first) >= 18
