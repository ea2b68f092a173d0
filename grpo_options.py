"""GRPO's catalogue: every later paper's option for its loss, advantages and rewards, one pure function each with its
equation, and a flat table from `--loss-type` to its function. A variant of grpo.py: its loop, copied, with the
rewards (phase 2), the advantages (phase 3), the loss (phase 5) and the log (phase 6) changed; every option of
grpo.py is its too. Copied from grpo.py unchanged: phases 1, 4 and 7 (tests/test_layout.py checks). grpo.py holds
GRPO's paper family (DeepSeekMath, DAPO, Dr. GRPO, R1's weighted rewards); an option of a later paper comes here.

The per-token policy losses (to be minimised; ρ_it = π_θ / π_θold, Â_i the advantage, sg() stops the gradient), the
table LOSSES, side by side:
    clip   max(-Â ρ, -Â clip(ρ, 1-ε_low, 1+ε_high))          GRPO's clip (grpo.clipped_surrogate)
    cispo  -sg(min(ρ, 1+ε_high)) Â log π                      CISPO (MiniMax 2025, arXiv:2506.13585, eq. 4)
    sapo   -Â σ(τ(ρ - 1)) 4/τ                                 SAPO (Qwen 2025, arXiv:2511.20347)
    vespo  -sg(φ(w_i)) Â log π,  w_i = Π_t ρ_it               VESPO (arXiv:2602.10693)
    luspo  the clip, each completion's loss × |o_i|           LUSPO (arXiv:2602.05261; with --importance-level sequence)
Beside the loss, each its own function:
- GSPO (Zheng et al. 2025, arXiv:2507.18071, eq. 5), `--importance-level sequence`: one ratio per completion,
  s_i = exp(1/|o_i| Σ_t log ρ_it), clipped whole (sequence_ratio; use far smaller eps, e.g. 3e-4 / 4e-4).
- INTELLECT-2 (arXiv:2505.07291), `--delta 4`: two-sided clipping, ρ capped at δ where Â < 0 too (two_sided_clip).
- The entropy: a bonus `--entropy-coef`, adapted each step toward `--entropy-target` (Skywork-OR1,
  arXiv:2505.22312; adapted_entropy_coef), and `--top-entropy-quantile 0.2` (Wang et al. 2025, arXiv:2506.01939): the
  policy gradient on the fifth of the tokens of highest entropy only (high_entropy_mask).
- Lite PPO (Liu et al. 2025, arXiv:2508.08221), `--scale-rewards batch`: the group's mean, the batch's std
  (batch_std_advantages).
- GDPO (arXiv:2601.05242), `--multi-objective-aggregation normalize-then-sum --scale-rewards batch`: each reward
  normalised in its group before the weighted sum (normalised_sum).
- Reward caps (`--reward-clip`, capped_rewards) and an ensemble of reward models (`--reward-model A B C`, mean or min
  of standardised scores; Coste et al. 2024, ensemble_scores).

Run:
    python grpo_options.py --loss-type cispo --num-iterations 2
    python grpo_options.py --importance-level sequence --eps-low 3e-4 --eps-high 4e-4       # GSPO
    python grpo_options.py --multi-objective-aggregation normalize-then-sum --scale-rewards batch  # GDPO
    python grpo_options.py --model tiny --steps 3 --loss-type sapo

Shapes: P prompts, G completions per prompt, B = P*G sequences, T completion tokens.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass
from typing import Annotated, Callable, Literal, NamedTuple, Optional

import torch

import common
import grpo
from infra import distributed
from infra import fsdp
from infra import metrics
from infra import models
from infra import runs
from infra import stepmetrics
from task import tasks
from common import masked_mean, masked_sum, require


@dataclass
class Args(grpo.Args):
    """GRPO with the later papers' options: the loss (--loss-type), the ratio's level, the entropy, the std of the
    advantages, several rewards normalised apart, capped rewards and several reward models."""

    reward_model: Annotated[Optional[tuple[str, ...]], runs.none_means("the verifier", "DIR ...")] = None
    """reward_model.py checkpoints to score completions with (as ppo.py does); several score as one ensemble
    (--reward-ensemble); the verifier is logged beside them"""
    reward_ensemble: Literal["mean", "min"] = "mean"
    """several --reward-model: each one's scores standardised over the batch, then their mean or min (the worst
    case; Coste et al. 2024)"""
    reward_clip: Annotated[Optional[tuple[float, ...]], runs.none_means("no cap", "FLOAT ...")] = None
    """a cap on each of --rewards, in their order: each is clipped to [-cap, cap] before the weighted sum"""
    multi_objective_aggregation: Literal["sum-then-normalize", "normalize-then-sum"] = "sum-then-normalize"
    """several --rewards: summed, then normalised in the group (GRPO; TRL's sum_then_normalize), or each normalised in
    its group, summed, and the sum divided by its std over the batch (GDPO, arXiv 2601.05242)"""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """the std Â is divided by: its group's (GRPO), the batch's (Lite PPO, arXiv 2508.08221), or none (Dr. GRPO)"""
    loss_type: Literal["clip", "cispo", "sapo", "vespo", "luspo"] = "clip"
    """the per-token policy loss, LOSSES: PPO's clip, CISPO, SAPO, VESPO or LUSPO (the module docstring's table)"""
    importance_level: Literal["token", "sequence"] = "token"
    """ρ per token (GRPO), or per completion (GSPO: exp(mean log ρ); use far smaller eps, e.g. 3e-4 / 4e-4)"""
    delta: Annotated[Optional[float], runs.none_means("off", "FLOAT")] = None
    """INTELLECT-2's two-sided clipping: ρ capped at delta where Â < 0 too (above 1 + eps_high; e.g. 4)"""
    sapo_temperatures: tuple[float, float] = (1.0, 1.05)
    """SAPO's τ for positive and for negative advantages (the paper's 1.0 and 1.05; τ_neg >= τ_pos)"""
    vespo_params: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0)
    """VESPO's k and λ for Â >= 0, then for Â < 0: φ(w) = w^k e^(λ(1 - w)) (TRL's values)"""
    entropy_coef: float = 0.0
    """an entropy bonus: -entropy_coef × each token's entropy in its loss (0 = off); with --entropy-target, its start"""
    entropy_target: Annotated[Optional[float], runs.none_means("a fixed --entropy-coef", "NATS")] = None
    """adaptive entropy control (Skywork-OR1): after each step the coefficient moves up by --entropy-coef-step while
    the batch's mean token entropy is at or below this, down while above"""
    entropy_coef_step: float = 0.005
    """adaptive entropy control: the coefficient's move a step (TRL's 0.005)"""
    entropy_coef_bounds: tuple[float, float] = (0.0, 1.0)
    """adaptive entropy control: the coefficient stays within [low, high] (TRL's 0 and 1)"""
    top_entropy_quantile: float = 1.0
    """only this share of the tokens, those of the highest entropy, carry the policy gradient (arXiv 2506.01939:
    0.2; 1 = all)"""


def check_args(args: Args) -> None:
    grpo.check_args(args)
    runs.check_options(
        args,
        divided_over_ranks="prompts_per_step",
        only_with={
            "sapo_temperatures": (args.loss_type == "sapo", "with --loss-type sapo"),
            "vespo_params": (args.loss_type == "vespo", "with --loss-type vespo"),
            "delta": (args.loss_type in ("clip", "luspo"), "with the clip: --loss-type clip or luspo"),
            "entropy_coef_step": (args.entropy_target is not None, "with --entropy-target"),
            "entropy_coef_bounds": (args.entropy_target is not None, "with --entropy-target"),
            "reward_ensemble": (len(args.reward_model or ()) > 1, "with several --reward-model"),
        },
    )
    require(
        args.loss_type != "luspo"
        or (args.importance_level, args.loss_agg) == ("sequence", "seq-mean-token-mean"),
        "--loss-type luspo needs --importance-level sequence, and sums each completion's tokens itself (leave "
        "--loss-agg at its default)",
    )
    require(
        args.loss_type != "vespo" or (args.importance_level == "token" and min(args.vespo_params) > 0),
        "--loss-type vespo weighs the whole completion itself (--importance-level token) with --vespo-params > 0",
    )
    require(
        args.multi_objective_aggregation == "sum-then-normalize" or args.scale_rewards == "batch",
        "--multi-objective-aggregation normalize-then-sum needs --scale-rewards batch (GDPO divides its sum of "
        "normalised rewards by their std over the batch)",
    )
    require(
        args.entropy_target is None or args.entropy_coef_step > 0 and min(args.entropy_coef_bounds) >= 0,
        "--entropy-target: --entropy-coef-step > 0 and --entropy-coef-bounds >= 0",
    )
    require(
        distributed.world_size() == 1 or len(args.reward_model or ()) < 2,
        "several --reward-model do not run under torchrun yet (each rank would standardise its own part)",
    )
    require(0 < args.top_entropy_quantile <= 1, "--top-entropy-quantile must be in (0, 1]")
    require(
        0 < args.sapo_temperatures[0] <= args.sapo_temperatures[1],
        f"--sapo-temperatures: τ_pos > 0 and τ_neg >= τ_pos, not {args.sapo_temperatures}",
    )
    require(
        args.scale_by_std or args.scale_rewards == "group",
        "--no-scale-by-std is --scale-rewards none: give one of the two",
    )
    require(
        distributed.world_size() == 1 or args.scale_rewards != "batch",
        "--scale-rewards batch does not run under torchrun yet (each rank would divide by its own part's std)",
    )
    require(
        args.delta is None or args.delta > 1 + args.eps_high,
        f"--delta must be above 1 + --eps-high ({1 + args.eps_high}), not {args.delta}",
    )
    caps = args.reward_clip or [1.0] * len(args.rewards)
    require(len(caps) == len(args.rewards) and min(caps) > 0, "--reward-clip: one cap > 0 per --rewards")


# ---------------------------------------------------------------------------------------------
# The rewards: caps, GDPO, reward-model ensembles
# ---------------------------------------------------------------------------------------------
def capped_rewards(per_reward: torch.Tensor, caps: tuple[float, ...]) -> torch.Tensor:
    """Each term r_ik clipped to [-c_k, c_k] (--reward-clip), so that one term (a learned score's tail) cannot
    outweigh the others however far it runs. (B, K) -> (B, K)"""
    limit = per_reward.new_tensor(caps)  # (K,)
    return torch.maximum(torch.minimum(per_reward, limit), -limit)


def normalised_sum(per_reward: torch.Tensor, weights: torch.Tensor, group_size: int) -> torch.Tensor:
    """GDPO (arXiv:2601.05242, TRL's normalize_then_sum), (B, K), (K,) -> (B,):
        r_i = Σ_k w_k (r_ik - mean_g(r_k)) / (std_g(r_k) + 1e-4)
    each term normalised in its group of G first (0 where it is constant), so that a term of small spread (a format
    bonus beside correctness) keeps its weight's share. GDPO then divides the sum by its std over the batch:
    --scale-rewards batch, which it requires (each group's r already has mean 0, so GRPO's group mean takes nothing
    more away, and a group whose every term is constant gets r = 0 and Â = 0 exactly, where TRL's batch-mean
    subtraction leaves a rounding residue)."""
    grouped = per_reward.view(-1, group_size, per_reward.shape[1])  # (P, G, K)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    normalised = centred / (grouped.std(dim=1, unbiased=False, keepdim=True) + 1e-4)
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)  # (P, 1, K)
    return torch.where(constant, 0.0, normalised).reshape(per_reward.shape) @ weights


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


# ---------------------------------------------------------------------------------------------
# The advantages: Lite PPO's batch std
# ---------------------------------------------------------------------------------------------
def batch_std_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """Lite PPO (Liu et al. 2025, arXiv:2508.08221): Â_i = (r_i - mean(r_group)) / (std(r_batch) + eps), the group's
    mean and the std of every reward given, so that a group of nearly equal rewards is not blown up by its own tiny
    std. A group whose rewards are all equal gets exactly zero, as in grpo.group_advantages. (N,) -> (N,)"""
    grouped = rewards.view(-1, group_size)  # (P, G)
    centered = (grouped - grouped.mean(dim=1, keepdim=True)) / (rewards.std(unbiased=False) + eps)
    all_equal = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)  # (P, 1)
    return torch.where(all_equal, 0.0, centered).reshape(-1)


# ---------------------------------------------------------------------------------------------
# The loss: the table of per-token policy losses, and what acts beside them
# ---------------------------------------------------------------------------------------------
class Knobs(NamedTuple):
    """The numbers the per-token losses of LOSSES read (each reads its own)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    delta: Optional[float] = None
    sapo_temperatures: tuple[float, float] = (1.0, 1.05)
    vespo_params: tuple = (2.0, 3.0, 3.0, 2.0)


def sequence_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's log s_i = 1/|o_i| Σ_t log ρ_it, the masked mean (padding must not count), for every token of o_i, the
    gradient through the mean. (B, T) -> (B, T)"""
    return masked_mean(log_ratio, mask, dim=1)[:, None].expand_as(log_ratio)


def two_sided_clip(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, delta: float
) -> torch.Tensor:
    """INTELLECT-2 (Prime Intellect 2025, arXiv:2505.07291, two-sided clipping): l_it = max(-Â min(ρ, δ), -Â clip(ρ,
    1-eps_low, 1+eps_high)): for Â < 0 the loss stops growing (and its gradient stops) at ρ = δ; for Â > 0 nothing
    changes (δ > 1+eps_high). (B, T), (B, 1) or (B, T) -> (B, T)"""
    unclipped = -adv * torch.clamp(ratio, max=delta)
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return torch.max(unclipped, clipped)


def vespo_weights(
    log_ratio: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, params: tuple
) -> torch.Tensor:
    """VESPO's weight (arXiv:2602.10693, as TRL computes it), no gradient: φ(w) = w^k e^(λ(1 - w)), a gamma density's
    shape scaled so that φ(1) = 1, with w = Π_t ρ_it the completion's whole ratio (log w = Σ_t log ρ_it, each log ρ
    clamped to [-20, 20] and the sum to [ln 1e-8, 20]) and (k, λ) = params[0:2] where Â >= 0, params[2:4] where Â < 0.
    (B, T) log ρ, (B, T) mask, (B, 1) or (B, T) Â -> φ of the advantage's shape"""
    summed = masked_sum(log_ratio.clamp(-20.0, 20.0), mask, dim=1)  # (B,) log w, each log ρ clamped
    log_w = summed.clamp(math.log(1e-8), 20.0)[:, None]  # (B, 1)
    k = torch.where(advantages >= 0, params[0], params[2])
    lam = torch.where(advantages >= 0, params[1], params[3])
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).detach()


# Each per-token loss: (ρ (B, T), Â (B, 1) or (B, T), log π_θ (B, T), log ρ per token (B, T), mask, Knobs) -> (B, T)
def clip_loss(ratio, adv, logprobs, log_ratio, mask, k: Knobs) -> torch.Tensor:
    """GRPO's clip, max(-Â ρ, -Â clip(ρ, 1-ε_low, 1+ε_high)); with δ, INTELLECT-2's two-sided clip."""
    if k.delta is None:
        return grpo.clipped_surrogate(ratio, adv, k.eps_low, k.eps_high)
    return two_sided_clip(ratio, adv, k.eps_low, k.eps_high, k.delta)


def cispo_loss(ratio, adv, logprobs, log_ratio, mask, k: Knobs) -> torch.Tensor:
    """CISPO (MiniMax-M1 eq. 4): l_it = -sg(min(ρ_it, 1+ε_high)) Â_i log π_θ(o_it): REINFORCE weighted by the
    truncated ratio, a constant, so every token keeps its gradient -w Â ∇log π; no lower bound (ε_low unused)."""
    return -torch.clamp(ratio, max=1.0 + k.eps_high).detach() * adv * logprobs


def sapo_loss(ratio, adv, logprobs, log_ratio, mask, k: Knobs) -> torch.Tensor:
    """SAPO (Qwen 2025, arXiv:2511.20347): l_it = -Â_i f(ρ_it), f(ρ) = σ(τ(ρ - 1)) · 4/τ, a soft gate in place of the
    clip: its slope is 1 at ρ = 1 (the surrogate's) and fades away from it, faster for Â < 0 (τ_neg > τ_pos)."""
    tau = torch.where(adv > 0, *k.sapo_temperatures)  # τ_pos where Â > 0, else τ_neg
    return -adv * torch.sigmoid(tau * (ratio - 1)) * 4 / tau


def vespo_loss(ratio, adv, logprobs, log_ratio, mask, k: Knobs) -> torch.Tensor:
    """VESPO (arXiv:2602.10693): l_it = -sg(φ_i) Â_i log π_θ(o_it), φ_i = vespo_weights: a smooth weight of the whole
    completion's ratio in place of the clip, 1 on-policy and falling away from it."""
    return -vespo_weights(log_ratio, mask, adv, k.vespo_params) * adv * logprobs


# --loss-type -> its per-token loss. LUSPO's tokens are GSPO's clip; it changes the aggregation (options_loss).
LOSSES = {"clip": clip_loss, "cispo": cispo_loss, "sapo": sapo_loss, "vespo": vespo_loss, "luspo": clip_loss}


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """1 on the tokens whose entropy is in the top `quantile` share of the masked tokens' (at or above their
    (1 - quantile) quantile, linearly interpolated as torch.quantile), 0 elsewhere. (B, T), (B, T) -> (B, T)"""
    threshold = torch.quantile(entropy[mask.bool()].float(), 1.0 - quantile)
    return (entropy >= threshold).to(mask.dtype) * mask


def adapted_entropy_coef(coef: float, entropy: float, target: float, step: float, bounds: tuple) -> float:
    """Skywork-OR1's adaptive entropy control (arXiv:2505.22312, §3.2.3; TRL's use_adaptive_entropy), once a step:
    c <- clip(c + Δ, low, high) while the batch's mean token entropy H <= target, clip(c - Δ, ...) above it."""
    moved = coef + step if entropy <= target else coef - step
    return min(max(moved, bounds[0]), bounds[1])


def options_loss(
    logprobs: torch.Tensor,  # (B, T) log π_θ, with gradient
    old_logprobs: torch.Tensor,  # (B, T) log π_θold, no gradient
    ref_logprobs: Optional[torch.Tensor],  # (B, T) log π_ref, or None when beta = 0
    advantages: torch.Tensor,  # (B,), or (B, T) per token
    mask: torch.Tensor,  # (B, T)
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.04,
    loss_agg: str = "seq-mean-token-mean",
    max_completion_length: Optional[int] = None,
    kl_kind: str = "k3",
    importance_level: str = "token",
    loss_type: str = "clip",
    delta: Optional[float] = None,  # INTELLECT-2's cap on ρ where Â < 0; None: off
    entropy: Optional[torch.Tensor] = None,  # (B, T) the policy's token entropy, with its gradient, or None
    entropy_coef: float = 0.0,  # the entropy bonus: -coef · H_it in each token's loss
    top_entropy_quantile: float = 1.0,  # the share of tokens, by entropy, that carry the policy gradient
    sapo_temperatures: tuple[float, float] = (1.0, 1.05),  # SAPO's τ for Â > 0 and for Â < 0
    vespo_params: tuple = (2.0, 3.0, 3.0, 2.0),  # VESPO's k and λ for Â >= 0, then for Â < 0
) -> tuple[torch.Tensor, dict]:
    """grpo.grpo_loss with the catalogue's options, to be minimised: ρ per token or per completion (GSPO,
    sequence_ratio), the per-token policy loss LOSSES[loss_type], the policy-gradient term kept on the tokens of
    highest entropy only (top_entropy_quantile < 1; the KL stays on every token, as TRL), the entropy bonus
    (l_it - c H_it, aggregated as the rest, so it means the same under every loss_agg), grpo.py's KL, and the
    aggregation: grpo.aggregate_loss, or LUSPO's (each completion's tokens summed: its mean loss times its length
    |o_i|, then the mean over completions, so that a long completion is not worth less per token; loss_agg unused).
    Returns (loss, metrics) as grpo.grpo_loss (CISPO's clip_ratio counts only the tokens with Â > 0 whose weight was
    cut, as TRL)."""
    if importance_level not in ("token", "sequence") or loss_type not in LOSSES:
        raise ValueError(f"unknown importance_level {importance_level!r} or loss_type {loss_type!r}")
    log_ratio = logprobs - old_logprobs  # (B, T) log ρ_it
    ratio = torch.exp(sequence_ratio(log_ratio, mask) if importance_level == "sequence" else log_ratio)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    knobs = Knobs(eps_low, eps_high, delta, sapo_temperatures, vespo_params)
    per_token = LOSSES[loss_type](ratio, adv, logprobs, log_ratio, mask, knobs)  # (B, T)
    # CISPO has no lower bound: no token counts as clipped below
    stats = stepmetrics.clip_fractions(
        ratio, adv, mask, math.inf if loss_type == "cispo" else eps_low, eps_high
    )
    if top_entropy_quantile < 1.0:
        per_token = per_token * high_entropy_mask(entropy.detach(), mask, top_entropy_quantile)
    if entropy_coef != 0.0:
        per_token = per_token - entropy_coef * entropy
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("beta != 0 needs ref_logprobs")
        if kl_kind == "k1":
            raise ValueError("k1 in the loss has zero expected gradient; use k3 or k2 (see grpo.kl_estimate)")
        kl = grpo.kl_estimate(logprobs, ref_logprobs, kl_kind)
        per_token = per_token + beta * kl
        stats["kl"] = masked_mean(kl.detach(), mask).item()
    if loss_type == "luspo":
        return masked_sum(per_token, mask, dim=1).mean(), stats
    return grpo.aggregate_loss(per_token, mask, loss_agg, max_completion_length), stats


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args, reward_fn: Optional[Callable[[str, str], float]] = None) -> dict:
    """Train with GRPO and the catalogue's options; returns the final metrics (also in eval.json), as grpo.main."""
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    reward_fn = reward_fn or tasks.VERIFIERS[args.verifier]
    models.set_seed(args.seed)
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    train_stream, heldout = tasks.load_problems(
        args.dataset, args.seed, args.eval_size, args.prompts_per_step
    )
    # DeepSeek-R1's template: <think> … </think><answer> … </answer>, held-out too
    if args.prompt_style == "r1":
        train_stream, heldout = tasks.with_prompt_style("r1", train_stream, heldout)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    policy, ref_model = models.load_policy(
        args, tokenizer, device, precision, kernels_on, resumed, args.beta != 0
    )
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout), args.max_new_tokens)
    reward_models = [
        models.load_reward_model(path, tokenizer, device, precision, kernels_on)
        for path in args.reward_model or ()
    ]
    fsdp.shard(args.run.fsdp, policy, ref_model, *reward_models)  # --fsdp: 1/N of each model's weights
    optimizer, scheduler = common.make_optimizer(
        policy, args.lr, args.weight_decay, args.warmup_steps, args.steps if args.lr_decay else 0
    )
    generator = torch.Generator(device=device).manual_seed(args.seed + distributed.rank())
    G = args.group_size

    run = runs.Run(args, "grpo-options", tokenizer, device, resumed)
    # the entropy bonus's coefficient, adapted each step by --entropy-target, is in the checkpoint
    adaptive = {"entropy_coef": resumed["entropy_coef"] if resumed else args.entropy_coef}
    run.checkpointed(policy, generator, optimizer=optimizer, scheduler=scheduler, extra=adaptive.copy)
    train_stream = itertools.islice(train_stream, (run.first_step - 1) * args.prompts_per_step, None)

    evaluate = functools.partial(
        tasks.evaluate_policy, policy, tokenizer, heldout, args.max_new_tokens, args.seed
    )
    # the entropy at every iteration, with its gradient, when the loss reads it
    bonus = args.entropy_coef != 0 or args.entropy_target is not None
    loss_reads_entropy = bonus or args.top_entropy_quantile < 1

    run.begin(evaluate)
    for step in range(run.first_step, args.steps + 1):
        # ---- 1. sample G completions per prompt from the current policy -------------------------
        t0 = time.time()
        problems = distributed.share([next(train_stream) for _ in range(args.prompts_per_step)])  # P/N a rank
        prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in problems], device)
        policy.eval()
        # (B, T) each: the tokens, and their log-probs as the sampler drew them
        completion_ids, sampler_logprobs = common.sample_with_logprobs(
            policy,
            prompt_ids,
            prompt_mask,
            G,
            args.max_new_tokens,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            args.temperature,
            args.top_p,
            generator,
        )
        mask = common.completion_mask(completion_ids, tokenizer.eos_token_id)  # (B, T), EOS included
        time_generate = time.time() - t0

        # ---- 2. score with each of --rewards, capped, then summed or normalised apart (GDPO) ------
        texts = tasks.decode_completions(tokenizer, completion_ids, mask)
        answers = [p.answer for p in problems for _ in range(G)]
        # the reward models' scores (B,), one model's or the ensemble's, in place of the verifier's
        learned = None
        if reward_models:
            each = [
                grpo.learned_scores(m, prompt_ids, prompt_mask, completion_ids, mask, G)
                for m in reward_models
            ]
            learned = ensemble_scores(torch.stack(each), args.reward_ensemble)  # (K, B) -> (B,)
        scored = tasks.score_completions(texts, answers, args.rewards, reward_fn, device, learned)
        runs.check_rewards(scored.rewards, step)
        per_reward = scored.rewards  # (B, K)
        if args.reward_clip is not None:
            per_reward = capped_rewards(per_reward, args.reward_clip)
        weights = per_reward.new_tensor(args.reward_weights or [1.0] * len(args.rewards))  # (K,)
        # GDPO: each r_k normalised in its group first
        if args.multi_objective_aggregation == "normalize-then-sum":
            scores = normalised_sum(per_reward, weights, G)
        else:
            scores = per_reward @ weights  # (B,) Σ_k w_k r_ik
        lengths = mask.sum(1)  # (B,)
        rewards = scores
        if args.overlong_buffer > 0:  # DAPO's soft overlong punishment
            rewards = scores + grpo.overlong_penalty(
                lengths, args.max_new_tokens, args.overlong_buffer, args.overlong_penalty
            )

        # ---- 3. group-relative advantages, the std of the group, of the batch or none -----------
        if args.scale_rewards == "batch":
            advantages = batch_std_advantages(rewards, G)  # (B,)
        else:  # --no-scale-by-std is --scale-rewards none
            advantages = grpo.group_advantages(
                rewards, G, args.scale_by_std and args.scale_rewards == "group"
            )
        stats = metrics.reward_stats(rewards, scores, scored, args.rewards, G, learned is not None)
        stats.update(metrics.completion_stats(completion_ids, mask, tokenizer.eos_token_id, G, time_generate))
        if args.dynamic_sampling:  # DAPO: drop the groups whose every advantage is 0 (equal rewards)
            keep_groups = (advantages.view(len(problems), -1) != 0).any(1)  # (P,)
            keep = keep_groups.repeat_interleave(G)  # (B,)
            width = int((mask * keep[:, None]).sum(1).max())  # the columns padding in every kept row go
            prompt_ids = prompt_ids[keep_groups]
            prompt_mask = prompt_mask[keep_groups]
            completion_ids = completion_ids[keep, :width]
            mask = mask[keep, :width]
            sampler_logprobs = sampler_logprobs[keep, :width]
            advantages = advantages[keep]
        # DAPO's overlong filtering: a completion cut at the limit has no loss
        if args.mask_truncated_completions:
            mask = mask * grpo.completion_ended(completion_ids, tokenizer.eos_token_id)[:, None]
        B = completion_ids.shape[0]
        t1 = time.time()

        # ---- 4. old and reference log-probs, once per batch -------------------------------------
        # a batch left with no group (dynamic sampling) makes no update, but counts as a step
        if B > 0:
            # the batch's rows: each kept prompt once, and its G completions
            sequences = (prompt_ids, prompt_mask, completion_ids)
            micro = min(args.batch_size or B, B)
            slices = [slice(i, min(i + micro, B)) for i in range(0, B, micro)]
            batch_tokens = distributed.all_sum(mask.sum()).clamp(min=1)  # every rank's (1: every row masked)
            batch_rows = distributed.all_sum(B)
            with torch.no_grad():
                # μ = 1: π_θold is the current π, old = current.detach() below (ρ = 1 exactly); μ > 1: frozen here
                old_logprobs = None
                if args.num_iterations > 1:
                    old_logprobs = torch.cat(
                        [grpo.group_logprobs(policy, sequences, s, G, args.temperature)[0] for s in slices]
                    )
                ref_logprobs = None
                if args.beta != 0.0:
                    with common.reference(policy, ref_model) as ref:
                        ref_logprobs = torch.cat(
                            [grpo.group_logprobs(ref, sequences, s, G, args.temperature)[0] for s in slices]
                        )

            # ---- 5. μ policy updates on this batch, with the catalogue's loss ----------------------
            policy.train()
            sums = stepmetrics.MicroBatchSums(batch_tokens, args.num_iterations)
            trainer_logprobs = []  # π_θold's, the trainer's at the update's start, a micro-batch each
            for iteration in range(args.num_iterations):
                for s in slices:
                    logprobs, entropy = grpo.group_logprobs(
                        policy, sequences, s, G, args.temperature, iteration == 0 or loss_reads_entropy, bonus
                    )
                    old = old_logprobs[s] if old_logprobs is not None else logprobs.detach()
                    loss, m = options_loss(
                        logprobs,
                        old,
                        ref_logprobs[s] if ref_logprobs is not None else None,
                        advantages[s],
                        mask[s],
                        eps_low=args.eps_low,
                        eps_high=args.eps_high,
                        beta=args.beta,
                        loss_agg=args.loss_agg,
                        max_completion_length=args.max_new_tokens,
                        kl_kind=args.kl_estimator,
                        importance_level=args.importance_level,
                        loss_type=args.loss_type,
                        delta=args.delta,
                        entropy=entropy,
                        entropy_coef=adaptive["entropy_coef"],
                        top_entropy_quantile=args.top_entropy_quantile,
                        sapo_temperatures=args.sapo_temperatures,
                        vespo_params=args.vespo_params,
                    )
                    run.check_finite(loss, step)
                    weight = grpo.micro_batch_weight(args.loss_agg, mask[s], int(batch_tokens), batch_rows)
                    (loss * weight).backward()
                    # kl, clip_ratio: token means over the whole batch; the entropy logged: iteration 0's, the sampler's
                    sums.add(m, mask[s], loss, weight, entropy if iteration == 0 else None)
                    if iteration == 0:
                        trainer_logprobs.append(old)
                distributed.all_reduce_grads(policy)
                grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
                run.check_finite(grad_norm, step, "gradient norm")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if args.entropy_target is not None:  # the next step's coefficient, toward the target
                adaptive["entropy_coef"] = adapted_entropy_coef(
                    adaptive["entropy_coef"],
                    sums.totals()["entropy"],
                    args.entropy_target,
                    args.entropy_coef_step,
                    args.entropy_coef_bounds,
                )
        stats["lr"] = scheduler.get_last_lr()[0]
        scheduler.step()
        time_train = time.time() - t1

        # ---- 6. log, with the entropy bonus's coefficient ---------------------------------------
        if B > 0:
            stats.update(sums.totals())
            stats.update(common.mismatch_metrics(torch.cat(trainer_logprobs), sampler_logprobs, mask))
            stats["grad_norm"] = grad_norm.item()
            stats.update(adaptive)
        else:
            stats["skipped"] = 1
        # time/train, time/step and the tokens a second sampled and trained
        stats.update(metrics.speeds(t0, time_train, lengths.sum(), mask.sum() * args.num_iterations))
        stats = distributed.mean_over_ranks(stats)
        run.log(step, stats, ("reward", "completion_length", "kl", "skipped"))

        # ---- 7. evaluate and checkpoint -----------------------------------------------------------
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(evaluate, tasks.before_and_after)


if __name__ == "__main__":
    runs.cli(main, Args)
