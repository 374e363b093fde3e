"""CPU and wall time of `octlm train --nproc N` starting its workers three ways: forked from a
forkserver that is itself a fork of the launcher (the default, octlm/trainer/forkserver_here.py),
forked from a forkserver that is a fresh interpreter (OCTLM_WORKER_START=fresh-forkserver,
octlm/trainer/forkstart.py), and a fresh `python -u -m octlm` per worker (exec, as torchrun
starts them). The launcher runs with OMP_NUM_THREADS=1 set, as a launcher must for the first.

    .venv/bin/python -m bench.worker_start [--repeats 5] [--nproc 2] [--data runs/demo/data]

Each repeat runs the same one-step run (the tiny model, no validation, no checkpoint, into a
fresh folder) once per mode, the modes interleaved and their order rotated per repeat.
Timed from just before the launcher starts: the wall time to the log's first `step` record
(polled every 5 ms) and to the launcher's exit. CPU (user + system) of the launcher and of every
process under it, read from /proc every 10 ms and taken at each process's last reading (a
process loses at most its last 10 ms): getrusage cannot count them, since the forkserver's
workers are reaped by the kernel (it ignores SIGCHLD) and the forkserver outlives the launcher.
Workers are the processes under the launcher that lead their own session; "other" is the
forkserver and multiprocessing's resource tracker. Printed: each repeat, then the medians side
by side with their ratio, and the CPU one worker start saves.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/worker_start.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import DATA

MODES = ("exec", "fresh-forkserver", "forkserver")
TICK = os.sysconf("SC_CLK_TCK")


Procs = dict[int, tuple[int, int, float, int, bool]]


def snapshot() -> Procs:
    """Every process: pid -> (parent, session, CPU seconds, start time in ticks, alive: not a
    zombie, which this machine's init may never reap)."""
    procs = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = stat.read_text().rsplit(")", 1)[1].split()
            cpu = (int(f[11]) + int(f[12])) / TICK
            procs[int(stat.parent.name)] = (int(f[1]), int(f[3]), cpu, int(f[19]), f[0] != "Z")
        except (OSError, ValueError, IndexError):
            continue
    return procs


def under(pid: int, root: int, procs: Procs) -> bool:
    while pid in procs and pid != root:
        pid = procs[pid][0]
    return pid == root


def sample(root: int, seen: dict[tuple[int, int], tuple[str, float]]) -> None:
    """Record the CPU of `root` and of the processes under it, keyed by (pid, start time), with
    their kind: launcher, worker (a session leader) or other."""
    procs = snapshot()
    for pid, (parent, session, cpu, start, _) in procs.items():
        if pid == root:
            seen[(pid, start)] = ("launcher", cpu)
        elif under(parent, root, procs) or (pid, start) in seen:
            # A forked worker leads its session a moment after it starts: once seen, a worker.
            kind = "worker" if session == pid else seen.get((pid, start), ("other", 0.0))[0]
            seen[(pid, start)] = (kind, cpu)


def run_once(mode: str, cmd: list[str], folder: Path) -> dict[str, float]:
    """One launch in `mode`: wall seconds to the first step and to the end, CPU seconds by kind."""
    env = {**os.environ, "OCTLM_WORKER_START": mode, "OMP_NUM_THREADS": "1"}
    log, seen, first = folder / "log.jsonl", {}, float("nan")
    start = time.perf_counter()
    proc = subprocess.Popen([*cmd, "--out", str(folder)], env=env, stderr=subprocess.DEVNULL)
    last_sample = 0.0
    while proc.poll() is None:
        now = time.perf_counter()
        if math.isnan(first) and log.is_file() and '"type": "step"' in log.read_text():
            first = now - start
        if now - last_sample >= 0.01:
            sample(proc.pid, seen)
            last_sample = now
        time.sleep(0.005)
    end = time.perf_counter() - start
    # The forkserver outlives the launcher by a moment: follow what was seen until it ends.
    deadline, alive = time.monotonic() + 30, True
    while alive and time.monotonic() < deadline:
        procs, alive = snapshot(), False
        for (pid, begun), (kind, _) in list(seen.items()):
            if pid in procs and procs[pid][3] == begun:
                seen[(pid, begun)] = (kind, procs[pid][2])
                alive = alive or procs[pid][4]
        time.sleep(0.01)
    assert proc.returncode == 0, f"{mode}: the run failed ({proc.returncode})"
    out = {"first_step_s": first, "end_s": end}
    for kind in ("launcher", "worker", "other"):
        out[f"{kind}_cpu_s"] = sum(cpu for k, cpu in seen.values() if k == kind)
    out["total_cpu_s"] = out["launcher_cpu_s"] + out["worker_cpu_s"] + out["other_cpu_s"]
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--context", type=int, default=64)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    cmd = [sys.executable, "-m", "octlm", "train", "--model", "tiny", "--data", args.data]
    cmd += ["--context", str(args.context), "--micro-batch", "4", "--accum", "1", "--steps", "1"]
    cmd += ["--warmup", "0", "--val-every", "0", "--ckpt-every", "0", "--no-progress"]
    cmd += ["--nproc", str(args.nproc)]
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-worker-start-") as work:
        for r in range(args.repeats):
            for mode in MODES[r % 3 :] + MODES[: r % 3]:
                res = run_once(mode, cmd, Path(work) / f"{mode}-{r}")
                results[mode].append(res)
                shown = "  ".join(f"{k} {v:.2f}" for k, v in res.items())
                print(f"repeat {r} {mode:>10}: {shown}", flush=True)
    med = {m: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for m, rs in results.items()}
    print(f"\nmedians of {args.repeats} ({args.nproc} workers)     exec  fresh-fs  forkserver")
    for key in med["exec"]:
        row = "".join(f"{med[m][key]:10.2f}" for m in MODES)
        print(f"{key:>28}{row}")
    saved = (med["exec"]["total_cpu_s"] - med["forkserver"]["total_cpu_s"]) / args.nproc
    per_worker = med["exec"]["worker_cpu_s"] / args.nproc
    forked = med["forkserver"]["worker_cpu_s"] / args.nproc
    print(f"\nCPU per worker: {per_worker:.2f} s fresh, {forked:.2f} s forked; the whole launch")
    print(f"saves {saved:.2f} s per worker started, the forkserver's imports paid once")
    forked_here = med["fresh-forkserver"]["total_cpu_s"] - med["forkserver"]["total_cpu_s"]
    print(f"the forkserver forked from the launcher saves {forked_here:.2f} s of CPU a launch")


if __name__ == "__main__":
    main()
