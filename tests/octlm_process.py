"""`python -m octlm ARGS` for the tests, in a new process that starts with its imports done.

A `python -m octlm train` of the tiny model takes about 3.8 s, of which about 2.5 s is
importing torch and torch._dynamo (torch.optim imports it when the first optimizer is built);
the suite starts several hundred such processes. Here each command is still its own process
(its own pid, memory, signals and exit code; a resume is read by a process that never saw the
run that wrote it), forked from a server process that has imported those modules and run
nothing else: the state a fresh `python -m octlm` reaches once its imports are done. The child
runs octlm/__main__.py as `python -m octlm` does, with the arguments, environment, working
folder and standard streams the caller gives.

What a fresh interpreter reads only while it imports (thread, BLAS and CPU-kernel settings,
the allocator, Python's own flags) is the server's. A command whose environment differs from
the server's in any such variable runs as a real `python -m octlm` instead, and so does every
command when OCTLM_TEST_FRESH=1 (the whole suite the slow, plain way).

A command that launches runs of its own (`LAUNCHERS`: verify-resume's straight and split runs,
a sweep's, `rl --verify-split`'s, all through octlm/tools/subrun.py) launches each as the doc
walkthroughs' `octlm` is started: tests/shim_server.py's client, forked from that server (the
same fall-back to a real `python -m octlm`). So does a command asked for by a test's thread
while another thread's command runs (the server here forks one at a time).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from octlm.numerics import READ_AT_START
from octlm.trainer.forkstart import PRELOAD  # what a launcher's forkserver imports, in its order

IMPORT_TIME = (*READ_AT_START, "TORCH", "OCTLM_PINNED")
"""Prefixes of the variables a process reads while it imports (and never again): octlm's list
(octlm/numerics.py), and more broadly every TORCH* variable (inductor exports one in the test
process when a test compiles) and what octlm pinned."""
ROOT = Path(__file__).resolve().parent.parent

_server: subprocess.Popen | None = None
_server_env: dict[str, str] = {}
_busy = threading.Lock()
"""One command at a time per server: a caller's thread that finds it busy goes to the shim."""
LAUNCHERS = ("verify-resume", "sweep", "--verify-split")
"""Arguments of a command that launches runs of its own (octlm/tools/subrun.py)."""


def import_time(env: dict[str, str]) -> dict[str, str]:
    """The variables of `env` that a fresh process reads only while it imports."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME)}


def server_for(env: dict[str, str]) -> subprocess.Popen | None:
    """The running server, if a fresh process with `env` would make the imports it made. A
    server whose import-time settings this process no longer has is replaced: torch itself
    sets some in the test process (inductor exports TORCHINDUCTOR_CACHE_DIR when a test
    compiles), and every later command would otherwise start the slow way."""
    global _server, _server_env
    if os.environ.get("OCTLM_TEST_FRESH") == "1":
        return None
    now = import_time(dict(os.environ))
    if _server is not None and _server.poll() is None and now != _server_env:
        _stop(_server)
    if _server is None or _server.poll() is not None:
        _server_env = now  # what the server inherits
        _server = subprocess.Popen(
            [sys.executable, "-c", "from tests.octlm_process import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
    return _server if import_time(env) == _server_env else None


def _stop(server: subprocess.Popen) -> None:
    """End an idle server: it leaves its request loop when its input closes."""
    assert server.stdin is not None and server.stdout is not None
    server.stdin.close()
    server.wait()
    server.stdout.close()


def run(
    args: list[str],
    env: dict[str, str],
    cwd: str | os.PathLike | None = None,
    timeout: float | None = None,
    input: str | None = None,  # noqa: A002 (subprocess.run's name)
) -> subprocess.CompletedProcess:
    """`subprocess.run([python, -m, octlm, *args], capture_output=True, text=True, ...)`."""
    cmd = [sys.executable, "-m", "octlm", *args]
    if _busy.acquire(blocking=False):
        try:
            server = server_for(env)
            if server is not None:
                return _forked(server, cmd, args, env, cwd, timeout, input)
        finally:
            _busy.release()
    else:  # another thread's command is running: tests/shim_server.py forks them side by side
        client = _client() if timeout is None else None  # (a timeout must kill the command)
        cmd = [client, *args] if client else cmd
    return subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, input=input
    )


def _client() -> str | None:
    """tests/shim_server.py's client (imported here: that module imports this one)."""
    from tests import shim_server

    return shim_server.client_path()


def _forked(
    server: subprocess.Popen,
    cmd: list[str],
    args: list[str],
    env: dict[str, str],
    cwd: str | os.PathLike | None,
    timeout: float | None,
    input: str | None,  # noqa: A002
) -> subprocess.CompletedProcess:
    assert server.stdin is not None and server.stdout is not None
    with tempfile.TemporaryDirectory(prefix="octlm-fork-") as streams:
        out, err, stdin = (Path(streams) / name for name in ("out", "err", "in"))
        stdin.write_text(input or "")
        request = {"args": args, "env": env, "cwd": str(cwd or os.getcwd()), "client": None}
        request.update(stdin=str(stdin), out=str(out), err=str(err))
        if any(arg in LAUNCHERS for arg in args):
            request["client"] = _client()
        server.stdin.write((json.dumps(request) + "\n").encode())
        server.stdin.flush()
        pid = int(server.stdout.readline())
        with selectors.DefaultSelector() as waiting:
            waiting.register(server.stdout, selectors.EVENT_READ)
            timed_out = not waiting.select(timeout)
        if timed_out:  # as subprocess.run: kill it, then raise
            os.kill(pid, signal.SIGKILL)
        code = int(server.stdout.readline())
        if timed_out:
            raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(cmd, code, out.read_text(), err.read_text())


def load() -> None:
    """A server's start: the imports of a fresh `python -m octlm`, then what every command's
    parser reads from octlm's sources, the config fields' docstrings (kept by functools.cache):
    a forked command then skips that parse (0.06 s of its parser's 0.07 s here). A
    cache of the sources' text, the same for every command: nothing a command does differs."""
    for name in PRELOAD:
        importlib.import_module(name)
    from octlm.config.files import field_docs, rl_field_docs

    field_docs()
    rl_field_docs()


def serve() -> None:
    """The server: import, then fork one child per request line; answer its pid, then its
    exit code (negative: the signal that killed it, as subprocess reports it)."""
    load()
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    for line in requests:
        pid = os.fork()
        if pid == 0:
            _child(**json.loads(line))
        answers.write(f"{pid}\n".encode())
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        answers.flush()


def _child(
    args: list[str],
    env: dict[str, str],
    cwd: str,
    client: str | None,
    stdin: str,
    out: str,
    err: str,
) -> None:
    """In the forked process: become `python -m octlm ARGS` and never return."""
    for fd, path, flags in (
        (0, stdin, os.O_RDONLY),
        (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    become_octlm(args, env, cwd, client)


def become_octlm(args: list[str], env: dict[str, str], cwd: str, client: str | None) -> None:
    """In a process forked from a server, its descriptors 0, 1 and 2 already the command's:
    run `python -m octlm ARGS` with `env` in `cwd`, and exit with its code (never return).
    `client`: the path of a tests/shim_server.py client that starts the command's own runs."""
    if client is not None:
        launch_through(client)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
    sys.argv = ["-m", *args]  # run_module sets argv[0] to octlm/__main__.py, as -m does
    try:
        runpy.run_module("octlm", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # what the interpreter prints for an uncaught exception
        traceback.print_exc()
        code = 1
    from octlm.trainer.worker_exit import exit_without_finalising

    exit_without_finalising(code)  # what a normal exit does, bar the finalisation


def launch_through(client: str) -> None:
    """Make octlm/tools/subrun.py's `python -m octlm ARGS` the command line `client ARGS`."""
    from octlm.tools import subrun

    plain = subrun.train_argv

    def through_client(*args, **kwargs) -> list[str]:
        argv = plain(*args, **kwargs)
        return [client, *argv[3:]] if argv[:3] == [sys.executable, "-m", "octlm"] else argv

    subrun.train_argv = through_client


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1
