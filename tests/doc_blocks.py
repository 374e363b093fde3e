"""Running a doc's ```bash blocks as written: the blocks of one section, a bin folder whose
commands are this interpreter's modules, and bash with `-euo pipefail` in a given folder.

Test modules import from here, never from each other.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests import shim_server


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
