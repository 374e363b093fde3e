"""The error line's backstop (`octlm.errors.one_line`): whatever a raise site quotes of a
user's input (a 16,000-character path, a newline in a value), `octlm: error: ...` stays one
short printable line, and the problem's and the fix's words stay whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from octlm.errors import LONGEST_WORD, one_line
from tests.cli_in_process import main


def test_one_line_escapes_control_characters_and_cuts_long_runs() -> None:
    text = "run folder not found: /tmp/" + "x" * 16_000 + " \nmore; pass a run folder"
    line = one_line(text)
    assert "\n" not in line and "\\n" in line
    assert len(line) < LONGEST_WORD + 60
    assert line.startswith("run folder not found: /tmp/xxx") and "..." in line
    assert one_line("a plain message; its fix") == "a plain message; its fix"


@pytest.mark.parametrize(
    "args",
    [
        ["eval", "x" * 16_000],
        ["hash", "dir/" * 4_000],
        ["generate", "run\nwith a newline", "--prompt", "hi"],
        ["train", "--config", "c" * 16_000 + ".toml"],
    ],
    ids=["eval_long_path", "hash_deep_path", "generate_newline", "config_long_name"],
)
def test_a_long_or_broken_value_stays_one_short_line(args, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) != 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("octlm: error: "), err[:500]
    assert len(lines[0]) < 400 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
