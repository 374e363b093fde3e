"""Per-rank memory of a full-state FSDP checkpoint, saved and loaded.

Save: every rank gathering the whole model and both AdamW moments (how octlm did it before)
against rank 0 alone keeping them, on the host (`octlm.trainer.distributed.full_model_state` /
`full_optim_state` now). Load: every rank reading the whole file (before) against rank 0 reading
it and scattering each tensor's shards (`octlm.trainer.resume.find_agreed` now).

    python -m bench.fsdp_memory [--model small] [--nproc 2]

Each variant runs in its own `torchrun` (gloo, CPU): FSDP2 `fully_shard` per block and root,
one AdamW step so the moments exist, then the gather, a checkpoint written by rank 0, and its
load into the sharded model and optimizer. Printed per rank: resident memory before the gather,
what the gather adds while its result is held and the bytes of whole tensors the rank keeps;
then, for the load (in a fresh process), the peak resident memory it adds (high-water mark,
reset before it), the bytes the rank reads from the file, in MB, and its time.

safetensors maps a file lazily, so a rank that reads the whole file holds little more resident
memory for it than one that does not: the saving on load is I/O (one read and one checksum
pass of the file in all, not one per rank; on several nodes, one transfer from the shared
folder), and no rank but 0 holds a whole state that the OS must page in.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, os, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from octlm.model.gpt import GPT
from octlm.config.shape import preset
from octlm.trainer import checkpoint as ckpt
from octlm.trainer.distributed import DistInfo, full_model_state, full_optim_state, load_full_state
from octlm.trainer.optim import param_names
from octlm.trainer.resume import find_agreed, load_newest_valid

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024

def read_mb():  # bytes this process has read through read() calls (the checksum pass)
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar"):
            return int(line.split()[1]) / 2**20

def reset_peak():  # VmHWM restarts from the current resident set
    Path("/proc/self/clear_refs").write_text("5")

phase, variant, model_name, out = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
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
run_dir = out / "run"
result = {}
if phase == "load":  # a fresh process, so no memory freed by the gather is reused here
    reset_peak()
    base, read0, t0 = status("VmRSS"), read_mb(), time.perf_counter()
    if variant == "every-rank":  # the old way: every rank reads and checks the whole file
        found = load_newest_valid(run_dir)
    else:
        found = find_agreed(run_dir, info, torch.device("cpu"), fsdp=True)
    loaded = found.info.run_state(found.tensors)
    names = param_names(model, opt)
    load_full_state(model, opt, loaded["model"], loaded["optimizer"], info, "fsdp", names)
    result.update(load_peak_mb=status("VmHWM") - base, read_mb=read_mb() - read0,
                  load_s=time.perf_counter() - t0)
else:
    before = status("VmRSS")
    if variant == "every-rank":  # the old way: every rank all-gathers and keeps everything
        weights = {k: v.full_tensor() for k, v in model.state_dict().items()}
        sd = opt.state_dict()
        whole = lambda v: v.full_tensor() if hasattr(v, "full_tensor") else v
        moments = {i: {k: whole(v) for k, v in st.items()} for i, st in sd["state"].items()}
    else:
        weights = full_model_state(model, info, "fsdp")
        moments = full_optim_state(model, opt, info, "fsdp", [])["state"]
    kept = sum(t.numel() * t.element_size() for t in weights.values())
    kept += sum(t.numel() * t.element_size() for st in moments.values() for t in st.values())
    result = {"rss_mb": before, "held_mb": status("VmRSS") - before, "kept_mb": kept / 2**20}
    if rank == 0:  # the file the load phase reads
        state = {"model": weights, "scaler": None, "train_state": {}, "sampler": {}, "rng": [{}],
                 "optimizer": {"state": moments, "param_groups": opt.state_dict()["param_groups"]}}
        state.update({key: None for key in ckpt.IDENTITY_KEYS}, world=1)
        ckpt.save_checkpoint(run_dir, 1, *ckpt.pack(state))
    dist.barrier()
(out / f"{phase}{rank}.json").write_text(json.dumps(result))
dist.destroy_process_group()
"""


def run(variant: str, model: str, nproc: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "worker.py"
        script.write_text(WORKER)
        rows: list[dict] = [{} for _ in range(nproc)]
        for phase in ("save", "load"):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={nproc}", str(script), phase, variant, model,
                   tmp]  # fmt: skip
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            for r in range(nproc):
                rows[r].update(json.loads((Path(tmp) / f"{phase}{r}.json").read_text()))
        return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--nproc", type=int, default=2)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    for variant in ("every-rank", "rank-0-only"):
        for rank, r in enumerate(run(variant, args.model, args.nproc)):
            print(
                f"{variant:12s} rank {rank}: resident {r['rss_mb']:,.0f} MB before the gather, "
                f"+{r['held_mb']:,.0f} MB after it ({r['kept_mb']:,.0f} MB of whole tensors); "
                f"load: +{r['load_peak_mb']:,.0f} MB at peak, {r['read_mb']:,.0f} MB read, "
                f"{r['load_s']:.2f} s"
            )


if __name__ == "__main__":
    main()
