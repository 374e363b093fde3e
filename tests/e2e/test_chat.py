"""Chat end to end: conversations prepared with `--format chat`, a fine-tune that resumes
exactly on them, `octlm chat` driven in a real terminal (tmux), and the export's template.

The conversations are cut from the embedded plays (each speech's first line, turns
alternating user/assistant, a system turn on every other one) and tokenized with the
session's tiny tokenizer. The terminal test types into `octlm chat` with `tmux send-keys` and
reads the screen with `capture-pane`; the replies it expects come from a `ChatSession` in this
process driven with the same turns, which runs the same computations in the same order.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from octlm.data.chat_format import JINJA_TEMPLATE
from octlm.generation.chat import ChatSession
from octlm.generation.trained import load_model, run_tokenizer
from octlm.prepare.corpus import embedded_documents
from tests.e2e.helpers import end_hash, octlm, steps_of
from tests.shared import shared

pytestmark = pytest.mark.slow

STEPS, CONTEXT = 8, 64


def conversations(limit: int) -> list[dict]:
    rows = []
    for work in sorted(embedded_documents(), key=lambda d: d.id):
        lines = [s.split("\n")[1][:24] for s in work.text.split("\n\n") if s.count("\n") >= 1]
        lines = [line.strip() for line in lines if line.strip()]
        for i in range(0, len(lines) - 4, 4):
            turns = [{"role": "system", "content": "Speak."}] if (i // 4) % 2 else []
            turns += [
                {"role": ("user", "assistant")[j % 2], "content": line}
                for j, line in enumerate(lines[i : i + 4])
            ]
            rows.append({"messages": turns})
            if len(rows) == limit:
                return rows
    return rows


@pytest.fixture(scope="module")
def data(tiny_tokenizer, tmp_path_factory) -> Path:
    def build(root: Path) -> None:
        tiny_tokenizer.save(root / "tokenizer.json")
        tokenizer = str(root / "tokenizer.json")
        src = root / "talk.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in conversations(600)))
        octlm("prepare", str(src), "--format", "chat", "--tokenizer", tokenizer,
              "--context", str(CONTEXT), "--out", str(root / "chat"))  # fmt: skip
        # The control: the same turns as plain prompt/completion pairs would put every
        # earlier turn in the prompt; here, the whole conversation as one completion.
        pairs = root / "whole.jsonl"
        with pairs.open("w") as f:
            for r in conversations(600):
                text = "".join(f"{m['role']}\n{m['content']}\n" for m in r["messages"])
                f.write(json.dumps({"prompt": "", "completion": text}) + "\n")
        octlm("prepare", str(pairs), "--format", "prompt-completion", "--tokenizer",
              tokenizer, "--context", str(CONTEXT), "--out", str(root / "whole"))  # fmt: skip

    return shared(tmp_path_factory, "chat-data", build)


def args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--model", "micro", "--data", str(data), "--out", str(out),
        "--steps", str(STEPS), "--warmup", "2", "--lr", "3e-3", "--context", str(CONTEXT),
        "--micro-batch", "4", "--accum", "2", "--order", "epoch",
        "--val-every", "4", "--val-batches", "2", "--ckpt-every", "3", "--dtype", "fp32",
        "--no-progress", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory) -> Path:
    return (
        shared(
            tmp_path_factory,
            "chat-straight",
            lambda root: octlm(*args(data / "chat", root / "run")),
        )
        / "run"
    )


def test_prepare_summarises_the_turns_and_records_the_format(data) -> None:
    manifest = json.loads((data / "chat" / "manifest.json").read_text())
    assert manifest["chat_template"] == {"version": 1}
    assert manifest["loss_mask"]["format"] == "chat"
    train = manifest["splits"]["train"]
    assert train["assistant_turns"] == 2 * train["documents"]
    assert 0 < train["targets"] < train["tokens"] / 2  # user and system turns are context


def test_split_equals_straight_and_the_control_differs(data, straight, tmp_path) -> None:
    out = tmp_path / "split"
    assert "stopped at step 5" in octlm(*args(data / "chat", out, "--stop-at", "5")).stderr
    assert "resumed from" in octlm(*args(data / "chat", out, "--resume")).stderr
    assert end_hash(out) == end_hash(straight)
    assert steps_of(out) == steps_of(straight)
    control = tmp_path / "whole"
    octlm(*args(data / "whole", control))
    assert end_hash(control) != end_hash(straight)


def test_export_writes_the_template_only_for_a_chat_run(straight, tmp_path) -> None:
    octlm("export", str(straight), str(tmp_path / "hf"), "--format", "hf")
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == JINJA_TEMPLATE
    assert config["split_special_tokens"] is False


def test_chat_refuses_a_run_not_trained_on_chat_data(data, tmp_path) -> None:
    out = tmp_path / "whole-run"
    octlm(*args(data / "whole", out, "--steps", "2"))
    proc = octlm("chat", str(out), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "was not trained on a chat dataset" in proc.stderr


class Terminal:
    """A command in a detached tmux session on a private server: keys in, screen out."""

    def __init__(self, command: str, folder: Path) -> None:
        self.socket = f"octlm-test-{os.getpid()}-{time.monotonic_ns()}"
        self.status = folder / "status"
        shell = f"{command}; echo EXIT=$? > {shlex.quote(str(self.status))}; sleep 60"
        self.tmux("new-session", "-d", "-x", "200", "-y", "80", "-s", "chat", shell)

    def tmux(self, *args: str) -> str:
        proc = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", "chat")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "chat", *keys)

    def wait_for(self, test, what: str, timeout: float = 60.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            screen = self.screen()
            if test(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"no {what} in {timeout:.0f} s; the screen:\n{self.screen()}")

    def exit_status(self, timeout: float = 30.0) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end and not self.status.exists():
            time.sleep(0.1)
        return int(self.status.read_text().strip().removeprefix("EXIT="))

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def terminal(tmp_path):
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed: the chat test needs a real terminal (apt install tmux)")
    opened: list[Terminal] = []

    def start(command: str) -> Terminal:
        opened.append(Terminal(command, tmp_path))
        return opened[-1]

    yield start
    for t in opened:
        t.close()


def prompts(screen: str) -> int:
    return screen.count("you> ")


def chat_command(run: Path, *extra: str) -> str:
    return shlex.join([sys.executable, "-m", "octlm", "chat", str(run), *extra])


def trimmed(text: str) -> str:
    """As a terminal shows it: capture-pane drops the spaces that end a line."""
    return "\n".join(line.rstrip() for line in text.split("\n"))


def test_chat_in_a_terminal_keeps_the_history_and_exits_cleanly(straight, terminal) -> None:
    n = 12
    term = terminal(chat_command(straight, "--temperature", "0", "--max-new-tokens", str(n)))
    term.wait_for(lambda s: prompts(s) == 1, "first prompt")
    model, info = load_model(straight)
    session = ChatSession(model, run_tokenizer(info), max_new_tokens=n)
    replies = []
    for line in ("Who is there?", "Stand and unfold yourself."):
        term.keys("-l", line)
        term.keys("Enter")
        k = len(replies) + 2
        term.wait_for(lambda s, k=k: prompts(s) == k, f"prompt {k}")
        replies.append("".join(session.reply(line)))
    screen = term.screen()
    for line, reply in zip(("Who is there?", "Stand and unfold yourself."), replies, strict=True):
        assert trimmed(f"you> {line}\nmodel> {reply}\n") in screen, screen
    term.keys("/reset", "Enter")
    term.wait_for(lambda s: "(conversation forgotten)" in s and prompts(s) == 4, "reset")
    term.keys("C-d")
    assert term.exit_status() == 0
    assert "Traceback" not in term.screen()


def never_ends(run: Path, text: str) -> bool:
    """Whether the greedy reply to `text` is proven endless: past the context the next token is
    a function of the last CONTEXT tokens alone, so once those repeat with some period, the
    reply repeats them forever and never reaches EOS."""
    model, info = load_model(run)
    session = ChatSession(model, run_tokenizer(info), max_new_tokens=300, temperature=0)
    "".join(session.reply(text))
    reply = session.ids[-301:-1]
    if session.tokenizer.eos_id in reply:
        return False
    return any(reply[-CONTEXT - p :] == reply[-CONTEXT - 2 * p : -p] for p in range(1, 33))


def test_ctrl_c_stops_a_reply_and_then_ends_the_chat(straight, terminal) -> None:
    assert never_ends(straight, "Speak on."), "this reply ends: the test needs one that does not"
    term = terminal(chat_command(straight, "--temperature", "0", "--max-new-tokens", "1000000"))
    term.wait_for(lambda s: prompts(s) == 1, "first prompt")
    term.keys("-l", "Speak on.")
    term.keys("Enter")
    term.wait_for(lambda s: len(s.split("model> ")[-1].strip()) > 300, "a reply under way")
    term.keys("C-c")
    screen = term.wait_for(lambda s: prompts(s) == 2, "the prompt after Ctrl-C")
    assert "[stopped]" in screen
    term.keys("C-c")  # at the prompt: the end of the chat
    assert term.exit_status() == 0
    assert "Traceback" not in term.screen() and "KeyboardInterrupt" not in term.screen()
