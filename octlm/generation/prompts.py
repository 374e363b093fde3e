"""The text that comes into the generation side, checked where it enters and before a model
loads: a prompt (`--prompt`, `octlm.generate`), a prompts file (`--prompts`), the `--system`
turn, a line typed into `octlm chat`, and the turns given to `octlm.chat`.

A text must be a string of Unicode characters that UTF-8 can write: no lone surrogate (what a
byte that is not UTF-8 becomes in a command-line argument or a terminal line decoded with
`surrogateescape`, or a JSON `"\\ud800"`), and no NUL character (a prompts file holding one is
UTF-16 or binary, not the UTF-8 text it should be). Anything else is refused in one line that
names where the text came from and the offending character. Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from octlm.config.checks import check_path, shown
from octlm.data.chat_format import NO_SPECIALS, USER, Message, parse_messages
from octlm.errors import OctlmError

UNFIT = re.compile("[\x00\ud800-\udfff]")
"""A NUL or a lone surrogate: what UTF-8 text for a model cannot hold."""
ESCAPED_BYTES = range(0xDC80, 0xDD00)
"""Where `surrogateescape` puts the bytes it could not decode (0x80..0xff)."""
PROMPTS_FIX = "give a UTF-8 text file with one prompt a line"


def text_problem(text: str) -> str | None:
    """What makes `text` unfit for a tokenizer, in words ("holds the byte 0xff, which is not
    UTF-8 (character 3)"); None when it is fit."""
    found = UNFIT.search(text)
    if found is None:
        return None
    char, at = found.group(), found.start() + 1
    if char == "\x00":
        return f"holds a NUL character (character {at})"
    if ord(char) in ESCAPED_BYTES:
        return f"holds the byte {ord(char) - 0xDC00:#04x}, which is not UTF-8 (character {at})"
    return f"holds a lone surrogate U+{ord(char):04X} (character {at})"


def given(label: str, value: Any) -> str:
    """`--flag VALUE` for a flag, `name=VALUE` for an argument, as `config.checks` writes them."""
    return f"{label} {shown(value)}" if label.startswith("--") else f"{label}={shown(value)}"


def check_text(label: str, value: Any, fix: str) -> str:
    """`value` if it is a string fit for the tokenizer, else a one-line `OctlmError`."""
    if not isinstance(value, str):
        raise OctlmError(f"{given(label, value)} is a {type(value).__name__}, not a string", fix)
    found = text_problem(value)
    if found is not None:
        raise OctlmError(f"{given(label, value)} {found}", fix)
    return value


def check_prompts(prompt: Any) -> list[str]:
    """`octlm.generate`'s prompt: a string, or a non-empty list of them; each fit."""
    prompts = prompt if isinstance(prompt, list) else [prompt]
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise OctlmError(
            f"prompt={shown(prompt)} must be a string or a list of them", "pass the text"
        )
    fix = "pass UTF-8 text without NUL characters"
    if not isinstance(prompt, list):
        return [check_text("prompt", prompt, fix)]
    return [check_text(f"prompt[{i}]", p, fix) for i, p in enumerate(prompts)]


def check_system(system: Any) -> str | None:
    """`--system`: None (no system turn) or a text that is not blank."""
    if system is None:
        return None
    check_text("--system", system, "pass the system turn as UTF-8 text")
    if not system.strip():
        raise OctlmError(
            f"--system {shown(system)} is blank", "leave --system out for no system turn"
        )
    return system


def check_turns(messages: Any) -> tuple[Message, ...]:
    """`octlm.chat`'s messages: a list of {"role", "content"} turns (`parse_messages`), each
    content fit, the last one the user's turn that the model replies to."""
    turns = parse_messages(messages, "messages", NO_SPECIALS, need_reply=False)
    for i, turn in enumerate(turns):
        check_text(f"messages[{i}]['content']", turn.content, "fix that turn")
    if turns[-1].role != USER:
        raise OctlmError(
            f"messages end with the {turns[-1].role}'s turn: the model replies to a user turn",
            "end the list with the user turn to reply to",
        )
    return turns


def read_prompts(path: str) -> list[str]:
    """The prompts of a UTF-8 text file, one a line (a line ends at "\\n", a "\\r" before it is
    dropped, as is a byte-order mark at the start); blank lines are skipped. Plain text, not
    JSON: a line is the prompt as it stands."""
    data = read_bytes(path)
    if b"\x00" in data:
        line = data.count(b"\n", 0, data.index(b"\x00")) + 1
        unreadable(path, f"line {line} holds a NUL byte (a UTF-16 or binary file?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        unreadable(path, f"line {line} is not UTF-8 (byte {data[exc.start]:#04x})")
    lines = (line.removesuffix("\r") for line in text.removeprefix("\ufeff").split("\n"))
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise OctlmError(f"--prompts {named(path)} holds no prompt", PROMPTS_FIX)
    return prompts


def named(path: str) -> str:
    """A path as an error line shows it: whole, or as its repr where it holds a character that
    would break the line (a newline, a byte that is not UTF-8)."""
    return path if path.isprintable() else repr(path)


def unreadable(path: str, why: str) -> NoReturn:
    raise OctlmError(f"--prompts {named(path)} cannot be read: {why}", PROMPTS_FIX)


def read_bytes(path: str) -> bytes:
    """The bytes of the `--prompts` file, or a one-line error saying why not."""
    check_path("--prompts", path)
    file = Path(path)
    if file.is_dir():
        unreadable(path, "it is a folder")
    try:
        return file.read_bytes()
    except FileNotFoundError:
        unreadable(path, "it does not exist")
    except OSError as exc:
        unreadable(path, str(exc.strerror or exc))


def check_line(number: int, line: str, interactive: bool) -> None:
    """A line read by `octlm chat` (its `number`, from 1); at a terminal the fix is to type it
    again, and the chat goes on."""
    found = text_problem(line)
    if found is not None:
        fix = "type it again as UTF-8 text" if interactive else "send UTF-8 text, one turn a line"
        raise OctlmError(f"chat line {number} {found}", fix)


def fit_prompts(prompts: Sequence[str]) -> None:
    """The library's own guard (`generate_texts`): a one-line error, never a TypeError from the
    tokenizer, whichever door a prompt came by."""
    for i, p in enumerate(prompts):
        check_text(f"prompt[{i}]", p, "pass UTF-8 text without NUL characters")
