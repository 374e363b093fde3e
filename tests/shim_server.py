"""A doc block's `octlm`, started as the suite's other commands are: forked from a server that
has done the imports (tests/octlm_process.py), reached over a Unix socket.

A walkthrough test runs its doc's bash blocks as written, and each `octlm` in them was a fresh
`python -m octlm` that imported torch again (2 to 3 s of a short command; a walkthrough runs
ten or more). Here the block's `octlm` is a small client script that imports no torch: it hands
the server its arguments, environment and working folder, and its standard streams themselves
(the descriptors, so a pipe, a redirection or a heredoc reaches the command as it would reach a
fresh process), then exits with the command's code. The server forks a handler per connection
(commands of one pipeline run at once), and the handler forks the command, as
tests/octlm_process.py's server does, and answers its pid, then its exit status (a command
ended by a signal ends its client by the same signal).

A client whose import-time settings (tests/octlm_process.py `IMPORT_TIME`) differ from the
server's, or any client when OCTLM_TEST_FRESH=1, or one that finds no server, runs a real
`python -m octlm` instead.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests import octlm_process

CLIENT = """#!{python} -S
import json, os, signal, socket, sys

def fresh():
    os.execv({python!r}, [{python!r}, "-m", "octlm", *sys.argv[1:]])

env = dict(os.environ)
now = {{k: v for k, v in env.items() if k.startswith({prefixes!r})}}
if env.get("OCTLM_TEST_FRESH") == "1" or now != {server_env!r}:
    fresh()
conn = socket.socket(socket.AF_UNIX)
try:
    conn.connect({address!r})
    request = {{"args": sys.argv[1:], "env": env, "cwd": os.getcwd()}}
    request["client"] = os.path.abspath(sys.argv[0])  # the command's own runs start here too
    socket.send_fds(conn, [json.dumps(request).encode() + b"\\n"], [0, 1, 2])
except OSError:
    fresh()
answers = conn.makefile("rb")
if not answers.readline():  # the command's pid; none: the server has gone
    fresh()
code = int(answers.readline() or b"1")
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""
"""The client: written into a shim's bin folder as `octlm`, for the server then running."""

_server: subprocess.Popen | None = None
_server_env: dict[str, str] = {}
_address = ""
_starting = threading.Lock()


def client_script() -> str | None:
    """The `octlm` client of a running server whose import-time settings are this process's
    (started, or replaced, here); None when OCTLM_TEST_FRESH=1."""
    global _server, _server_env, _address
    if os.environ.get("OCTLM_TEST_FRESH") == "1":
        return None
    now = octlm_process.import_time(dict(os.environ))
    if _server is not None and (_server.poll() is not None or now != _server_env):
        _stop(_server)
        _server = None
    if _server is None:
        _server_env = now
        _address = str(Path(tempfile.mkdtemp(prefix="octlm-shim-")) / "socket")
        code = f"from tests.shim_server import serve; serve({_address!r})"
        _server = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, cwd=octlm_process.ROOT
        )
        while not Path(_address).exists() and _server.poll() is None:  # listening: in ms
            time.sleep(0.01)
    return CLIENT.format(
        python=sys.executable,
        prefixes=octlm_process.IMPORT_TIME,
        server_env=_server_env,
        address=_address,
    )


def client_path() -> str | None:
    """`client_script()` written to an executable file in the server's folder (None when
    OCTLM_TEST_FRESH=1); a test's threads may ask at once."""
    with _starting:
        script = client_script()
        if script is None:
            return None
        path = Path(_address).parent / "octlm"
        if not path.exists() or path.read_text() != script:
            path.write_text(script)
            path.chmod(0o755)
        return str(path)


def _stop(server: subprocess.Popen) -> None:
    """End a server: it leaves its loop when its input closes (running commands go on)."""
    assert server.stdin is not None
    server.stdin.close()
    server.wait()


def serve(address: str) -> None:
    """The server: import, listen at `address`, and fork a handler per connection, until its
    input closes (the test process has ended, or replaced it)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address)
    listener.listen(64)  # a client that comes during the imports waits for them
    octlm_process.load()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps ended handlers
    with selectors.DefaultSelector() as ready:
        ready.register(listener, selectors.EVENT_READ)
        ready.register(sys.stdin, selectors.EVENT_READ)
        while all(key.fileobj is listener for key, _ in ready.select()):
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                _handle(conn)
            conn.close()
    listener.close()
    shutil.rmtree(Path(address).parent, ignore_errors=True)  # its own folder


def _handle(conn: socket.socket) -> None:
    """In a handler: read the request and its three descriptors, fork the command, answer its
    pid and then its exit status (negative: the signal that ended it); never return."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the command's own children are waited for
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 16)
        if not more:
            os._exit(1)
        data += more
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        args, env, cwd, client = (request[k] for k in ("args", "env", "cwd", "client"))
        octlm_process.become_octlm(args, env, cwd, client)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)
