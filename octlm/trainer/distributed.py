"""Multi-process training on torch.distributed: torchrun's environment, DDP and FSDP2 wrapping,
and the few collectives the loop needs (sums for the masked mean, an agreed stop flag).

Everything is a no-op with one process, so the single-process path computes the same bits
whether or not this module is involved.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from octlm.device import resolve_device
from octlm.errors import OctlmError, RankError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(device_name: str, timeout_s: float = 1800.0) -> tuple[DistInfo, torch.device]:
    """Join the process group torchrun set up (gloo on CPU, NCCL on CUDA) and pick the device.
    A collective that waits `timeout_s` for a peer raises (see `peer_failure`)."""
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return DistInfo(), resolve_device(device_name)
    refuse_shared_store_restarts(os.environ)
    info = DistInfo(
        int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    )
    use_cuda = device_name.startswith("cuda") or (
        device_name == "auto" and torch.cuda.is_available()
    )
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
        device = torch.device("cuda", info.local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        try:
            dist.init_process_group(
                "nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s)
            )
        except RuntimeError as exc:  # the store's or the backend's timeout (DistStoreError...)
            where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
            raise RankError(
                f"rank {info.rank}: the {info.world} processes did not meet at {where} within "
                f"--dist-timeout {timeout_s:g} s ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else 'no detail'})",
                "check that every process was started and can reach that address, then run "
                "the command again (with --resume if a run was under way)",
            ) from None
    return info, device


def refuse_shared_store_restarts(env: Mapping[str, str]) -> None:
    """Refuse a plain `torchrun --max-restarts N` whose workers use the agent's shared TCPStore.

    That store outlives a failed worker group with its keys, and a restarted group can read a
    dead peer's address and hang in start-up for good (pytorch/pytorch#135712: here 3 of 6
    plain-torchrun runs with SIGKILLed workers hung past 300 s; with the store not shared, 4
    of 4 ended on the straight run's bits). Only the agent can stop sharing it, so a worker can
    but refuse, at once and before anything is written. octlm's own launcher (`--nproc N
    --max-restarts K`) sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which torchrun passes on as
    TORCHELASTIC_USE_AGENT_STORE=False.
    """
    restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    if restarts > 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise OctlmError(
            f"torchrun --max-restarts {restarts} with the agent's shared TCPStore can hang a "
            "restarted group in start-up (pytorch/pytorch#135712)",
            "set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment, or launch with "
            f"octlm train --nproc N --max-restarts {restarts}",
        )


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: nn.Module, info: DistInfo, parallel: str, device: torch.device) -> nn.Module:
    """DDP around the model, or FSDP2 `fully_shard` on every block and the root."""
    if not info.enabled:
        return model
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.layers:  # type: ignore[attr-defined]
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Buffers (the RoPE tables) are identical everywhere: no need to broadcast them.
    return DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        forward_sync_buffers=False,
    )


def sync_context(
    wrapped: nn.Module, info: DistInfo, parallel: str, accum: int
) -> Callable[[int], contextlib.AbstractContextManager] | None:
    """Gradients synchronise once per optimizer step: skip it on all but the last micro-batch."""
    if not info.enabled:
        return None
    if parallel == "fsdp":

        @contextlib.contextmanager
        def fsdp_sync(micro: int):
            wrapped.set_requires_gradient_sync(micro == accum - 1)  # type: ignore[operator]
            yield

        return fsdp_sync
    return lambda micro: wrapped.no_sync() if micro < accum - 1 else contextlib.nullcontext()


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum over ranks, in place; the identity with one process."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def agree(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True on every rank if it is true on any: all ranks stop at the same step."""
    return agree_max(int(flag), info, device) > 0


def agree_max(value: int, info: DistInfo, device: torch.device) -> int:
    """The largest of every rank's `value`, on every rank."""
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gather_objects(obj: object, info: DistInfo) -> list[object]:
    """Every rank's `obj` (RNG states), in rank order; only used at checkpoints."""
    if not info.enabled:
        return [obj]
    out: list[object] = [None] * info.world
    dist.all_gather_object(out, obj)
    return out


# What gloo's errors say when a peer is gone (it died: its sockets closed) or silent (stopped,
# hung, or too slow for the timeout). NCCL's watchdog aborts the process on a timeout instead.
# Matched lower-cased: gloo says "Timed out waiting", "Application timeout caused pair closure"
# (a process woken after its deadline passed), ...
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe")
_PEER_SILENT = ("timed out", "timeout")


def peer_failure(exc: BaseException, info: DistInfo, steps_done: int, timeout_s: float):
    """The one-line error for a collective that failed because of another process, or None
    when `exc` is not that. A `RankError`: each rank that hits it says so with its own rank."""
    text = str(exc).lower()
    if not info.enabled or not isinstance(exc, RuntimeError):
        return None
    if any(s in text for s in _PEER_SILENT):
        what = f"no answer from another process in {timeout_s:g} s (stopped, hung or too slow)"
    elif any(s in text for s in _PEER_GONE):
        what = "another process is gone (it died or was killed)"
    else:
        return None
    return RankError(
        f"rank {info.rank}, after step {steps_done}: {what}",
        "the last checkpoint is kept: find that process, then continue with the same command "
        "plus --resume (raise --dist-timeout if a step or checkpoint write can take longer)",
    )


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def broadcast_json(obj: object, info: DistInfo, device: torch.device) -> object:
    """Rank 0's JSON value on every rank (others pass anything). UTF-8 bytes on the wire, not
    pickle: what a rank receives is data, whatever rank 0 read from disk."""
    if not info.enabled:
        return obj
    data = json.dumps(obj).encode() if info.is_main else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, 0)
    if info.is_main:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(buf, 0)
    return obj if info.is_main else json.loads(bytes(buf.cpu().tolist()).decode())


def broadcast_tensor(tensor: torch.Tensor, info: DistInfo, device: torch.device) -> torch.Tensor:
    """Rank 0's `tensor` on every rank, on the host; the others pass a tensor of its shape and
    dtype to receive into."""
    if not info.enabled:
        return tensor
    buf = tensor.to(device) if tensor.device != device else tensor.clone()
    dist.broadcast(buf, 0)
    return buf.cpu()


# -- full (unsharded) state, the same layout whatever the parallelism -------------------------
# Checkpoints always hold the full model and an index-keyed optimizer state, exactly what a
# single process writes. Under FSDP every sharded tensor is all-gathered one at a time: rank 0,
# which writes the file, keeps each whole tensor on the host (a GPU holds one at a time), and
# every other rank drops it at once, so only rank 0 needs the full state's memory. On load every
# tensor is re-sharded with the parameter's own placement, so any world size and either wrapper
# can resume any checkpoint. No DCP, so no pickle.


def _full(value):
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def _gathered(items, keep: bool) -> dict:
    """{key: whole tensor on the host} on the rank that keeps them; {} elsewhere. Every rank
    must call it with the same keys in the same order: each all-gather is a collective."""
    out = {}
    for key, value in items:
        whole = _full(value)
        if keep:
            out[key] = whole.cpu() if whole.device.type != "cpu" else whole
        del whole
    return out


def _like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`full` laid out like `param`: sharded the same way when `param` is a DTensor. Only rank
    0's values count (`src_data_rank=0`: it scatters the shards), so the other ranks may pass a
    shape-only `meta` placeholder (octlm/trainer/resume.py), which stands for one whole
    tensor of scratch memory here for as long as the scatter takes."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(param, DTensor):
        return full
    if full.is_meta:
        full = torch.empty(full.shape, dtype=full.dtype, device=param.device)
    return distribute_tensor(
        full.to(param.device), param.device_mesh, param.placements, src_data_rank=0
    )


def full_model_state(model: nn.Module, info: DistInfo, parallel: str) -> dict[str, torch.Tensor]:
    """Every weight whole: on every rank, but under FSDP (collective) on rank 0 only and on the
    host; the other ranks get {}."""
    if not _fsdp(info, parallel):
        return dict(model.state_dict())
    return _gathered(model.state_dict().items(), info.is_main)


def full_optim_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    info: DistInfo,
    parallel: str,
    names: list[str],
) -> dict:
    """`optimizer.state_dict()` with every tensor whole; under FSDP (collective) on rank 0
    only, on the host, the other ranks' "state" left empty."""
    sd = optimizer.state_dict()
    if not _fsdp(info, parallel):
        return sd
    state = {}
    for i, st in sd["state"].items():  # the same order on every rank: the collectives pair up
        whole = _gathered(st.items(), info.is_main)
        if info.is_main:
            state[i] = whole
    return {"state": state, "param_groups": sd["param_groups"]}


def load_full_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_sd: dict,
    optim_sd: dict,
    info: DistInfo,
    parallel: str,
    names: list[str],
) -> None:
    """Load full state; under FSDP each rank keeps its shard of rank 0's tensors (the other
    ranks' weights and moments may be `meta` placeholders: see `_like`)."""
    if not _fsdp(info, parallel):
        model.load_state_dict(model_sd)
        optimizer.load_state_dict(optim_sd)
        return
    params = dict(model.named_parameters())
    # Each `_like` is a scatter: every rank must take the tensors in the same order, which the
    # dicts' own order (a file's on rank 0, a message's elsewhere) need not be. Sorted keys are.
    model.load_state_dict({k: _like(model_sd[k], params[k]) for k in sorted(model_sd)})
    by_index = [params[n] for n in names]
    state = {}
    for i in sorted(optim_sd["state"], key=int):
        st = optim_sd["state"][i]
        state[int(i)] = {
            k: _like(st[k], by_index[int(i)]) if st[k].dim() else st[k] for k in sorted(st)
        }
    optimizer.load_state_dict({"state": state, "param_groups": optim_sd["param_groups"]})


def _fsdp(info: DistInfo, parallel: str) -> bool:
    return info.enabled and parallel == "fsdp"
