"""The processes of one run: torchrun's ranks, each rank's share of a batch, sums over the ranks, random states.

`torchrun --nproc_per_node N grpo.py ...` starts N copies of a script, rank 0 to N-1; models.resolve_device joins them
into one process group (gloo on a CPU, nccl on CUDA with one GPU a rank). Each rank takes its contiguous share of every
batch (`share`), divides its part of the loss by the whole batch's count (`share_of`, `all_sum`), and the ranks sum
their gradients (`all_reduce_grads`) before the one optimizer step they all take: every rank holds the same weights,
those one process would hold. Rank 0 alone writes (runs.Run asks `is_main`); logged numbers are averaged over the ranks
(`mean_over_ranks`). A plain `python grpo.py` is rank 0 of 1: every function here then returns its input unchanged,
without a collective call, so no number of a one-process run changes. Imports no module of the project.
"""

from __future__ import annotations

import io
import os
import sys
import random
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist


def world_size() -> int:
    """The number of processes torchrun started (WORLD_SIZE); 1 for a plain run."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def under_torchrun() -> bool:
    """Started by torchrun, which sets LOCAL_RANK; with `--nproc_per_node 1` too, a group of one rank."""
    return "LOCAL_RANK" in os.environ


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Rank 0: the one process that writes the run folder, metrics, checkpoints and to the console."""
    return rank() == 0


def share(items: list) -> list:
    """This rank's contiguous share of a list every rank built whole (rank r of N takes the r-th of N slices): in
    rank order the shares are the list. A training batch divides evenly; a held-out set may not (sizes differ by 1)."""
    return items[rank() * len(items) // world_size() : (rank() + 1) * len(items) // world_size()]


def concat(items):
    """Every rank's list or tensor, joined in rank order (the whole of what `share` split); `items` itself alone."""
    if world_size() == 1:
        return items
    parts = gather(items)
    return (
        torch.cat([p.to(items.device) for p in parts]) if isinstance(items, torch.Tensor) else sum(parts, [])
    )


def all_sum(x):
    """Σ over the ranks of a number or tensor (every rank gets the total); `x` itself in a plain run."""
    if world_size() == 1:
        return x
    total = torch.as_tensor(x, dtype=torch.float64 if isinstance(x, float) else None).to(_device(), copy=True)
    dist.all_reduce(total)
    return total.item() if isinstance(x, (int, float)) else total


def share_of(count) -> float:
    """This rank's part of the whole batch's `count` (sequences or tokens): count / Σ_ranks count; 1.0 alone."""
    return 1.0 if world_size() == 1 else float(count) / float(all_sum(count))


def mean_over_ranks(stats: dict) -> dict:
    """Logged numbers averaged over the ranks: each is a mean over an equal share of the batch (a reward, a length)
    or the same on every rank (a sum over the ranks, grad_norm, lr), so the average is one process's. Ints stay ints."""
    if world_size() == 1:
        return stats
    values = torch.tensor([float(v) for v in stats.values()], dtype=torch.float64, device=_device())
    dist.all_reduce(values)
    return {
        k: round(m) if isinstance(v, int) else m
        for (k, v), m in zip(stats.items(), (values / world_size()).tolist())
    }


def all_reduce_grads(model: torch.nn.Module) -> None:
    """Σ over the ranks of every gradient. Each rank's loss is already its share of the whole batch's (divided by
    the batch's count, not its own), so the sum is the one-process gradient: no division by N here. A plain
    all-reduce after the backward, where DistributedDataParallel would average and overlap it with the backward."""
    # --fsdp (fsdp.shard marks the model `sharded`): the backward's reduce-scatter summed them already
    if world_size() == 1 or getattr(model, "sharded", False):
        return
    for p in filter(lambda p: p.requires_grad, model.parameters()):
        if p.grad is None:  # a parameter this rank's batch did not reach; another rank's may have
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)


def _device() -> torch.device:
    """Where a collective's tensors live: the rank's GPU for nccl, the CPU for gloo."""
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )


def from_main(obj):
    """Rank 0's `obj` on every rank (the run folder it made); `obj` itself alone."""
    return obj if world_size() == 1 else gather(obj)[0]


def barrier(leave: bool = False) -> None:
    """Wait until every rank gets here (rank 0 built what the others read next); nothing alone. With `leave`, at the
    end of a finished run: then leave the group and end the process at once, since the interpreter's teardown with
    gloo's threads alive aborted some finished runs (SIGABRT, "terminate called without an active exception")."""
    if world_size() > 1:
        dist.barrier()
        if leave:
            dist.destroy_process_group()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


def gather(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank. Sent as torch.save's bytes: all_gather_object cannot pickle
    the tensors inside random states, and torch.load(weights_only=True) reads back only plain data and tensors."""
    buffer = io.BytesIO()
    objects = [None] * world_size()
    torch.save(obj, buffer)
    dist.all_gather_object(objects, buffer.getvalue())
    return [torch.load(io.BytesIO(data), weights_only=True) for data in objects]


# ---------------------------------------------------------------------------------------------
# Random states: every process draws its own (a rank's sampling generator is seeded with seed + rank)
# ---------------------------------------------------------------------------------------------
def rng_state(generator: Optional[torch.Generator] = None) -> dict:
    """Every random state a step draws from: python, numpy, torch (and CUDA), the sampling generator."""
    numpy_state = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in np.random.get_state()]
    return {
        "python": random.getstate(),
        "numpy": numpy_state,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generator": generator.get_state() if generator is not None else None,
    }


def set_rng_state(state: dict, generator: Optional[torch.Generator] = None) -> None:
    random.setstate(state["python"])
    np.random.set_state(tuple(a.numpy() if isinstance(a, torch.Tensor) else a for a in state["numpy"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None:
        generator.set_state(state["generator"])


def rng_states(generator: Optional[torch.Generator] = None):
    """What a checkpoint keeps: this process's random states (rng_state), or under torchrun every rank's, a list."""
    return rng_state(generator) if world_size() == 1 else gather(rng_state(generator))


def set_rng_states(states, generator: Optional[torch.Generator] = None) -> None:
    set_rng_state(states if world_size() == 1 else states[rank()], generator)
