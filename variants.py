"""Variants of DPO and of critic-free RL: IPO, KTO, SimPO, ORPO (offline) and RLOO, ReMax, REINFORCE++ (online).

The offline four train on the same preference data as dpo.py (the model's own samples, labelled by
the verifier; KTO sees them unpaired) and differ only in the loss on sequence log-probs. The online
ones sample from the policy, score with the verifier minus a KL penalty to the reference, and take a
REINFORCE step with a baseline that needs no critic: the other samples of the prompt (RLOO), the
greedy completion's reward (ReMax), or the whole batch's mean and std (REINFORCE++, per token; its
baseline form first subtracts the prompt's mean score). Every run is evaluated like the others:
held-out greedy accuracy by the verifier, before and after.

Losses (y_w chosen, y_l rejected, log π(y|x) summed over completion tokens unless said):
  IPO    (Azar et al. 2024, arXiv:2310.12036, eq. 17):  (h - 1/(2τ))²,
         h = log π(y_w)/π_ref(y_w) - log π(y_l)/π_ref(y_l)
  KTO    (Ethayarajh et al. 2024, arXiv:2402.01306, eq. 8):  λ_D (1 - σ(β(r - z0))) for desirable y,
         λ_U (1 - σ(β(z0 - r))) for undesirable y,  r = log π(y|x)/π_ref(y|x),  z0 = max(0, KL estimate), detached
  SimPO  (Meng et al. 2024, arXiv:2405.14734, eq. 6):  -log σ( β/|y_w| log π(y_w) - β/|y_l| log π(y_l) - γ ),
         no reference
  ORPO   (Hong et al. 2024, arXiv:2403.07691, eq. 6-7):  L_SFT(y_w) + λ · -log σ( log odds(y_w) - log odds(y_l) ),
         no reference;  odds(y) = P(y)/(1 - P(y)) with log P(y) the *mean* token log-prob
  RLOO   (Ahmadian et al. 2024, arXiv:2402.14740, eq. 6):  A_i = r_i - 1/(k-1) Σ_{j≠i} r_j
  ReMax  (Li et al. 2024, arXiv:2310.10505, Alg. 1):  A_i = r_i - r(x, ȳ), ȳ the greedy completion of x
  REINFORCE++ (Hu 2025, arXiv:2501.03262):  r_t = -β (log π - log π_ref)_t on every token, + r(x, y) on the last;
         G_t = Σ_{s>=t} r_s (γ = 1);  A_t = (G_t - mean G) / std G over every completion token of the batch;
         baseline form (REINFORCE++-baseline): r(x, y) - the mean score of its prompt's k samples, then as above
         KL in the loss instead (--kl-placement loss): r_t without it, + β · token-mean ½ (log π - log π_ref)_t²

Conventions a reader could get wrong (each pinned by a test):
- IPO uses *summed* log-probs here, as the paper's h; TRL's IPO averages over tokens instead,
  which changes what τ means (a margin per token instead of per sequence).
- KTO's z0 is estimated from mismatched pairs in the batch (prompt i with completion i+1), as in
  the paper's implementation and TRL: the mean of log π/π_ref over them, clamped at 0 and detached.
  The pairs are unpaired: each gives one desirable and one undesirable sample.
- SimPO's β scales the *length-normalised* log-probs and γ is subtracted after: the margin is in
  reward units, not divided by β.
- ORPO's odds use the mean token log-prob, and its SFT term is the mean token NLL of y_w.
- RLOO and ReMax: the reward is the verifier's score minus β·Σ_t (log π - log π_ref) of the whole
  sequence (the KL enters the reward, as in both papers), and the update is one REINFORCE step on
  the summed log-prob, without importance ratio or clipping (the batch is used once). ReMax's
  greedy baseline is the verifier's score of the greedy completion, without a KL term.
- RLOO and ReMax sample from the full softmax at --temperature (no top-p, no top-k) and score with
  the same full-softmax log-probs, so the update is on-policy. There is no --top-p on purpose:
  sampling with top-p < 1 but scoring with full-softmax log-probs would make every update
  off-policy by the truncated mass, with no importance ratio here to correct it.
- REINFORCE++ follows OpenRLHF (advantage_estimator reinforce / reinforce_baseline): the baseline form centres
  the *score* in its prompt's group, and the whitening is over all completion tokens of the batch with the
  population std. verl divides by the sample std, and its baseline form copies the group-centred sum of a
  sequence's token rewards to every token (no reward to go). The loss is the token mean of -A_t log π_t over the
  batch: one step per batch, so PPO's ratio is 1.
- REINFORCE++'s KL goes where --kl-placement says. reward (reinforce_pp's default): -β·k1 in each token's reward,
  as in OpenRLHF's REINFORCE++ and in ms-swift's and RLinf's write-ups of the baseline form. loss (the default of
  reinforce_pp_baseline): what OpenRLHF's own scripts for the baseline form run (--use_kl_loss --kl_estimator k2 in
  train_reinforce_baseline_*.sh and ProRL v2), advantages free of the KL and β · the token mean of k2 in the loss.
  OpenRLHF clamps each token's k1 or k2 to [-10, 10]; this file does not.
- A non-finite score from the reward function stops the run with a message that names the reward,
  before it becomes a NaN loss (whose message would blame the learning rate).

Under `torchrun --nproc_per_node N` a rank takes P/N of the pairs or prompts (whole groups) and its part of the batch's
loss (REINFORCE++: whitened over every rank's tokens, their token mean); ranks sum gradients. Not KTO (z0 spans ranks).

Run:
    python variants.py --algo simpo             # embedded model, the preference data of dpo.py
    python variants.py --algo rloo              # embedded model, verifier reward
    torchrun --nproc_per_node 2 variants.py --algo reinforce_pp_baseline --model tiny --steps 3
    python variants.py --algo kto --model tiny --dataset tests/data/pairs.jsonl --steps 3
    python variants.py --help

Shapes: P pairs or prompts, B sequences, k samples per prompt, T completion tokens.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Annotated, Literal, Optional

import torch
import torch.nn.functional as F

import common
from infra import distributed
from infra import fsdp
from infra import metrics
from infra import models
from infra import runs
from task import preferences, tasks
from common import InputError, masked_mean, masked_sum, masked_whiten, require
from task.preferences import sequence_logps

OFFLINE = ("ipo", "kto", "simpo", "orpo")
REINFORCE_PP = ("reinforce_pp", "reinforce_pp_baseline")  # per-token advantages; the others' are per sequence
# The β of each algorithm means something different: IPO's τ, KTO's β, SimPO's β, ORPO's λ, the online KL coefficient.
DEFAULT_BETA = {
    "ipo": 0.1,
    "kto": 0.1,
    "simpo": 2.0,
    "orpo": 0.1,
    "rloo": 0.05,
    "remax": 0.05,
    "reinforce_pp": 0.05,
    "reinforce_pp_baseline": 0.05,
}
DEFAULT_LR = {
    "ipo": 5e-6,
    "kto": 5e-6,
    "simpo": 5e-6,
    "orpo": 5e-6,
    "rloo": 1e-5,
    "remax": 1e-5,
    "reinforce_pp": 1e-5,
    "reinforce_pp_baseline": 1e-5,
}


@dataclass
class Args:
    """One variant, chosen with --algo."""

    # ---- experiment: which variant, what to train and how it is evaluated ----------------------------------------
    algo: Literal["ipo", "kto", "simpo", "orpo", "rloo", "remax", "reinforce_pp", "reinforce_pp_baseline"]
    """offline on preference pairs: ipo, kto, simpo, orpo; online with the verifier reward: rloo, remax, reinforce_pp,
    reinforce_pp_baseline"""
    model: str = "smollm2"
    """smollm2 (embedded SmolLM2-135M-Instruct), tiny (random, for smoke runs), or a hub id / local checkpoint"""
    dataset: Annotated[Optional[str], runs.none_means("the built-in task", "FILE|DIR|HUB-ID")] = None
    """offline: JSONL with prompt, chosen, rejected; online: JSONL with prompt, answer; or a Hugging Face dataset with
    those fields (a save_to_disk folder or a Hub id)"""
    seed: int = 0
    """seed for data, sampling and initialisation"""
    eval_every: int = 0
    """evaluate and save a checkpoint every this many steps (0 = only before and after)"""
    eval_size: Annotated[Optional[int], runs.none_means("200; 16 for the tiny random models", "INT")] = None
    """held-out problems for greedy accuracy (verifier reward)"""
    pass_k: Annotated[Optional[int], runs.none_means("8; 0 (off) for the tiny random models", "INT")] = None
    """pass@k at the first and last evaluation: k samples a held-out problem at temperature 1 (0 = off)"""
    # ---- algorithm: the variant's loss ---------------------------------------------------------------------------
    steps: int = 60
    """optimizer steps"""
    batch_size: int = 8
    """offline: preference pairs per step (KTO: their 2× unpaired samples); online: prompts per step"""
    beta: Annotated[Optional[float], runs.none_means("the value in brackets for the --algo", "FLOAT")] = None
    """IPO τ (0.1), KTO β (0.1), SimPO β (2.0), ORPO λ (0.1), RLOO/ReMax/REINFORCE++ KL coefficient (0.05)"""
    simpo_gamma: float = 0.5
    """SimPO's target margin γ, in reward units (subtracted after β scales the log-probs)"""
    desirable_weight: float = 1.0
    """KTO λ_D, the weight of desirable samples"""
    undesirable_weight: float = 1.0
    """KTO λ_U, the weight of undesirable samples"""
    desirable_fraction: float = 1.0
    """KTO on imbalanced data: the desirable sample of only this fraction of each batch's pairs counts (the paper
    keeps λ_D·n_D / λ_U·n_U in [1, 4/3], so raise --desirable-weight to match)"""
    group_size: int = 4
    """RLOO, REINFORCE++: samples per prompt, k (>= 2 for rloo and reinforce_pp_baseline; ReMax takes one sample and
    one greedy completion)"""
    kl_placement: Annotated[
        Optional[Literal["reward", "loss"]],
        runs.none_means("loss for reinforce_pp_baseline, else reward", "{reward,loss}"),
    ] = None
    """REINFORCE++: where the KL goes. reward: -β (log π - log π_ref) in each token's reward (k1); loss: advantages
    without it, + β × the token mean of ½ (log π - log π_ref)² (k2) in the loss, as OpenRLHF's baseline scripts"""
    # ---- data and generation: the preference data (offline) and sampling (online) --------------------------------
    num_prompts: int = 512
    """offline: distinct arithmetic prompts sampled for the preference data (the same cache as dpo.py)"""
    samples_per_prompt: int = 8
    """offline: completions sampled per prompt for the preference data"""
    temperature: float = 0.7
    """offline: temperature of the preference data; online: the sampling temperature (1.0 is typical)"""
    max_new_tokens: int = 32
    """completion length limit when sampling and in evaluation"""
    max_completion_tokens: int = 256
    """offline: completions of --dataset pairs longer than this are cut"""
    # ---- optimisation: the optimizer, memory and saving ----------------------------------------------------------
    lr: Annotated[
        Optional[float], runs.none_means("5e-6 offline (as dpo.py), 1e-5 online (as grpo.py)", "FLOAT")
    ] = None
    """AdamW learning rate"""
    warmup_steps: int = 5
    """linear learning-rate warm-up steps"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass to save memory"""
    run: Annotated[runs.RunOptions, runs.FlatFlags] = runs.option_group(runs.RunOptions)
    lora: Annotated[common.LoraOptions, runs.FlatFlags] = runs.option_group(common.LoraOptions)


# ---------------------------------------------------------------------------------------------
# The math
# ---------------------------------------------------------------------------------------------
def ipo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, tau: float):
    """IPO (Azar et al. 2024, eq. 17): (h - 1/(2τ))² per pair, h the DPO log-ratio difference. All (P,).

    Returns (losses, chosen_rewards, rejected_rewards) like dpo_loss, rewards = τ log π/π_ref (detached).
    """
    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    h = chosen_logratios - rejected_logratios
    losses = (h - 1.0 / (2.0 * tau)) ** 2
    return losses, tau * chosen_logratios.detach(), tau * rejected_logratios.detach()


def kto_loss(
    policy_logps,
    ref_logps,
    desirable,
    policy_kl_logps,
    ref_kl_logps,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
):
    """KTO (Ethayarajh et al. 2024, eq. 8) per sample. policy_logps, ref_logps, desirable (bool): (B,);
    policy_kl_logps, ref_kl_logps: (B,) log-probs of mismatched (prompt, completion) pairs for z0.

    r = log π(y|x) - log π_ref(y|x);  z0 = max(0, mean(log π(y'|x) - log π_ref(y'|x))), detached
    desirable:   λ_D (1 - σ(β (r - z0)));   undesirable:   λ_U (1 - σ(β (z0 - r)))
    Returns (losses (B,), rewards β r (B,) detached, z0 (scalar)).
    """
    z0 = (policy_kl_logps - ref_kl_logps).mean().clamp(min=0).detach()
    r = policy_logps - ref_logps
    losses = torch.where(
        desirable,
        desirable_weight * (1 - torch.sigmoid(beta * (r - z0))),
        undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r))),
    )
    return losses, beta * r.detach(), z0


def simpo_loss(
    policy_chosen_logps, policy_rejected_logps, chosen_lengths, rejected_lengths, beta: float, gamma: float
):
    """SimPO (Meng et al. 2024, eq. 6): -log σ(β/|y_w| log π(y_w) - β/|y_l| log π(y_l) - γ). All (P,); no reference.
    Returns (losses, chosen_rewards, rejected_rewards) with rewards β/|y| log π(y) (detached)."""
    chosen_rewards = beta * policy_chosen_logps / chosen_lengths
    rejected_rewards = beta * policy_rejected_logps / rejected_lengths
    losses = -F.logsigmoid(chosen_rewards - rejected_rewards - gamma)
    return losses, chosen_rewards.detach(), rejected_rewards.detach()


def orpo_loss(policy_chosen_logps, policy_rejected_logps, chosen_lengths, rejected_lengths, lam: float):
    """ORPO (Hong et al. 2024, eq. 6-7): mean-token NLL of y_w + λ · -log σ(log odds(y_w) - log odds(y_l)). All (P,).

    log P(y) = log π(y|x) / |y| (mean token log-prob), log odds(y) = log P - log(1 - P).
    Returns (losses, chosen_rewards, rejected_rewards) with rewards λ·log P (detached), as TRL logs them."""
    chosen_mean = policy_chosen_logps / chosen_lengths
    rejected_mean = policy_rejected_logps / rejected_lengths
    # log(1 - P) = log(-expm1(log P)), exact for P near 0 and near 1
    log_odds = (chosen_mean - torch.log(-torch.expm1(chosen_mean))) - (
        rejected_mean - torch.log(-torch.expm1(rejected_mean))
    )
    losses = -chosen_mean - lam * F.logsigmoid(log_odds)
    return losses, lam * chosen_mean.detach(), lam * rejected_mean.detach()


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """A_i = r_i - mean of the other k-1 rewards of the same prompt (Ahmadian et al. 2024). (N,) -> (N,)"""
    grouped = rewards.view(-1, group_size)  # (P, k)
    baseline = (grouped.sum(1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - baseline).reshape(-1)


def remax_advantages(rewards: torch.Tensor, greedy_rewards: torch.Tensor) -> torch.Tensor:
    """A_i = r_i - r(x, ȳ) with ȳ the greedy completion of sample i's prompt (Li et al. 2024). rewards (N,) with N/P
    consecutive samples per prompt, greedy_rewards (P,) -> (N,)"""
    return rewards - greedy_rewards.repeat_interleave(len(rewards) // len(greedy_rewards))


def reinforce_pp_advantages(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    group_size: Optional[int] = None,
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025) as OpenRLHF computes it: the KL-penalised reward to go, whitened over the whole batch.

    r_t = -β (log π_t - log π_ref,t) on every completion token, + the score on the last one (EOS, or the cut)
    G_t = Σ_{s>=t} r_s  (γ = 1);   A_t = (G_t - mean G) / std G, over every completion token of the batch
    (population std), never per prompt. With group_size k, the baseline form: each score first loses the mean
    score of its prompt's k consecutive samples. scores (B,), logprobs and ref_logprobs (B, T) (detached),
    mask (B, T) -> A (B, T), 0 on padding.
    """
    if group_size is not None:
        grouped = scores.view(-1, group_size)  # (P, k)
        scores = (grouped - grouped.mean(1, keepdim=True)).reshape(-1)  # (B,)
    rewards = -beta * (logprobs - ref_logprobs) * mask  # (B, T) k1 per token, a penalty; padding gets 0
    last = (mask.sum(1) - 1).clamp(min=0)  # (B,) index of the last completion token
    rewards[torch.arange(len(scores), device=scores.device), last] += scores
    returns = rewards.flip(1).cumsum(1).flip(1)  # (B, T) G_t; padding after the last token adds nothing
    # (B, T) one mean and std for all valid tokens, every rank's
    return masked_whiten(returns, mask, all_sum=distributed.all_sum) * mask


def reinforce_pp_loss(
    advantages, logprobs, ref_logprobs, mask, beta: float, kl_placement: str
) -> torch.Tensor:
    """mean_t -A_t log π_t, + β mean_t ½ (log π_t - log π_ref,t)² (k2, OpenRLHF's --use_kl_loss --kl_estimator k2)
    with kl_placement "loss": both token means over the batch's completion tokens, as OpenRLHF's token-level loss.
    k2's gradient is (log π_t - log π_ref,t) ∇log π_t. All (B, T), logprobs with their gradient -> a scalar."""
    loss = -masked_mean(advantages * logprobs, mask)
    if kl_placement == "loss":
        # (B, T) k2, padding left out
        loss = loss + beta * masked_mean(0.5 * (logprobs - ref_logprobs) ** 2, mask)
    return loss


# ---------------------------------------------------------------------------------------------
# Sequence log-probs
# ---------------------------------------------------------------------------------------------
def offline_loss(
    args: Args, beta: float, policy, ref_model, tokenizer, pairs: list[dict]
) -> tuple[torch.Tensor, dict]:
    """The mean loss of one batch of pairs and its metrics, for ipo, simpo, orpo (paired) or kto (unpaired)."""
    prompts = [p["prompt"] for p in pairs]
    texts, finished = preferences.pair_completions(pairs)  # chosen_0, rejected_0, chosen_1, ...
    # (2P,)
    logps, lengths = sequence_logps(policy, tokenizer, prompts, texts, args.max_completion_tokens, finished)
    chosen, rejected = logps[0::2], logps[1::2]
    if args.algo in ("ipo", "kto"):
        with torch.no_grad(), common.reference(policy, ref_model) as ref:
            ref_logps, _ = sequence_logps(
                ref, tokenizer, prompts, texts, args.max_completion_tokens, finished
            )
    if args.algo == "ipo":
        losses, chosen_rewards, rejected_rewards = ipo_loss(
            chosen, rejected, ref_logps[0::2], ref_logps[1::2], beta
        )
    elif args.algo == "simpo":
        losses, chosen_rewards, rejected_rewards = simpo_loss(
            chosen, rejected, lengths[0::2], lengths[1::2], beta, args.simpo_gamma
        )
    elif args.algo == "orpo":
        losses, chosen_rewards, rejected_rewards = orpo_loss(
            chosen, rejected, lengths[0::2], lengths[1::2], beta
        )
    else:  # kto: the 2P samples unpaired; z0 from each prompt with the next pair's completions
        shifted = texts[2:] + texts[:2]
        shifted_finished = finished[2:] + finished[:2]
        with torch.no_grad():  # z0 is a detached reference point
            kl_logps, _ = sequence_logps(
                policy, tokenizer, prompts, shifted, args.max_completion_tokens, shifted_finished
            )
            with common.reference(policy, ref_model) as ref:
                ref_kl_logps, _ = sequence_logps(
                    ref, tokenizer, prompts, shifted, args.max_completion_tokens, shifted_finished
                )
        desirable = torch.tensor([True, False] * len(pairs), device=logps.device)
        losses, rewards, z0 = kto_loss(
            logps,
            ref_logps,
            desirable,
            kl_logps,
            ref_kl_logps,
            beta,
            args.desirable_weight,
            args.undesirable_weight,
        )
        chosen_rewards, rejected_rewards = rewards[0::2], rewards[1::2]
        # imbalanced data: only the first ⌈f·P⌉ pairs' desirable samples count (the batch is shuffled)
        counted = ~desirable
        counted[0 : 2 * math.ceil(args.desirable_fraction * len(pairs)) : 2] = True
        losses = losses[counted]
    metrics = {
        "loss": losses.mean().item(),
        "rewards/chosen": chosen_rewards.mean().item(),
        "rewards/rejected": rejected_rewards.mean().item(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
        "logps/chosen": chosen.mean().item(),
        "logps/rejected": rejected.mean().item(),
        "lengths/chosen": lengths[0::2].float().mean().item(),
        "lengths/rejected": lengths[1::2].float().mean().item(),
    }
    if args.algo == "kto":
        metrics["kl"] = z0.item()
    return losses.mean(), metrics


def check_args(args: Args) -> None:
    runs.check_options(
        args,
        at_least_one=(
            "steps",
            "batch_size",
            "num_prompts",
            "max_new_tokens",
            "eval_size",
            "max_completion_tokens",
        ),
        divided_over_ranks="batch_size",
    )
    require(distributed.world_size() == 1 or args.algo != "kto", "--algo kto does not run under torchrun yet")
    require(args.beta is None or args.beta > 0, "--beta must be > 0")
    require(
        0 <= args.desirable_fraction <= 1,
        f"--desirable-fraction must be in [0, 1], not {args.desirable_fraction}",
    )
    require(
        args.algo != "rloo" or args.group_size >= 2,
        f"--group-size must be at least 2 for RLOO (the other samples are the baseline), not {args.group_size}",
    )
    require(
        args.algo != "reinforce_pp_baseline" or args.group_size >= 2,
        "--group-size must be at least 2 for reinforce_pp_baseline (the group's mean score is the baseline)",
    )
    require(args.group_size >= 1, f"--group-size must be at least 1, not {args.group_size}")
    require(
        args.kl_placement is None or args.algo in REINFORCE_PP,
        "--kl-placement is for reinforce_pp and reinforce_pp_baseline (RLOO and ReMax put the KL in the reward)",
    )
    require(
        args.algo != "kto" or args.batch_size >= 2,
        "--batch-size must be at least 2 for KTO (z0 pairs each prompt with another pair's completions)",
    )
    require(
        args.samples_per_prompt >= 2,
        "--samples-per-prompt must be at least 2 (a pair needs a correct and an incorrect sample)",
    )
    require(args.temperature > 0, "--temperature must be > 0 (evaluation is always greedy)")


def check_rewards(scores: torch.Tensor, texts: list[str], step: int) -> None:
    """Stop on a NaN or infinite score, naming the reward function: left alone it would become a NaN loss."""
    bad = (~torch.isfinite(scores)).nonzero()
    if len(bad):
        i = bad[0].item()
        raise InputError(
            f"reward became {scores[i].item()} at step {step}: the reward function returned "
            f"a non-finite score for the completion {texts[i]!r}; stopped before the update"
        )


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args, reward_fn=tasks.verify) -> dict:
    """Train one variant; returns the final metrics (also written to the run folder's eval.json).

    Online, reward_fn(completion, answer) scores samples (default: the verifier); held-out accuracy
    always uses the verifier.
    """
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    beta = args.beta if args.beta is not None else DEFAULT_BETA[args.algo]
    lr = args.lr if args.lr is not None else DEFAULT_LR[args.algo]
    kl_placement = args.kl_placement or ("loss" if args.algo == "reinforce_pp_baseline" else "reward")
    models.set_seed(args.seed)
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    offline = args.algo in OFFLINE
    if offline:
        train_pairs, _, _ = preferences.load_preference_pairs(
            args.dataset,
            args.model,
            tokenizer,
            args.seed,
            args.num_prompts,
            args.samples_per_prompt,
            args.max_new_tokens,
            args.temperature,
            device,
            precision,
            args.eval_size,
        )
        # a longer run appends
        batches = tasks.epoch_batches(len(train_pairs), args.batch_size, args.steps, args.seed)
        heldout = tasks.heldout_problems(args.eval_size)
    else:
        train_stream, heldout = tasks.load_problems(args.dataset, args.seed, args.eval_size, args.batch_size)
    # SimPO, ORPO: no reference. Else the starting model, also when resuming (with LoRA: the policy, adapter off)
    uses_reference = args.algo in ("ipo", "kto", "rloo", "remax", *REINFORCE_PP)
    policy, ref_model = models.load_policy(
        args, tokenizer, device, precision, kernels_on, resumed, uses_reference
    )
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout), args.max_new_tokens)
    fsdp.shard(args.run.fsdp, policy, ref_model)  # --fsdp: 1/N of each model's weights on a rank
    optimizer, scheduler = common.make_optimizer(policy, lr, warmup_steps=args.warmup_steps)
    # each rank its own draws
    generator = torch.Generator(device=device).manual_seed(args.seed + distributed.rank())
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    run = runs.Run(args, args.algo, tokenizer, device, resumed)
    # what a checkpoint holds; resumed here
    run.checkpointed(policy, generator, optimizer=optimizer, scheduler=scheduler)
    for _ in range(0 if offline else (run.first_step - 1) * args.batch_size):  # online: P problems a step
        next(train_stream)

    def evaluate(step: int, pass_k: int = 0) -> dict:
        return tasks.evaluate_policy(policy, tokenizer, heldout, args.max_new_tokens, args.seed, step, pass_k)

    run.begin(evaluate)
    for step in range(run.first_step, args.steps + 1):
        t0 = time.time()
        if offline:
            # ---- offline: one batch of preference pairs, one loss ------------------------------------
            policy.train()
            pairs = distributed.share([train_pairs[i] for i in batches[step - 1]])  # P/N pairs on a rank
            loss, stats = offline_loss(args, beta, policy, ref_model, tokenizer, pairs)
            share = distributed.share_of(len(pairs))  # this rank's part of the batch's mean; 1.0 alone
        else:
            # ---- online 1. sample: k per prompt (RLOO, REINFORCE++) or one plus the greedy one (ReMax) ------
            # P/N on a rank
            problems = distributed.share([next(train_stream) for _ in range(args.batch_size)])
            prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in problems], device)
            k = 1 if args.algo == "remax" else args.group_size
            policy.eval()
            # (B, T) each: the tokens, and their log-probs as the sampler drew them
            completion_ids, sampler_logprobs = common.sample_with_logprobs(
                policy,
                prompt_ids,
                prompt_mask,
                k,
                args.max_new_tokens,
                eos,
                pad,
                args.temperature,
                1.0,
                generator,
            )
            mask = common.completion_mask(completion_ids, eos)
            answers = [p.answer for p in problems for _ in range(k)]
            texts = tasks.decode_completions(tokenizer, completion_ids, mask)
            scores = torch.tensor([reward_fn(t, a) for t, a in zip(texts, answers)], device=device)  # (B,)
            check_rewards(scores, texts, step)
            repeats = torch.full((len(problems),), k, device=device)
            if args.algo == "remax":
                greedy_ids = common.sample_completions(
                    policy, prompt_ids, prompt_mask, 1, args.max_new_tokens, eos, pad, temperature=0
                )
                greedy_texts = tasks.decode_completions(
                    tokenizer, greedy_ids, common.completion_mask(greedy_ids, eos)
                )
                # (P,)
                greedy_scores = torch.tensor(
                    [reward_fn(t, p.answer) for t, p in zip(greedy_texts, problems)], device=device
                )
                check_rewards(greedy_scores, greedy_texts, step)

            # ---- online 2. reward = score - β·KL of the sequence, then the critic-free baseline ----------
            with torch.no_grad(), common.reference(policy, ref_model) as ref:
                ref_logprobs, _ = common.completion_logprobs(
                    ref, prompt_ids, prompt_mask, completion_ids, repeats, args.temperature
                )
            policy.train()
            logprobs, _ = common.completion_logprobs(
                policy, prompt_ids, prompt_mask, completion_ids, repeats, args.temperature
            )
            kl = masked_sum(logprobs.detach() - ref_logprobs, mask, dim=1)  # (B,) k1 summed over the sequence
            rewards = scores - beta * kl
            if args.algo == "rloo":
                advantages = rloo_advantages(rewards, k)
            elif args.algo == "remax":
                advantages = remax_advantages(rewards, greedy_scores)
            else:  # REINFORCE++: the same KL token by token in the reward to go, or none there; advantages (B, T)
                reward_beta = beta if kl_placement == "reward" else 0.0
                advantages = reinforce_pp_advantages(
                    scores,
                    logprobs.detach(),
                    ref_logprobs,
                    mask,
                    reward_beta,
                    k if args.algo == "reinforce_pp_baseline" else None,
                )

            # ---- online 3. REINFORCE with the baseline: -A · log π(y|x), one step per batch -------------
            # -A_t log π_t, the token mean over the batch (+ β·k2 with the KL there)
            if args.algo in REINFORCE_PP:
                loss = reinforce_pp_loss(advantages, logprobs, ref_logprobs, mask, beta, kl_placement)
            else:
                loss = -(advantages * masked_sum(logprobs, mask, dim=1)).mean()
            # of the batch's
            share = distributed.share_of(mask.sum() if args.algo in REINFORCE_PP else len(scores))
            if args.algo in REINFORCE_PP:  # token-level advantages: the mean over every rank's tokens
                advantage_abs = masked_mean(advantages.abs(), mask, all_sum=distributed.all_sum)
            else:
                advantage_abs = advantages.abs().mean()
            stats = {
                "reward": scores.mean().item(),
                "kl": kl.mean().item(),
                "rlhf_reward": rewards.mean().item(),
                "advantage_abs": advantage_abs.item(),
                "completion_length": mask.sum(1)
                .float()
                .mean()
                .item(),  # distinct: per group; ReMax: per batch
                "completions/distinct": metrics.distinct_fraction(
                    completion_ids, mask, k if k > 1 else len(mask)
                ),
                # the sampler against the trainer, at the sampled tokens
                **common.mismatch_metrics(logprobs, sampler_logprobs, mask),
            }

        # ---- update, log ---------------------------------------------------------------------------------
        run.check_finite(loss, step)
        (loss * share).backward()  # this rank's part of the batch's loss
        distributed.all_reduce_grads(policy)  # Σ over the ranks
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
        run.check_finite(grad_norm, step, "gradient norm")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # now, not at the next backward: idle through sampling
        stats.update(
            {
                "loss": distributed.all_sum(loss.item() * share),
                "grad_norm": grad_norm.item(),
                "lr": scheduler.get_last_lr()[0],
                "time/step": time.time() - t0,
            }
        )
        # each rank's mean over an equal share: their mean is the batch's
        stats = distributed.mean_over_ranks(stats)
        scheduler.step()
        run.log(step, stats, {"loss": f"{stats['loss']:.4f}"})

        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(
        evaluate,
        lambda before, after: {
            "algo": args.algo,
            **tasks.before_and_after(before, after),
            "models_in_memory": 1 if ref_model is None else 2,
        },
        lambda before, after: f"held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}",
    )


if __name__ == "__main__":
    runs.cli(main, Args)
