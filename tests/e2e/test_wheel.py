"""The wheel: built from a copy of the sources, installed into a fresh venv, and `octlm train
--config tiny` run in an empty folder outside the checkout, so every file a run needs (the
shipped configs, the embedded corpus, the report's assets) is shown to be in the package.

Installing torch into the fresh venv would take minutes, so the venv borrows the dependencies of
the interpreter running the tests through a `.pth` line, written only after pip has installed
the wheel (pip would otherwise see the test venv's own octlm there); octlm itself must come
from the wheel, which the run checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from octlm.runlog.reader import read_log

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What the build reads: a copy, so no build/ or egg-info is left in (or reused from) the checkout.
SOURCES = ("pyproject.toml", "README.md", "octlm")
PROBE = "import json, sys, octlm; print(json.dumps({'file': octlm.__file__, 'path': sys.path}))"


def run(*cmd: str | Path, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check")
    run(*pip, "wheel", src, "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist")
    (wheel,) = (tmp / "dist").glob("octlm-*.whl")
    return wheel


def fresh_venv(tmp: Path, wheel: Path) -> Path:
    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check", "--python")
    run(*pip, venv / "bin" / "python", "install", "--no-deps", "--no-index", "-q", wheel)
    site = run(
        venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    )
    deps = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    Path(site.stdout.strip(), "octlm-deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    return venv


def test_the_wheel_trains_tiny_by_name_in_an_empty_folder(tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path, build_wheel(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"  # `octlm` is the wheel's script
    probe = json.loads(run(venv / "bin" / "python", "-c", PROBE, cwd=work, env=env).stdout)
    assert Path(probe["file"]).is_relative_to(venv)
    # The checkout is not on the path, and no entry but the venv's holds an octlm package (in
    # CI the borrowed site-packages is the checkout's .venv: inside ROOT, but without octlm).
    entries = [Path(p or work).resolve() for p in probe["path"]]
    assert ROOT not in entries
    assert [p for p in entries if (p / "octlm").is_dir()] == [Path(probe["file"]).parents[1]]
    flags = ("--steps", "3", "--warmup", "1", "--val-every", "0", "--no-progress")
    run("octlm", "train", "--config", "tiny", "--out", "run", *flags, cwd=work, env=env)
    log = read_log(work / "run")
    assert log[0]["config"]["model"] == "tiny" and log[-1]["type"] == "end"
    assert sorted(p.name for p in work.iterdir()) == ["run"]  # nothing written beside the run
    run("octlm", "report", "run", "-o", "report.html", cwd=work, env=env)
    assert "day1-overfit" in (work / "report.html").read_text()  # a shipped preset, not the run


def test_the_wheel_ships_the_chat_page(tmp_path: Path) -> None:
    """`octlm serve`'s page at `/` is package data, read beside octlm/serve/app.py."""
    with zipfile.ZipFile(build_wheel(tmp_path)) as wheel:
        assert "octlm/serve/page.html" in wheel.namelist()
