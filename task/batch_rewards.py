"""A batch's reward as the GRPO family makes it from its parts, and the reward metrics TRL logs of it:

    r_i = Σ_k w_k clip(r_ik, -c_k, c_k) + overlong_i        (capped_rewards, weighted_rewards, overlong_penalty)

r_ik is the k-th of --rewards (task/rewards.py's terms, the verifier's 0/1, or the reward models' score), w_k its
--reward-weights, c_k its --reward-clip; overlong_i is DAPO's soft overlong punishment. Several reward models
(--reward-model A B C) score as one ensemble (learned_scores, ensemble_scores). grpo.py normalises the sum per group
into advantages; these functions only make the sum, so that its variants share them.
"""

from __future__ import annotations

from typing import Optional

import torch

import common


def capped_rewards(per_reward: torch.Tensor, caps: Optional[tuple[float, ...]]) -> torch.Tensor:
    """Each term r_ik clipped to [-c_k, c_k] (--reward-clip), so that one term (a learned score's tail) cannot
    outweigh the others however far it runs; as it is without caps. (B, K) -> (B, K)"""
    if not caps:
        return per_reward
    limit = per_reward.new_tensor(caps)  # (K,)
    return torch.maximum(torch.minimum(per_reward, limit), -limit)


def weighted_rewards(
    per_reward: torch.Tensor, weights: torch.Tensor, caps: Optional[tuple[float, ...]] = None
) -> torch.Tensor:
    """r_i = Σ_k w_k r_ik, as TRL sums, (B, K), (K,) -> (B,), each term capped first (capped_rewards). No r_k is
    normalised on its own first (that is GDPO's normalize-then-sum, grpo.py's gdpo_advantages): the policy then
    maximises Σ_k w_k r_k in the rewards' units, and a reward near constant in a group is not blown up by a tiny
    std."""
    return capped_rewards(per_reward, caps) @ weights


def weighted_sum(
    per_reward: torch.Tensor, weights: torch.Tensor, group_size: int, aggregation: str = "sum-then-normalize"
) -> torch.Tensor:
    """The reward of each completion from its terms, (B, K), (K,) -> (B,), as --multi-objective-aggregation says:
    sum-then-normalize  r_i = Σ_k w_k r_ik (TRL's default); grpo.py then normalises r in its group
    normalize-then-sum  r_i = Σ_k w_k (r_ik - mean_g(r_k)) / (std_g(r_k) + 1e-4), each term normalised in its group
                        of G first (0 where it is constant), GDPO (arXiv:2601.05242, TRL's normalize_then_sum), so
                        that a term of small spread (a format bonus beside correctness) keeps its weight's share
    GDPO then divides the sum by its std over the batch: grpo.py's --scale-rewards batch, which it requires (each
    group's r already has mean 0, so GRPO's group mean takes nothing more away, and a group whose every term is
    constant gets r = 0 and Â = 0 exactly, where TRL's batch-mean subtraction leaves a rounding residue)."""
    if aggregation == "sum-then-normalize":
        return per_reward @ weights
    grouped = per_reward.view(-1, group_size, per_reward.shape[1])  # (P, G, K)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    normalised = centred / (grouped.std(dim=1, unbiased=False, keepdim=True) + 1e-4)
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)  # (P, 1, K)
    return torch.where(constant, 0.0, normalised).reshape(per_reward.shape) @ weights


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO eq. 13, soft overlong punishment, (B,) -> (B,): 0 up to L_max - L_cache, then falling linearly to
    -penalty at L_max, where L_max = max_new_tokens and L_cache = buffer."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float)
    over = (lengths - (max_new_tokens - buffer)).clamp(min=0).float()
    return -penalty * (over / buffer).clamp(max=1.0)


def ensemble_scores(scores: torch.Tensor, aggregation: str) -> torch.Tensor:
    """K reward models' scores of a batch as one, (K, B) -> (B,). One model: its scores as they are. Several: each
    model's scores standardised over the batch, z_k = (s_k - mean(s_k)) / std(s_k), then their mean or min over k (the
    ensembles of Coste et al. 2024, arXiv:2310.02743: min is the worst case, a completion scores as its harshest
    judge). Standardised first, because models trained on other seeds score on other scales and min would otherwise
    pick the model with the lowest offset; over the batch, because GRPO's group baseline removes a shift common to
    the batch (ppo_overoptimisation.py, without a group, standardises by the starting policy's held-out scores)."""
    if scores.shape[0] == 1:
        return scores[0]
    spread = scores.std(dim=1, unbiased=False, keepdim=True).clamp(min=1e-6)  # (K, 1) each model's
    standardised = (scores - scores.mean(dim=1, keepdim=True)) / spread  # (K, B)
    if aggregation == "mean":
        return standardised.mean(dim=0)
    if aggregation == "min":
        return standardised.amin(dim=0)
    raise ValueError(f"unknown ensemble aggregation {aggregation!r}")


@torch.no_grad()
def learned_scores(
    reward_models: list, prompt_ids, prompt_mask, completion_ids, mask, group_size: int, aggregation: str
) -> Optional[torch.Tensor]:
    """The reward models' score of each prompt + completion, as one (ensemble_scores), (B,); None without a model.
    prompt_ids, prompt_mask (P, S) each prompt once; completion_ids, mask (B, T), G = group_size rows a prompt."""
    if not reward_models:
        return None
    input_ids = torch.cat([prompt_ids.repeat_interleave(group_size, 0), completion_ids], 1)  # (B, S+T)
    attention_mask = torch.cat([prompt_mask.repeat_interleave(group_size, 0), mask], 1)
    scores = [common.reward_scores(model, input_ids, attention_mask) for model in reward_models]
    return ensemble_scores(torch.stack(scores), aggregation)  # (K, B) -> (B,)


def reward_stats(rewards, scores, scored, names: tuple[str, ...], group_size: int, learned: bool) -> dict:
    """TRL's reward metrics of a batch, as floats: the reward (B,) and its spread within the groups, the score (B,)
    before any overlong penalty, each of --rewards (scored: tasks.Scored), and with a learned reward the verifier
    beside it (the true one)."""
    grouped = rewards.view(-1, group_size)  # (P, G)
    stats = {
        "reward": rewards.mean().item(),
        "reward_std": grouped.std(dim=1, unbiased=False).mean().item(),
        "frac_reward_zero_std": (grouped.amax(1) == grouped.amin(1)).float().mean().item(),
        "score": scores.mean().item(),
        **{f"rewards/{name}/mean": scored.rewards[:, k].mean().item() for k, name in enumerate(names)},
        "reward/unearned": sum(scored.unearned) / len(scored.unearned),
    }
    if learned:
        stats["verifier"] = scored.verified.mean().item()
    return stats
