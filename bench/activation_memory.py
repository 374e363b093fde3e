"""What `--activation-checkpointing` saves: peak memory and step time of training steps with
and without it, each in a fresh process (peak RSS is per process), interleaved A/B.

    python -m bench.activation_memory [--rounds 3]

On CPU the number is the process's peak resident set (VmHWM) minus its resident set before the
first step; on CUDA, torch.cuda.max_memory_allocated over the steps. The same weights come out
either way (checked here too).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CASES = (("tiny", 256, 16), ("small", 512, 4))
CHILD = r"""
import hashlib, json, sys, time
from pathlib import Path
import torch
from octlm.model.gpt import GPT
from octlm.config.shape import preset

def rss(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
name, T, B, ac = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = GPT(preset(name, context=T)).to(device)
model.activation_checkpointing = ac
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
g = torch.Generator().manual_seed(1)
x = torch.randint(0, model.config.vocab_size, (B, T), generator=g).to(device)
base = rss("VmRSS")
times = []
for _ in range(3):
    t0 = time.perf_counter()
    loss, n = model(x, x)
    (loss / n).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
peak = (torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda"
        else rss("VmHWM") - base)
digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes()
                                 for p in model.parameters())).hexdigest()
print(json.dumps({"peak_mb": peak, "step_s": min(times[1:]), "sha": digest}))
"""


def child(name: str, context: int, batch: int, ac: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, name, str(context), str(batch), "1" if ac else "0"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    for name, context, batch in CASES:
        mem, time_ratio, same = [], [], True
        for _ in range(args.rounds):
            plain = child(name, context, batch, False)
            recomputed = child(name, context, batch, True)
            mem.append((plain["peak_mb"], recomputed["peak_mb"]))
            time_ratio.append(recomputed["step_s"] / plain["step_s"])
            same &= plain["sha"] == recomputed["sha"]
        plain_mb = statistics.median(m[0] for m in mem)
        ac_mb = statistics.median(m[1] for m in mem)
        print(
            f"{name} T={context} batch {batch}: peak {plain_mb:,.0f} MB -> {ac_mb:,.0f} MB "
            f"({ac_mb / plain_mb:.2f}x); step time {statistics.median(time_ratio):.2f}x "
            f"(median of {args.rounds} interleaved pairs); same weights: {same}"
        )


if __name__ == "__main__":
    main()
