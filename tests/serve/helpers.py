"""What the server tests share: `octlm serve` started as a process on a free loopback port,
raw HTTP to it, and the tiny chat fine-tune it serves. Test modules import from here, never
from each other."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KEY = "test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(run: Path, *flags: str) -> Iterator[str]:
    """`octlm serve RUN FLAGS` on a free loopback port until the block ends; its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "octlm", "serve", str(run), "--port", str(port), *flags]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"octlm serve exited {proc.returncode}: {proc.stderr.read()}")
            with contextlib.suppress(OSError):
                if request(url, "GET", "/health")[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError("octlm serve did not answer /health in 120 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | dict | None = None,
    key: str | None = None,
    headers: dict | None = None,
) -> tuple[int, dict]:
    """One raw HTTP request: (status, the JSON body)."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    sent = {"Content-Type": "application/json", **(headers or {})}
    if key:
        sent["Authorization"] = f"Bearer {key}"
    try:
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def tiny_run(tiny_dataset: Path, tmp_path_factory) -> Path:
    """The tiny model after one step at context 256 (replies of hundreds of tokens fit, and
    rarely end early), trained once per session. Read-only."""
    from tests.e2e.helpers import octlm
    from tests.shared import shared

    def build(root: Path) -> None:
        octlm("train", "--model", "tiny", "--data", str(tiny_dataset), "--out", str(root / "run"),
              "--steps", "1", "--warmup", "0", "--context", "256", "--micro-batch", "1",
              "--accum", "1", "--val-every", "0", "--dtype", "fp32", "--no-progress")  # fmt: skip

    return shared(tmp_path_factory, "serve_tiny_run", build) / "run"
