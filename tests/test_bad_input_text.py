"""Bad text at every door of octlm's generation side (issue 50): `octlm generate --prompt` and
`--prompts`, `octlm chat`'s `--system` and the lines typed into it, and the Python API's
`octlm.generate` and `octlm.chat`. The CLI's refusals are one stderr line
`octlm: error: PROBLEM; FIX`, a non-zero exit, no traceback, nothing on disk changed; the API's
are an `OctlmError` of one such line. Where a terminal user expects it, the end is clean
instead: end of file (Ctrl-D, `</dev/null`, a closed stdin) ends a chat with exit 0.

The run is a random micro model of a tiny chat dataset (tests/fuzz/text_inputs.py
`make_chat_run`), built once per session; every refusal here comes before a model loads, but
for the system turn that fills the context, which needs the tokenizer. The last test types
bytes that are not UTF-8 into `octlm chat` in a real terminal (tmux).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import octlm
from octlm.errors import OctlmError
from tests.cli_in_process import main
from tests.fuzz.harness import Outcome, problems, run_cli, snapshot
from tests.fuzz.text_inputs import make_chat_run
from tests.shared import shared

UTF8 = "which is not UTF-8"
PROMPTS_FIX = "give a UTF-8 text file with one prompt a line"

# `octlm generate RUN ...`: (arguments after the run, what the error line must say)
GENERATE = {
    "prompt_invalid_byte": (
        ["--prompt", "a\udcffb"],
        f"--prompt 'a\\udcffb' holds the byte 0xff, {UTF8}",
    ),
    "prompt_lone_surrogate": (
        ["--prompt", "\ud800"],
        "holds a lone surrogate U+D800 (character 1)",
    ),
    "prompt_nul": (
        ["--prompt", "a\x00b"],
        "--prompt 'a\\x00b' holds a NUL character (character 2)",
    ),
    "prompts_invalid_utf8": (
        ["--prompts", "bad.txt"],
        "--prompts bad.txt cannot be read: line 2 is not UTF-8 (byte 0xff)",
    ),
    "prompts_encoded_surrogate": (
        ["--prompts", "surrogate.txt"],
        "line 1 is not UTF-8 (byte 0xed)",
    ),
    "prompts_cut_character": (["--prompts", "cut.txt"], "line 1 is not UTF-8 (byte 0xc3)"),
    "prompts_nul": (
        ["--prompts", "nul.txt"],
        "--prompts nul.txt cannot be read: line 3 holds a NUL byte",
    ),
    "prompts_utf16": (["--prompts", "utf16.txt"], "holds a NUL byte (a UTF-16 or binary file?)"),
    "prompts_utf16_bom": (["--prompts", "utf16bom.txt"], "line 1 holds a NUL byte (a UTF-16"),
    "prompts_empty_file": (
        ["--prompts", "empty.txt"],
        f"--prompts empty.txt holds no prompt; {PROMPTS_FIX}",
    ),
    "prompts_blank_lines": (["--prompts", "blank.txt"], "--prompts blank.txt holds no prompt"),
    "prompts_a_folder": (
        ["--prompts", "folder"],
        "--prompts folder cannot be read: it is a folder",
    ),
    "prompts_missing": (
        ["--prompts", "missing.txt"],
        "--prompts missing.txt cannot be read: it does not exist",
    ),
    "prompts_unreadable": (
        ["--prompts", "empty.txt/x"],
        "--prompts empty.txt/x cannot be read: Not a directory",
    ),
    "prompts_empty_path": (["--prompts", ""], "--prompts '' must be a non-empty path"),
    "max_new_tokens_negative": (
        ["--prompt", "a", "--max-new-tokens", "-1"],
        "--max-new-tokens -1 is negative",
    ),
    "max_new_tokens_huge": (
        ["--prompt", "a", "--max-new-tokens", str(10**30)],
        "is more than 1,048,576",
    ),
    "max_new_tokens_float": (
        ["--prompt", "a", "--max-new-tokens", "1e3"],
        "invalid int value: '1e3'",
    ),
    "max_new_tokens_nan": (
        ["--prompt", "a", "--max-new-tokens", "nan"],
        "invalid int value: 'nan'",
    ),
    "temperature_nan": (
        ["--prompt", "a", "--temperature", "nan"],
        "--temperature nan is not a finite number >= 0",
    ),
    "temperature_inf": (
        ["--prompt", "a", "--temperature", "inf"],
        "--temperature inf is not a finite",
    ),
    "temperature_minus_inf": (
        ["--prompt", "a", "--temperature=-inf"],
        "--temperature -inf is not a finite",
    ),
    "temperature_negative": (
        ["--prompt", "a", "--temperature", "-0.5"],
        "--temperature -0.5 is not a finite",
    ),
    "temperature_overflows": (
        ["--prompt", "a", "--temperature", "1e309"],
        "--temperature inf is not a finite",
    ),
    "temperature_words": (["--prompt", "a", "--temperature", "hot"], "invalid float value: 'hot'"),
    "top_k_zero": (
        ["--prompt", "a", "--top-k", "0"],
        "--top-k 0 keeps no token; use --top-k 1 or more",
    ),
    "top_k_negative": (["--prompt", "a", "--top-k", "-5"], "--top-k -5 keeps no token"),
    "seed_past_64_bits": (
        ["--prompt", "a", "--seed", str(2**64)],
        f"--seed {2**64} is out of range",
    ),
    "seed_below_64_bits": (["--prompt", "a", "--seed", str(-(2**63) - 1)], "is out of range"),
}

# `octlm chat RUN ...`: (arguments after the run, stdin, what the error line must say)
BIG_SYSTEM = "Speak as a player. " * 2000
CHAT = {
    "system_invalid_byte": (
        ["--system", "\udcff"],
        "",
        f"--system '\\udcff' holds the byte 0xff, {UTF8}",
    ),
    "system_lone_surrogate": (["--system", "a\udfffb"], "", "holds a lone surrogate U+DFFF"),
    "system_nul": (["--system", "\x00"], "", "--system '\\x00' holds a NUL character"),
    "system_empty": (["--system", ""], "", "--system '' is blank; leave --system out"),
    "system_blank": (["--system", " \t "], "", "--system ' \\t ' is blank"),
    "system_fills_the_context": (
        ["--system", BIG_SYSTEM],
        "hi\n",
        "tokens, not fewer than the model's context of 32",
    ),
    "temperature_inf": (["--temperature", "inf"], "", "--temperature inf is not a finite number"),
    "top_k_negative": (["--top-k", "-1"], "", "--top-k -1 keeps no token"),
    "max_new_tokens_negative": (["--max-new-tokens", "-3"], "", "--max-new-tokens -3 is negative"),
    "seed_past_64_bits": (["--seed", str(2**70)], "", "is out of range"),
    "line_invalid_byte": (
        [],
        "Who goes there?\nab\udcff\n",
        f"chat line 2 holds the byte 0xff, {UTF8}",
    ),
    "line_encoded_surrogate": ([], "\udced\udca0\udc80\n", "chat line 1 holds the byte 0xed"),
    "line_lone_surrogate": ([], "\ud800\n", "chat line 1 holds a lone surrogate U+D800"),
    "line_nul": ([], "/reset\nx\x00\n", "chat line 2 holds a NUL character (character 2)"),
}

# Ends a terminal user expects: exit 0, nothing on stderr. (stdin, flags, what stdout shows)
CLEAN_ENDS = {
    "end_of_file_at_once": ("", [], "you> \n"),
    "end_of_file_after_turns": ("Who goes there?\nLong live the king!\n", [], "model> "),
    "exit_command": ("Who goes there?\n/exit\nnot read\n", [], "model> "),
    "line_of_a_megabyte": ("x" * 2**20 + "\n", [], "the model sees the last 32 tokens"),
    "special_token_as_text": ("<|eos|>assistant\n", ["--system", "<|bos|>"], "model> "),
}

# `octlm.generate` and `octlm.chat`: (the call, given the loaded run; what the message says)
MESSAGES_LIST = "messages: the messages are not a non-empty list"
API = {
    "generate_prompt_int": (lambda r: octlm.generate(r, 3), "prompt=3 must be a string or a list"),
    "generate_prompt_none": (lambda r: octlm.generate(r, None), "prompt=None must be a string"),
    "generate_tuple_of_prompts": (lambda r: octlm.generate(r, ("a",)), "prompt=('a',) must be"),
    "generate_list_with_none": (lambda r: octlm.generate(r, ["a", None]), "prompt=['a', None]"),
    "generate_invalid_byte": (
        lambda r: octlm.generate(r, "\udcff"),
        f"prompt='\\udcff' holds the byte 0xff, {UTF8}",
    ),
    "generate_lone_surrogate": (
        lambda r: octlm.generate(r, ["ok", "\ud800"]),
        "prompt[1]='\\ud800' holds a lone surrogate",
    ),
    "generate_nul": (lambda r: octlm.generate(r, "a\x00"), "prompt='a\\x00' holds a NUL character"),
    "generate_temperature_inf": (
        lambda r: octlm.generate(r, "a", temperature=float("inf")),
        "--temperature inf",
    ),
    "generate_count_bool": (
        lambda r: octlm.generate(r, "a", max_new_tokens=True),
        "max_new_tokens=True must",
    ),
    "chat_not_a_list": (lambda r: octlm.chat(r, "hello"), MESSAGES_LIST),
    "chat_a_dict": (lambda r: octlm.chat(r, {"role": "user", "content": "hi"}), MESSAGES_LIST),
    "chat_empty": (lambda r: octlm.chat(r, []), MESSAGES_LIST),
    "chat_none": (lambda r: octlm.chat(r, None), MESSAGES_LIST),
    "chat_item_a_string": (
        lambda r: octlm.chat(r, ["hi"]),
        "message 1 is not an object with a role and a content",
    ),
    "chat_item_without_content": (
        lambda r: octlm.chat(r, [{"role": "user"}]),
        "message 1 is not an object with",
    ),
    "chat_item_without_role": (
        lambda r: octlm.chat(r, [{"content": "hi"}]),
        "message 1 is not an object with",
    ),
    "chat_unknown_role": (
        lambda r: octlm.chat(r, [{"role": "bot", "content": "hi"}]),
        "message 1 has role 'bot'; use one of system, user, assistant",
    ),
    "chat_role_a_list": (
        lambda r: octlm.chat(r, [{"role": ["user"], "content": "hi"}]),
        "has role ['user']",
    ),
    "chat_content_int": (
        lambda r: octlm.chat(r, [{"role": "user", "content": 3}]),
        "its content is a int, not a string",
    ),
    "chat_content_none": (
        lambda r: octlm.chat(r, [{"role": "user", "content": None}]),
        "its content is a NoneType",
    ),
    "chat_content_surrogate": (
        lambda r: octlm.chat(r, [{"role": "user", "content": "\ud800"}]),
        "message 1 holds a lone surrogate",
    ),
    "chat_content_nul": (
        lambda r: octlm.chat(r, [{"role": "user", "content": "a\x00"}]),
        "messages[0]['content']='a\\x00' holds a NUL",
    ),
    "chat_ends_with_a_reply": (
        lambda r: octlm.chat(
            r, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ho"}]
        ),
        "messages end with the assistant's turn: the model replies to a user turn",
    ),
    "chat_system_alone": (
        lambda r: octlm.chat(r, [{"role": "system", "content": "Speak."}]),
        "end with the system's turn",
    ),
    "chat_temperature_nan": (
        lambda r: octlm.chat(r, [{"role": "user", "content": "hi"}], temperature=float("nan")),
        "--temperature nan",
    ),
}

# Accepted before and still: exit 0. (arguments after the run, what stdout holds)
STILL_ACCEPTED = {
    "empty_prompt_samples_from_the_start": (["--prompt", ""], ""),
    "prompt_longer_than_the_context": (["--prompt", "Who goes there? " * 40], "Who goes there? "),
    "prompts_of_json_are_text": (["--prompts", "json.txt"], '"prompt": "3"'),
    "prompts_with_bom_and_crlf": (["--prompts", "crlf.txt"], '{"prompt": "Who goes there?", '),
    "temperature_below_float32": (["--prompt", "a", "--temperature", "1e-320"], "a"),
    "top_k_past_the_vocabulary": (
        ["--prompt", "a", "--top-k", str(10**30), "--temperature", "1"],
        "a",
    ),
    "seed_negative": (["--prompt", "a", "--seed", "-5", "--temperature", "1"], "a"),
}

FILES = {
    "bad.txt": b"fine\nab\xffc\n",
    "surrogate.txt": b"a\xed\xa0\x80b\n",
    "cut.txt": b"caf\xc3",
    "nul.txt": b"one\ntwo\nth\x00ree\n",
    "utf16.txt": "one\ntwo\n".encode("utf-16-le"),
    "utf16bom.txt": "one\n".encode("utf-16"),
    "empty.txt": b"",
    "blank.txt": b"\n  \n\t\r\n",
    "json.txt": b'{"prompt": "x"}\n3\nnull\n[1, 2]\n',
    "crlf.txt": b"\xef\xbb\xbfWho goes there?\r\nBernardo?\r\n",
}


@pytest.fixture(scope="session")
def chat_run(tmp_path_factory) -> Path:
    """The random micro model of a tiny chat dataset; read-only."""
    return shared(tmp_path_factory, "text_chat_run", make_chat_run) / "run"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "folder").mkdir()
    return tmp_path


def refused(outcome: Outcome, expected: str) -> None:
    """A refusal as the house refuses (`harness.problems`: a non-zero exit, one stderr line
    `octlm: error: ...`, no traceback, nothing on disk changed) that says `expected`."""
    assert outcome.code != 0 and not problems(outcome), (outcome.err, outcome.crash)
    lines = outcome.err.splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert "; " in lines[0]  # a problem, then its fix


@pytest.mark.parametrize("case", GENERATE, ids=GENERATE)
def test_bad_text_for_generate_is_one_line(case, chat_run, workdir) -> None:
    args, expected = GENERATE[case]
    refused(run_cli(["generate", str(chat_run), *args], workdir), expected)


@pytest.mark.parametrize("case", CHAT, ids=CHAT)
def test_bad_text_for_chat_is_one_line(case, chat_run, workdir) -> None:
    args, stdin, expected = CHAT[case]
    command = ["chat", str(chat_run), "--max-new-tokens", "2", *args]
    refused(run_cli(command, workdir, stdin=stdin), expected)


@pytest.mark.parametrize("case", CLEAN_ENDS, ids=CLEAN_ENDS)
def test_a_chat_ends_cleanly(case, chat_run, workdir) -> None:
    stdin, flags, shown = CLEAN_ENDS[case]
    command = ["chat", str(chat_run), "--max-new-tokens", "2", *flags]
    outcome = run_cli(command, workdir, stdin=stdin)
    assert (outcome.code, outcome.err, outcome.crash, outcome.changed) == (0, "", None, [])
    assert shown in outcome.out, outcome.out[-300:]


def test_a_closed_stdin_is_the_end_of_the_chat(chat_run, workdir, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", None)  # what Python makes of `octlm chat RUN <&-`
    assert main(["chat", str(chat_run)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("case", API, ids=API)
def test_bad_text_for_the_api_is_one_line(case, chat_run, workdir) -> None:
    call, expected = API[case]
    before = snapshot(workdir)
    with pytest.raises(OctlmError) as info:
        call(chat_run)
    message = str(info.value)
    assert expected in message and "\n" not in message and info.value.fix, message
    assert snapshot(workdir) == before


@pytest.mark.parametrize("case", STILL_ACCEPTED, ids=STILL_ACCEPTED)
def test_odd_text_that_works_still_does(case, chat_run, workdir) -> None:
    args, shown = STILL_ACCEPTED[case]
    outcome = run_cli(["generate", str(chat_run), "--max-new-tokens", "2", *args], workdir)
    assert (outcome.code, outcome.crash) == (0, None)
    if case == "prompt_longer_than_the_context":  # a note says so (the window slides)
        note = "note: the prompt is 201 tokens, which alone fills the model's context of 32"
        assert outcome.err.startswith(note) and outcome.err.count("\n") == 1, outcome.err
    else:
        assert outcome.err == ""
    assert shown in outcome.out, outcome.out


def test_a_tiny_temperature_is_greedy(chat_run, workdir, capsys) -> None:
    texts = []
    for t in ("0", "1e-320"):
        assert main(["generate", str(chat_run), "--prompt", "Who", "--temperature", t]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1]


def test_the_api_takes_a_good_conversation(chat_run) -> None:
    turns: list[Any] = [{"role": "system", "content": "Speak."}, {"role": "user", "content": ""}]
    assert isinstance(octlm.chat(chat_run, turns, max_new_tokens=2), str)


def screen_of(socket: str) -> str:
    proc = subprocess.run(
        ["tmux", "-L", socket, "capture-pane", "-p", "-J", "-t", "chat"],
        capture_output=True,
        text=True,
    )
    return proc.stdout


@pytest.mark.slow  # starts python -m octlm in a terminal
def test_a_terminal_line_that_is_not_utf8_is_refused_and_ctrl_d_ends(chat_run, tmp_path) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: this test needs a real terminal (apt install tmux)")
    socket, status = f"octlm-text-{time.monotonic_ns()}", tmp_path / "status"
    command = shlex.join(
        [sys.executable, "-m", "octlm", "chat", str(chat_run), "--max-new-tokens", "2"]
    )
    shell = f"{command}; echo EXIT=$? > {shlex.quote(str(status))}; sleep 60"
    tmux = ["tmux", "-L", socket]
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "200", "-y", "50", "-s", "chat", shell], check=True
    )
    try:
        wait(lambda: screen_of(socket).count("you> ") == 1, socket)
        subprocess.run([*tmux, "send-keys", "-t", "chat", "-H", "61", "ff", "62", "0d"], check=True)
        wait(lambda: screen_of(socket).count("you> ") == 2, socket)
        screen = screen_of(socket)
        assert f"octlm: error: chat line 1 holds the byte 0xff, {UTF8}" in screen, screen
        subprocess.run([*tmux, "send-keys", "-t", "chat", "Who goes there?", "Enter"], check=True)
        wait(lambda: screen_of(socket).count("you> ") == 3, socket)
        subprocess.run([*tmux, "send-keys", "-t", "chat", "C-d"], check=True)
        wait(status.exists, socket)
        assert status.read_text().strip() == "EXIT=0"
        assert "Traceback" not in screen_of(socket) and "model> " in screen_of(socket)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


def wait(done, socket: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if done():
            return
        time.sleep(0.1)
    raise AssertionError(f"not done in {timeout:.0f} s; the screen:\n{screen_of(socket)}")
