"""The launcher's forkserver forked from the launcher (octlm/trainer/forkserver_here.py): when it
is, what the fork keeps, and when the forkserver starts fresh instead. Each case runs in a
fresh interpreter (the state a launcher is in: octlm and torch imported, nothing run); the
runs' bits are tests/e2e/test_distributed.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # fresh interpreters: torch imported in each

SCRIPT = """
import json, multiprocessing, multiprocessing.forkserver, os, signal, sys, threading, time
import octlm, torch, torch._dynamo, octlm.cli.main, octlm.trainer.loop
from octlm.trainer.forkstart import PRELOAD
from octlm.trainer.forkserver_here import fork_forkserver, why_not_here

def seen(_):
    return {
        "term": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        "usr1": signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
        "int": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "quit_ignored": signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN,
        "parent": os.getppid(),
    }

if __name__ == "__main__":
    case = sys.argv[1]
    held = open(__file__)  # a descriptor the launcher holds: the forkserver must not
    # A launcher started from a background job inherits SIGINT ignored, and so would a fresh
    # interpreter: put the terminal's state here, so that each case expects the same.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGUSR1, lambda *a: None)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)  # ignored: stays ignored, as across exec
    refusals = {}
    thread = threading.Thread(target=time.sleep, args=(0.5,))
    thread.start()
    refusals["thread"] = why_not_here()
    thread.join()
    os.environ["OMP_NUM_THREADS"] = "3"
    refusals["env"] = why_not_here()
    if case == "clean":
        os.environ["OMP_NUM_THREADS"] = "1"
    multiprocessing.set_forkserver_preload(PRELOAD)
    why = fork_forkserver(PRELOAD)
    pool = multiprocessing.get_context("forkserver").Pool(1)
    child = pool.map(seen, [0])[0]
    pool.close(); pool.join()
    server = child["parent"]
    fds = [os.readlink(f"/proc/{server}/fd/{fd}") for fd in os.listdir(f"/proc/{server}/fd")]
    fork = open(f"/proc/{server}/cmdline").read() == open("/proc/self/cmdline").read()
    print(json.dumps({"why": why, "child": child, "refusals": refusals,
                      "holds_file": __file__ in fds, "server_is_fork": fork, "server": server}))
"""


def run(case: str, tmp_path) -> dict:
    script = tmp_path / "launcher.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(script), case], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_clean_launcher_forks_its_forkserver_which_holds_only_what_a_fresh_one_would(
    tmp_path,
) -> None:
    seen = run("clean", tmp_path)
    # Before it forked, the same process was refused while it ran a second thread and while
    # OMP_NUM_THREADS differed from its value at the imports.
    assert seen["refusals"] == {
        "thread": "2 threads run in this process",
        "env": "OMP_NUM_THREADS changed since the imports",
    }
    assert seen["why"] is None and seen["server_is_fork"]
    assert not seen["holds_file"]  # the launcher's descriptors closed, as a spawn closes them
    # The launcher's Python handler is not the workers': handlers as a fresh interpreter's.
    child = seen["child"]
    assert child["usr1"] and child["term"] and child["int"] and child["quit_ignored"]
    # The forkserver ends with its launcher (it holds no end of its own "alive" pipe).
    for _ in range(100):
        if gone(seen["server"]):
            break
        subprocess.run(["sleep", "0.05"], check=True)
    assert gone(seen["server"])


def test_otherwise_the_forkserver_starts_fresh_and_says_why(tmp_path) -> None:
    seen = run("env", tmp_path)
    assert seen["why"] == "OMP_NUM_THREADS changed since the imports"
    assert not seen["server_is_fork"]  # control: the fresh interpreter's command line
    child = seen["child"]
    assert child["usr1"] and child["term"] and child["int"] and child["quit_ignored"]
