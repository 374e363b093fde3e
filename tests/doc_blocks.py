"""Running a doc's ```bash blocks as written: the blocks of one section, a bin folder whose
commands are this interpreter's modules, and bash with `-euo pipefail` in a given folder.

Test modules import from here, never from each other.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import shim_server
from tests.shared import shared


def section_blocks(doc: Path, heading: str, lang: str = "bash") -> list[str]:
    """The ```lang blocks between the `## heading` line and the next `## ` heading."""
    section = doc.read_text(encoding="utf-8").split(f"\n## {heading}\n", 1)[1]
    return re.findall(rf"```{lang}\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)


def shim(folder: Path, *modules: str, python: bool = False) -> Path:
    """A new bin folder under `folder` where each command `m` is this interpreter's `-m m`, so a
    block's `octlm` is this checkout's, whatever else is on PATH (forked from a server that has
    done the imports, tests/shim_server.py); with `python`, the block's `python` is this
    interpreter too."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    commands = {module: f"-m {module} " for module in modules}
    if python:
        commands["python"] = ""
    scripts = {
        name: f'#!/bin/sh\nexec "{sys.executable}" {args}"$@"\n' for name, args in commands.items()
    }
    if "octlm" in modules:  # started as the other tests' commands are, when it can be
        scripts["octlm"] = shim_server.client_script() or scripts["octlm"]
    for name, text in scripts.items():
        script = bin_dir / name
        script.write_text(text)
        script.chmod(0o755)
    return bin_dir


def shim_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    """This process's environment with `bin_dir` first on PATH, and `extra` set."""
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **extra}


def run_block(block: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `block` by bash in `cwd`; a failure names the block and the end of its stderr."""
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"{block}\n{result.stderr[-3000:]}"
    return result


def commands(block: str) -> list[str]:
    """`block`'s lines joined into bash's logical lines (a line ending in a backslash continues
    on the next); a heredoc's lines stay lines of their own."""
    joined: list[str] = []
    for line in block.splitlines(keepends=True):
        if joined and joined[-1].endswith("\\\n"):
            joined[-1] += line
        else:
            joined.append(line)
    return joined


KNOB = re.compile(r"^(\w+=\$\{\w+:-[^}]*\}\s*)+$")
"""A walkthrough's line of knobs: `BASE_STEPS=${BASE_STEPS:-200} BATCH=${BATCH:-16}`."""


def run_walkthrough(
    block: str, head: int, work: Path, env: dict[str, str], factory: pytest.TempPathFactory
) -> subprocess.CompletedProcess[str]:
    """`run_block(block, work, env)` where the block's first `head` commands (after its knob
    lines) run once per session for every walkthrough that starts with the same commands at the
    same knob values (docs/chat.md's and docs/rl.md's prepare and base run, docs/finetune.md's
    prepare): as written, by bash, in an empty folder, which is then copied to `work` (empty)
    before the rest of the block runs there with the knobs set again. Returns the rest's run."""
    lines = commands(block)
    knobs = [line for line in lines if KNOB.match(line)]
    body = [line for line in lines if not KNOB.match(line)]
    folder = prefix_folder(knobs, body[:head], env, factory)
    shutil.copytree(folder, work, dirs_exist_ok=True, symlinks=True)
    return run_block("".join(knobs + body[head:]), work, env)


def prefix_folder(
    knobs: list[str], head: list[str], env: dict[str, str], factory: pytest.TempPathFactory
) -> Path:
    """The folder that `head` leaves, run after `knobs` in an empty folder (the first commands
    but the last: a copy of their own folder), once per session for the same commands and the
    same values of the variables they name."""
    if not head:
        return shared(factory, "walkthrough-empty", lambda folder: None)
    names = sorted(set(re.findall(r"\$\{?(\w+)", "".join(head))))
    echo = "".join(knobs) + "".join(f'printf "%s\\n" "${name}"\n' for name in names)
    values = run_block(echo, Path.cwd(), env).stdout.splitlines()
    key = hashlib.sha256(json.dumps([head, names, values]).encode()).hexdigest()[:16]

    def build(folder: Path) -> None:
        shutil.copytree(prefix_folder(knobs, head[:-1], env, factory), folder, dirs_exist_ok=True)
        run_block("".join(knobs + head[-1:]), folder, env)

    return shared(factory, f"walkthrough-{key}", build)
