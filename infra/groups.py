"""The GRPO family's plumbing around its loss, apart so that grpo.py keeps the algorithm: the log-probs of a group's
completions with each prompt encoded once (group_logprobs), grpo_loss's options as the command line sets them
(loss_options, entropy_wanted), and each micro-batch's weight in the batch's loss (micro_batch_weight). grpo.py and
its variants (grpo_prm, grpo_async, grpo_adaptive, grpo_tools) call them alike; `args` is grpo.Args or a variant's."""

from __future__ import annotations

import torch

import common


def entropy_wanted(args, iteration: int) -> tuple[bool, bool]:
    """(compute the entropy, with its gradient): iteration 0's is logged, the sampling policy's; the loss reads it at
    every iteration when it has an entropy bonus, fixed or adaptive (then with its gradient), or keeps only the
    high-entropy tokens."""
    bonus = args.entropy_coef != 0 or args.entropy_target is not None
    return iteration == 0 or bonus or args.top_entropy_quantile < 1, bonus


def loss_options(args, entropy_coef: float) -> dict:
    """grpo.grpo_loss's options as the command line sets them, with this step's entropy coefficient (--entropy-coef, or
    adapted toward --entropy-target): the same for every micro-batch and iteration."""
    return dict(
        eps_low=args.eps_low,
        eps_high=args.eps_high,
        beta=args.beta,
        loss_agg=args.loss_agg,
        max_completion_length=args.max_new_tokens,
        kl_kind=args.kl_estimator,
        importance_level=args.importance_level,
        loss_type=args.loss_type,
        delta=args.delta,
        entropy_coef=entropy_coef,
        top_entropy_quantile=args.top_entropy_quantile,
        sapo_temperatures=args.sapo_temperatures,
        vespo_params=args.vespo_params,
    )


def group_logprobs(
    model,
    sequences: tuple,
    rows: slice,
    group_size: int,
    temperature: float,
    entropy=False,
    entropy_grad=False,
):
    """log π of the completions in `rows` (and their entropy, with its gradient if entropy_grad), each prompt encoded
    once for its group's rows: row r belongs to prompt r // G. sequences = (prompt_ids (P, S), prompt_mask (P, S),
    completion_ids (B, T)) -> (B_rows, T), and (B_rows, T) or None"""
    prompt_ids, prompt_mask, completion_ids = sequences
    groups = torch.arange(rows.start, rows.stop, device=completion_ids.device) // group_size
    prompts, repeats = torch.unique_consecutive(groups, return_counts=True)
    return common.completion_logprobs(
        model,
        prompt_ids[prompts],
        prompt_mask[prompts],
        completion_ids[rows],
        repeats,
        temperature,
        entropy,
        entropy_grad=entropy_grad,
    )


def micro_batch_weight(loss_agg: str, micro_mask: torch.Tensor, batch_tokens: int, batch_rows: int) -> float:
    """Weight of one micro-batch's loss so that the accumulated gradient equals the full batch's
    (every rank's): sequence-level aggregations average over sequences, so a micro-batch counts by
    its share of the batch's sequences; token-mean averages over tokens, so it counts by its share
    of the batch's tokens."""
    if loss_agg == "token-mean":
        return micro_mask.sum().item() / batch_tokens
    return micro_mask.shape[0] / batch_rows


def entropy_state(args, resumed) -> dict:
    """The entropy bonus's coefficient as a checkpoint keeps it ({"entropy_coef": c}): --entropy-coef at the start,
    a resumed run's own (adapted by --entropy-target) after."""
    return {"entropy_coef": resumed["entropy_coef"] if resumed else args.entropy_coef}
