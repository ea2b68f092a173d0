"""--fsdp: each rank holds 1/N of every weight, gradient and AdamW moment (PyTorch's FSDP2, `fully_shard`).

Under torchrun without --fsdp every rank holds the whole model (infra/distributed.py). With it, `shard` splits each
transformer block's parameters, and then the rest, into N shards, one a rank (DTensors). A block's forward first
gathers its whole weights from the ranks and frees them after (`reshard_after_forward`); its backward gathers them
again and reduce-scatters the gradients, so each rank keeps only the gradient of its own shard, and AdamW updates
only that shard. Activations are not sharded: each rank computes its own share of the batch, as without --fsdp.

What changes for the rest of the code, and nothing else does:
- gradients are summed over the ranks by the reduce-scatter (`set_gradient_divide_factor(1)`: each rank's loss is
  already its part of the whole batch's, as in infra/distributed.py), so distributed.all_reduce_grads has nothing to do;
- every forward is a collective: the ranks must call the model equally often. Sampling runs until every rank's rows
  have finished (common.all_finished), and the held-out set must divide over the ranks (runs.check_options);
- a checkpoint holds whole tensors, gathered from the shards (`state_of`): it loads with `from_pretrained` and
  resumes with the same number of ranks;
- infra/kernels.py is off for a sharded model: its CPU paths read whole weights.
Imports no module of the project.
"""

from __future__ import annotations

import sys

import torch

# torch.distributed.fsdp and .checkpoint are imported where a model is sharded: together they cost a second of
# every script's start, a run that stops at its first check included


def whole_tensors():
    """State-dict options: whole tensors on the CPU, gathered from the shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def shard(on: bool, *models) -> None:
    """With --fsdp, shard each of `models` in place (None is skipped; trained or frozen alike): each transformer
    block (the classes transformers names in _no_split_modules), then the model itself (embeddings, norm, head)."""
    from torch.distributed.fsdp import fully_shard

    for model in filter(None, models) if on else ():
        block_names = set(getattr(model, "_no_split_modules", None) or [])
        for module in model.modules():
            if type(module).__name__ in block_names:
                fully_shard(module)
        # the outermost units reshard too (a root keeps its weights whole after a forward by default). A reward model's
        # or critic's backbone and head (under a LoRA wrapper) are units of their own: reward_scores calls them apart.
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        for unit in (inner.base_model, inner.score) if hasattr(inner, "score") else ():
            fully_shard(unit, reshard_after_forward=True)
        fully_shard(model, reshard_after_forward=True)
        # each unit's gradients: Σ over the ranks, not their mean
        for module in filter(is_sharded, model.modules()):
            module.set_gradient_divide_factor(1.0)  # (each rank's loss is already its part of the batch's)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no pre-multiplied sum
        model.kernels_on = False  # common.kernels_on: the plain code, which reads no whole weight itself
        model.sharded = (
            True  # read by common: no shared-prompt forward, and decoding until every rank's rows end
        )


def check_options(args, ranks: int, under_torchrun: bool, require) -> None:
    """--fsdp's checks: torchrun, no --merge-lora or --decode compiled, a held-out set that divides over the ranks."""
    if args.run.fsdp:
        require(
            under_torchrun,
            "--fsdp shards the model over torchrun's ranks: torchrun --nproc_per_node N script.py ...",
        )
        require(
            not args.lora.merge_lora,
            "--merge-lora does not run with --fsdp: merge the saved adapter afterwards "
            "in one process (peft: PeftModel.from_pretrained(base, adapter).merge_and_unload())",
        )
        require(
            args.run.decode == "plain",
            "--decode compiled does not run with --fsdp (a sharded forward gathers its weights step by step): "
            "use --decode plain",
        )
        eval_size = getattr(args, "eval_size", None) or 0
        require(
            eval_size % ranks == 0, f"--fsdp: --eval-size {eval_size} must divide over {ranks} torchrun ranks"
        )


def is_sharded(model) -> bool:
    fsdp = sys.modules.get("torch.distributed.fsdp")  # not imported: nothing was sharded
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def whole_weights(model):
    """A sharded model's whole tensors on the CPU (every rank calls it; rank 0 gets them, the others {}); else None."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=whole_tensors())


def owner(optimizer: torch.optim.Optimizer, models: dict):
    """The one of `models` (name -> model: a policy, a critic) whose parameters `optimizer` updates."""
    return next(
        m for m in models.values() if any(p is optimizer.param_groups[0]["params"][0] for p in m.parameters())
    )


def state_of(obj, models):
    """What a checkpoint keeps of an optimizer, scheduler or generator (a sharded model's optimizer: whole tensors)."""
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    # not before
    if isinstance(obj, torch.optim.Optimizer) and is_sharded(model := owner(obj, models)) and obj.state:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(model, obj, options=whole_tensors())  # the first step
    return obj.state_dict()


def load_state(obj, state, models) -> None:
    """The inverse of state_of, on resume: a sharded model's optimizer takes each rank's shard of the whole state."""
    if isinstance(obj, torch.Generator):
        obj.set_state(state)
    elif (
        isinstance(obj, torch.optim.Optimizer) and is_sharded(model := owner(obj, models)) and state["state"]
    ):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, obj, state, options=StateDictOptions(full_state_dict=True))
    else:
        obj.load_state_dict(state)
