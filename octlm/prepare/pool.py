"""An ordered pool of worker processes (`python -m octlm.prepare.pool`), fed over pipes.

`ordered_map` hands item k to worker k mod N and takes the results back in item order, so a
caller that writes them in that order writes the same bytes for any N. Why not
`multiprocessing`: its spawn start re-runs the caller's `__main__` in every worker (a script
without a main guard, `python - <<EOF`, some notebooks then fail or hang), and fork copies a
process whose threads (HF's Rayon pool, tqdm's monitor) may hold locks. Here each worker is a
fresh interpreter that imports only the module a task names.

Workers ignore Ctrl-C: the main process decides, and cleans up. A worker that dies (killed, out
of memory) is a one-line error, never a hang; an error a task raises comes back and is raised
in the main process, an `OctlmError` as itself.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from importlib import import_module
from pathlib import Path
from typing import IO, Any, TypeVar

from octlm.errors import DataError, OctlmError

M = TypeVar("M")
_LENGTH = struct.Struct("<Q")
_DIED = object()
DIED_PROBLEM = "a worker process of `octlm prepare` died (killed, or out of memory)"


def ordered_map(
    fn: Callable[[Any], Any],
    items: Iterable[tuple[M, Any]],
    *,
    workers: int,
    initializer: Callable[..., None] | None = None,
    initargs: tuple[Any, ...] = (),
    local: Callable[[Any], Any] | None = None,
    on_exit: Callable[[list[float]], None] | None = None,
) -> Iterator[tuple[M, Any]]:
    """(meta, fn(payload)) for each (meta, payload) of `items`, in order. One worker: `local`
    (or `fn`) runs here, with no process. More: each worker holds at most 2 items at a time,
    so memory stays bounded whatever the input size. `fn` and `initializer` are module-level
    functions (a worker imports them by name). `on_exit` hears each worker's peak RSS in MB
    once all items are done."""
    if workers <= 1:
        run = local or fn
        for meta, payload in items:
            yield meta, run(payload)
        return
    with _Workers(workers) as pool:
        if initializer is not None:
            for w in range(workers):
                pool.send(w, ("init", *_name(initializer), initargs))
        pending: deque[tuple[M, int]] = deque()
        for k, (meta, payload) in enumerate(items):
            if len(pending) >= 2 * workers:
                yield _take(pool, pending)
            pool.send(k % workers, ("task", *_name(fn), payload))
            pending.append((meta, k % workers))
        while pending:
            yield _take(pool, pending)
        if on_exit is not None:
            on_exit([peak_rss_mb(proc.pid) for proc in pool.procs])


def peak_rss_mb(pid: int | str = "self") -> float:
    """A process's own peak resident set (VmHWM), in MB; 0 where /proc does not say. Unlike
    getrusage's ru_maxrss it does not include what the process inherited before its exec."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _name(fn: Callable[..., Any]) -> tuple[str, str]:
    return fn.__module__, fn.__qualname__


def _take(pool: _Workers, pending: deque[tuple[M, int]]) -> tuple[M, Any]:
    meta, w = pending.popleft()
    return meta, pool.receive(w)


class _Workers:
    """N worker processes, a reader thread each (so a worker never blocks writing a result while
    the main process writes it a task), and their result queues."""

    def __init__(self, n: int) -> None:
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}  # one core each: N of them
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "octlm.prepare.pool"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            for _ in range(n)
        ]
        self.results: list[queue.Queue[Any]] = [queue.Queue() for _ in range(n)]
        self.inits = [0] * n  # init messages whose answer is still to be read
        for proc, results in zip(self.procs, self.results, strict=True):
            threading.Thread(target=_read_all, args=(proc.stdout, results), daemon=True).start()

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError):  # a dead worker's pipe
                proc.stdin.close()  # type: ignore[union-attr]
            if exc[0] is not None and proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def send(self, w: int, message: tuple[Any, ...]) -> None:
        if message[0] == "init":
            self.inits[w] += 1
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            stdin = self.procs[w].stdin
            stdin.write(_LENGTH.pack(len(data)) + data)  # type: ignore[union-attr]
            stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            raise DataError(
                DIED_PROBLEM, "run it again; with little memory, pass fewer --workers"
            ) from None

    def receive(self, w: int) -> Any:
        while True:
            answer = self.results[w].get()
            if answer is _DIED:
                raise DataError(
                    DIED_PROBLEM, "run it again; with little memory, pass fewer --workers"
                )
            kind, value = answer
            if kind == "octlm":  # the same error class, so callers may catch it as usual
                module, name, problem, fix = value
                raise getattr(import_module(module), name)(problem, fix)
            if kind == "error":
                raise RuntimeError(f"a worker process failed:\n{value}")
            if self.inits[w]:
                self.inits[w] -= 1
                continue
            return value


def _died() -> DataError:
    return DataError(DIED_PROBLEM, "run it again; with little memory, pass fewer --workers")


def _read_exactly(stream: IO[bytes], n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def _read_all(stream: IO[bytes], results: queue.Queue[Any]) -> None:
    while (head := _read_exactly(stream, _LENGTH.size)) is not None:
        body = _read_exactly(stream, _LENGTH.unpack(head)[0])
        if body is None:
            break
        results.put(pickle.loads(body))
    results.put(_DIED)


def _serve() -> None:
    """A worker: run each message's function, answer ("ok", result) or the error."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    inbox, outbox = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the answers
    while (head := _read_exactly(inbox, _LENGTH.size)) is not None:
        body = _read_exactly(inbox, _LENGTH.unpack(head)[0])
        if body is None:
            return
        kind, module, name, payload = pickle.loads(body)
        fn = getattr(import_module(module), name)
        try:
            answer = ("ok", fn(*payload) if kind == "init" else fn(payload))
        except OctlmError as exc:
            kind_of = type(exc)
            answer = ("octlm", (kind_of.__module__, kind_of.__qualname__, exc.problem, exc.fix))
        except Exception:
            import traceback

            answer = ("error", traceback.format_exc())
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        outbox.write(_LENGTH.pack(len(data)) + data)
        outbox.flush()


if __name__ == "__main__":
    _serve()
