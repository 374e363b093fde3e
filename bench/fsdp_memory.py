"""Per-rank memory of a full-state FSDP checkpoint: every rank gathering the whole model and both
AdamW moments (how octlm did it before) against rank 0 alone keeping them, on the host
(`octlm.train.distributed.full_model_state` / `full_optim_state` now).

    python -m bench.fsdp_memory [--model small] [--nproc 2]

Each variant runs in its own `torchrun` (gloo, CPU): FSDP2 `fully_shard` per block and root,
one AdamW step so the moments exist, then the gather. Printed per rank: resident memory before
the gather, what the gather adds to it while its result is held, and the bytes of whole tensors
the rank holds, in MB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, os, sys
from pathlib import Path
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from octlm.model import GPT, preset
from octlm.train.distributed import DistInfo, full_model_state, full_optim_state

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024

variant, model_name, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = GPT(preset(model_name, context=128))
for block in model.layers:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randint(0, model.config.vocab_size, (1, 128))
loss, n = model(x, x)
(loss / n).backward()
opt.step()
opt.zero_grad(set_to_none=True)
info = DistInfo(rank=rank, world=world, local_rank=rank)
before = status("VmRSS")
if variant == "every-rank":  # the old way: every rank all-gathers and keeps everything
    weights = {k: v.full_tensor() for k, v in model.state_dict().items()}
    sd = opt.state_dict()
    moments = {i: {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in st.items()}
               for i, st in sd["state"].items()}
else:
    weights = full_model_state(model, info, "fsdp")
    moments = full_optim_state(model, opt, info, "fsdp", [])["state"]
kept = sum(t.numel() * t.element_size() for t in weights.values())
kept += sum(t.numel() * t.element_size() for st in moments.values() for t in st.values())
held = status("VmRSS") - before
(out / f"rank{rank}.json").write_text(json.dumps(
    {"rss_mb": before, "held_mb": held, "kept_mb": kept / 2**20}))
dist.destroy_process_group()
"""


def run(variant: str, model: str, nproc: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "worker.py"
        script.write_text(WORKER)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", str(script), variant, model, tmp]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(nproc)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    for variant in ("every-rank", "rank-0-only"):
        for rank, r in enumerate(run(variant, args.model, args.nproc)):
            print(
                f"{variant:12s} rank {rank}: resident {r['rss_mb']:,.0f} MB before the gather, "
                f"+{r['held_mb']:,.0f} MB after it ({r['kept_mb']:,.0f} MB of whole tensors)"
            )


if __name__ == "__main__":
    main()
