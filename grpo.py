"""GRPO: Group Relative Policy Optimization with a verifiable reward, in one file.

For each prompt, sample a group of G completions, score each with the verifier, and use the
reward's deviation from its group's mean (divided by the group's std) as the advantage of every
token of that completion. No critic: the group is the baseline. The policy is then updated with
PPO's clipped surrogate, and a KL penalty to the frozen reference model is added to the loss.

Objective (DeepSeekMath, Shao et al. 2024, arXiv:2402.03300, eq. 3), maximised:
    J(θ) = E[ 1/G Σ_i 1/|o_i| Σ_t { min(ρ_it Â_it, clip(ρ_it, 1-ε_low, 1+ε_high) Â_it) - β D_KL[π_θ||π_ref]_it } ]
    ρ_it = π_θ(o_it | q, o_i,<t) / π_θold(o_it | q, o_i,<t)
    Â_it = (r_i - mean(r)) / std(r)                                            (outcome supervision, §4.1.2)
    D_KL ≈ π_ref/π_θ - log(π_ref/π_θ) - 1                                      (k3, eq. 4)

Options from later papers, each off by default unless said:
- DAPO (Yu et al. 2025, arXiv:2503.14476): clip-higher (`--eps-high 0.28`), token-level loss (`--loss-agg
  token-mean`), dynamic sampling (`--dynamic-sampling`), overlong reward shaping (`--overlong-buffer`).
- DAPO's overlong filtering, `--mask-truncated-completions`: a completion cut at the length limit carries no loss.
- Lite PPO (Liu et al. 2025, arXiv:2508.08221): the batch's std in Â, `--scale-rewards batch`.
- Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): no std scaling (`--scale-rewards none`, or `--no-scale-by-std`) and
  `--loss-agg seq-mean-token-sum-norm` (divide by B × max_new_tokens, a constant).
- GSPO (Zheng et al. 2025, arXiv:2507.18071, eq. 5): `--importance-level sequence`, one clipped
  ratio per completion.
- CISPO (MiniMax 2025, arXiv:2506.13585, eq. 4): `--loss-type cispo`, REINFORCE weighted by
  sg(min(ρ_it, 1+ε_high)).
- SAPO (Qwen 2025, arXiv:2511.20347): `--loss-type sapo`, a temperature-controlled soft gate instead of the clip.
- VESPO (arXiv:2602.10693): `--loss-type vespo`, REINFORCE weighted by a gamma-shaped φ of the completion's ratio.
- LUSPO (arXiv:2602.05261): `--loss-type luspo --importance-level sequence`, GSPO with each completion's loss times
  its length.
- INTELLECT-2 (arXiv:2505.07291): `--delta 4`, two-sided clipping: ρ capped where Â < 0 too.
- The entropy: a bonus `--entropy-coef`, adapted each step toward `--entropy-target` (Skywork-OR1, arXiv:2505.22312),
  and `--top-entropy-quantile 0.2` (Wang et al. 2025, arXiv:2506.01939): the policy gradient on the fifth of the
  tokens of highest entropy only.
- Weighted rewards (`--rewards correct format --reward-weights 1 0.5`), summed, then normalised per
  group, as TRL does; `format` pays DeepSeek-R1's `<think>…</think><answer>…</answer>`
  (arXiv:2501.12948), `--prompt-style r1` asks for it. GDPO (arXiv:2601.05242) normalises each reward in its group
  first: `--multi-objective-aggregation normalize-then-sum --scale-rewards batch`. The weighted sum, the caps, the
  overlong penalty and an ensemble of reward models (`--reward-model A B C`) are task/batch_rewards.py's.
- The sampler against the trainer: `mismatch/*` logs how far the sampler's log-probs of its tokens are
  from the update's (common.mismatch_metrics). grpo_async.py trains on batches sampled k steps earlier,
  as an asynchronous trainer does, and corrects with importance weights (TIS, MIS).
- Process supervision (DeepSeekMath §4.1.3), a process reward model's step scores as the advantages: grpo_prm.py.

The reward is the verifier's 0/1: the last number in the completion, which also pays for restating
an operand ("the sum of 0 and 24"), or with `--verifier strict` only a result stated as one ("= 24",
"is 24"); `reward/unearned` logs the share the first pays and the second refuses. `--reward-model
runs/rm-.../model` scores with a reward_model.py checkpoint instead, as ppo.py reads it, and logs
the verifier beside it (`score` vs `verifier`): its over-optimisation.

Where this file departs from the papers, and why:
- The std in Â is the population std (÷ G) plus eps = 1e-4; TRL's sample std (÷ G-1) makes |Â|
  smaller by √((G-1)/G).
- Dynamic sampling drops zero-variance groups without refilling the batch as DAPO does
  (`frac_reward_zero_std` says how much it shrinks); a batch left with no group makes no update but
  counts as a step (`skipped`). One process only.
- β defaults to 0.04 (DeepSeekMath; `--beta 0` loads no reference model). The lr warms up, then is
  constant or decays.
- After SFT, use `--lr 2e-6 --prompts-per-step 16 --steps 10`: the policy is peaked (entropy 0.03,
  most groups all right or all wrong); 1e-5 on a few mixed groups undid SFT (0.915 → 0.730), later
  steps drift down (docs/results.md).

Several processes, `torchrun --nproc_per_node N grpo.py ...`: a rank samples and scores P/N prompts,
whole groups (Â needs no communication); it divides its loss by the whole batch's count and the
ranks sum gradients, so each --loss-agg is exact: seq-mean-token-mean by all ranks' B,
seq-mean-token-sum-norm by B × max_new_tokens, token-mean by Σ tokens.

Run:
    python grpo.py                      # SmolLM2-135M-Instruct (embedded) on arithmetic, CPU or GPU
    python grpo.py --model tiny --steps 3
    python grpo.py --loss-agg token-mean --eps-high 0.28 --dynamic-sampling --beta 0   # DAPO-style
    python grpo.py --model runs/sft-smollm2-0-<time>/model --lr 2e-6 --prompts-per-step 16 --steps 10   # after SFT

Shapes: P prompts, G completions per prompt, B = P*G sequences, S prompt tokens, T completion tokens.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass
from typing import Annotated, Callable, ClassVar, Literal, Optional

import torch

import common
from infra import distributed
from infra import fsdp
from infra import groups
from infra import metrics
from infra import models
from infra import runs
from infra import stepmetrics
from task import batch_rewards, tasks
from common import masked_mean, masked_sum, require


@dataclass
class Args:
    """GRPO on the arithmetic task with the verifier reward."""

    # ---- experiment: what to train and how it is evaluated ---------------------------------------
    model: str = "smollm2"
    """smollm2 (embedded SmolLM2-135M-Instruct), tiny (random, for smoke runs), or a hub id / local
    checkpoint"""
    dataset: Annotated[Optional[str], runs.none_means("the built-in arithmetic task", "FILE|DIR|HUB-ID")] = (
        None
    )
    """JSONL file with fields prompt, answer (numeric), or a Hugging Face dataset: a save_to_disk folder or a Hub id
    (openai/gsm8k: its question and #### answer understood)"""
    seed: int = 0
    """seed for problems, sampling and initialisation"""
    eval_every: int = 10
    """evaluate held-out accuracy and save a checkpoint every this many steps (0 = only before and after)"""
    eval_size: Annotated[Optional[int], runs.none_means("200; 16 for the tiny random models", "INT")] = None
    """held-out problems for greedy accuracy (verifier reward)"""
    pass_k: Annotated[Optional[int], runs.none_means("8; 0 (off) for the tiny random models", "INT")] = None
    """pass@k at the first and last evaluation: k samples a held-out problem at temperature 1 (0 = off)"""
    verifier: Literal["last-number", "strict"] = "last-number"
    """the training reward: the last number, or strict (only a result stated as one); held-out uses
    last-number"""
    reward_model: Annotated[Optional[tuple[str, ...]], runs.none_means("the verifier", "DIR ...")] = None
    """reward_model.py checkpoints to score completions with (as ppo.py does); several score as one ensemble
    (--reward-ensemble); the verifier is logged beside them"""
    reward_ensemble: Literal["mean", "min"] = "mean"
    """several --reward-model: each one's scores standardised over the batch, then their mean or min (the worst
    case; Coste et al. 2024)"""
    rewards: tuple[Literal["correct", "format", "repetition", "concise"], ...] = ("correct",)
    """rewards summed into one: correct (--verifier's, or --reward-model's score), format
    (<think>…</think><answer>), repetition (minus the share of repeated word 3-grams), concise (1 for 1 to 8
    words; task/rewards.py)"""
    reward_weights: Annotated[
        Optional[tuple[float, ...]], runs.none_means("1 for each reward", "FLOAT ...")
    ] = None
    """the weight of each of --rewards, in their order"""
    reward_clip: Annotated[Optional[tuple[float, ...]], runs.none_means("no cap", "FLOAT ...")] = None
    """a cap on each of --rewards, in their order: each is clipped to [-cap, cap] before the weighted sum"""
    prompt_style: Literal["question", "r1"] = "question"
    """question alone, or r1: it asks for <think> reasoning </think><answer> answer </answer>
    (held-out too)"""
    # ---- algorithm: GRPO, and the DAPO / Dr. GRPO options ----------------------------------------
    steps: int = 40
    """training batches, each freshly sampled (μ optimizer steps each, none if skipped; warm-up
    counts batches)"""
    prompts_per_step: int = 16
    """prompts per batch (P)"""
    group_size: int = 8
    """completions sampled per prompt (G >= 2)"""
    num_iterations: int = 1
    """policy updates per batch (μ); with μ > 1 the old log-probs are stored once per batch"""
    eps_low: float = 0.2
    """lower clip range: ρ is clipped at 1 - eps_low"""
    eps_high: float = 0.2
    """upper clip range: ρ is clipped at 1 + eps_high (DAPO clip-higher: 0.28)"""
    beta: float = 0.04
    """KL penalty coefficient; 0 = no reference model is loaded at all"""
    kl_estimator: Literal["k2", "k3"] = "k3"
    """KL estimator in the loss: k3 (DeepSeekMath; follows KL(π_ref||π_θ)) or k2 (KL(π_θ||π_ref));
    see kl_estimate"""
    importance_level: Literal["token", "sequence"] = "token"
    """ρ per token (GRPO), or per completion (GSPO: exp(mean log ρ); use far smaller eps, e.g. 3e-4 / 4e-4)"""
    loss_type: Literal["clip", "cispo", "sapo", "vespo", "luspo"] = "clip"
    """PPO's clipped surrogate, CISPO: -sg(min(ρ, 1 + eps_high)) Â log π on every token (eps_low unused), SAPO:
    -Â σ(τ(ρ - 1)) 4/τ, a soft gate instead of the clip (eps unused), VESPO: -sg(φ(w)) Â log π, φ a gamma-shaped
    weight of the completion's ratio w (eps unused), or LUSPO: GSPO's clipped sequence ratio, each completion's loss
    times its length (needs --importance-level sequence)"""
    vespo_params: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0)
    """VESPO's k and λ for Â >= 0, then for Â < 0: φ(w) = w^k e^(λ(1 - w)) (TRL's values)"""
    sapo_temperatures: tuple[float, float] = (1.0, 1.05)
    """SAPO's τ for positive and for negative advantages (the paper's 1.0 and 1.05; τ_neg >= τ_pos)"""
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
    delta: Annotated[Optional[float], runs.none_means("off", "FLOAT")] = None
    """INTELLECT-2's two-sided clipping: ρ capped at delta where Â < 0 too (above 1 + eps_high; e.g. 4)"""
    loss_agg: Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"] = "seq-mean-token-mean"
    """loss aggregation: GRPO (per-sequence mean), DAPO (per-token mean), Dr. GRPO (sum / (B ×
    max_new_tokens))"""
    scale_by_std: bool = True
    """divide advantages by a reward std (off in Dr. GRPO: --no-scale-by-std is --scale-rewards none)"""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """the std Â is divided by: its group's (GRPO), the batch's (Lite PPO, arXiv 2508.08221), or none (Dr. GRPO)"""
    multi_objective_aggregation: Literal["sum-then-normalize", "normalize-then-sum"] = "sum-then-normalize"
    """several --rewards: summed, then normalised in the group (GRPO; TRL's sum_then_normalize), or each normalised in
    its group, summed, and the sum divided by its std over the batch (GDPO, arXiv 2601.05242)"""
    dynamic_sampling: bool = False
    """drop groups whose rewards are all equal (DAPO); a batch left with none still counts as a step"""
    mask_truncated_completions: bool = False
    """DAPO's overlong filtering: a completion cut at max_new_tokens (no EOS) carries no loss (its reward still
    counts in its group's advantages)"""
    overlong_buffer: int = 0
    """DAPO's soft overlong punishment over the last this-many tokens before max_new_tokens (0 = off)"""
    overlong_penalty: float = 1.0
    """penalty at max_new_tokens when overlong_buffer > 0"""
    # ---- generation: sampling the completions ----------------------------------------------------
    max_new_tokens: int = 32
    """completion length limit, in training and evaluation"""
    temperature: float = 1.0
    """sampling temperature; the same temperature divides the logits when log-probs are recomputed"""
    top_p: float = 1.0
    """nucleus sampling (1.0 = off; no top-k). Below 1 the update is off-policy: ratios and KL use
    the full softmax"""
    # ---- optimisation: the optimizer, memory and saving ------------------------------------------
    lr: float = 1e-5
    """AdamW learning rate"""
    warmup_steps: int = 10
    """linear learning-rate warm-up, in batches (a batch that dynamic sampling skips counts too)"""
    lr_decay: bool = False
    """after the warm-up, decay the learning rate linearly to 0 at --steps (TRL's usual schedule);
    off: constant"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm"""
    batch_size: Annotated[Optional[int], runs.none_means("the whole batch P*G at once", "INT", "32")] = 32
    """micro-batch in sequences, for gradient accumulation: the same gradient at any size, the
    memory of one micro-batch (32 splits 16 × 8 sequences into four: half the memory, about 7 % more
    time a step on 2 cores)"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass to save memory"""
    run: Annotated[runs.RunOptions, runs.FlatFlags] = runs.option_group(runs.RunOptions)
    lora: Annotated[common.LoraOptions, runs.FlatFlags] = runs.option_group(common.LoraOptions)
    # out of memory: a lower --batch-size (a micro-batch) continues the same run on --resume
    resumable_with: ClassVar[tuple[str, ...]] = ("batch_size",)


def check_args(args: Args) -> None:
    runs.check_options(
        args,
        at_least_one=("steps", "prompts_per_step", "num_iterations", "max_new_tokens", "eval_size"),
        divided_over_ranks="prompts_per_step",
        one_process_only=("dynamic_sampling",),
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
    require(
        args.group_size >= 2,
        f"--group-size must be at least 2 (the group is the baseline), not {args.group_size}",
    )
    # any size: the last micro-batch takes the rows left (48 rows: 32 + 16), each weighted by its share
    require(
        args.batch_size is None or args.batch_size >= 1,
        f"--batch-size must be at least 1, not {args.batch_size}",
    )
    require(0 <= args.eps_low < 1 and args.eps_high >= 0, "--eps-low must be in [0, 1) and --eps-high >= 0")
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
    require(
        args.overlong_buffer < args.max_new_tokens, "--overlong-buffer must be smaller than --max-new-tokens"
    )
    require(
        len(args.reward_weights or args.rewards) == len(args.rewards) > 0,
        "--reward-weights: one per --rewards",
    )
    caps = args.reward_clip or [1.0] * len(args.rewards)
    require(len(caps) == len(args.rewards) and min(caps) > 0, "--reward-clip: one cap > 0 per --rewards")


# ---------------------------------------------------------------------------------------------
# The math: advantages, KL, loss
# ---------------------------------------------------------------------------------------------
def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    scale_by_std: bool = True,
    eps: float = 1e-4,
    std_over: str = "group",
) -> torch.Tensor:
    """Â_i = (r_i - mean(r_group)) / (std(r_group) + eps), DeepSeekMath §4.1.2. (N,) -> (N,)

    Groups are consecutive runs of `group_size`; std is the population std (÷ G). With
    scale_by_std=False (Dr. GRPO) only the mean is subtracted. std_over="batch" divides by the std of every
    reward given instead (Lite PPO, Liu et al. 2025, arXiv:2508.08221: the group's mean, the batch's std), so a
    group of nearly equal rewards is not blown up by its own tiny std. A group whose rewards are all equal
    gets exactly zero advantages either way, found as max == min: the float32 std of eight copies of
    0.7 is 6e-8, not 0, and (r - mean) / (std + eps) gives ±6e-4.
    """
    grouped = rewards.view(-1, group_size)  # (P, G)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_by_std:
        spread = grouped.std(dim=1, unbiased=False, keepdim=True)  # (P, 1) each group's
        if std_over == "batch":
            spread = rewards.std(unbiased=False)  # () every reward's
        centered = centered / (spread + eps)
    all_equal = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)  # (P, 1)
    return torch.where(all_equal, 0.0, centered).reshape(-1)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π_θ || π_ref) from tokens sampled from π_θ (Schulman 2020,
    "Approximating KL").

    With log r = log π_ref - log π_θ:  k1 = -log r (unbiased, can be < 0),  k2 = (log r)² / 2,
    k3 = r - log r - 1 (unbiased, >= 0; DeepSeekMath eq. 4). (B, T), (B, T) -> (B, T)

    As a *value* (PPO puts k1 in the reward) each estimates KL(π_θ || π_ref). As a *loss term*,
    differentiated through log π_θ at tokens sampled from π_θ, their expected gradients differ:
      E_π[∇k1] = E_π[∇ log π_θ] = 0                          k1 in the loss penalises nothing
      E_π[∇k2] = ∇ KL(π_θ || π_ref)                          the reverse KL, as the objective says
      E_π[∇k3] = E_π[(1 - r) ∇ log π_θ] = ∇ KL(π_ref || π_θ)   the *forward* KL (DeepSeekMath's choice)
    (tests/test_grpo.py checks all three by exact enumeration). So grpo.py refuses k1 in the loss.
    """
    log_ratio = ref_logprobs - logprobs
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}")


LOSS_TYPES = ("clip", "cispo", "sapo", "vespo", "luspo")  # --loss-type's choices, as grpo_loss knows them


def grpo_loss(
    logprobs: torch.Tensor,  # (B, T) log π_θ, with gradient
    old_logprobs: torch.Tensor,  # (B, T) log π_θold, no gradient
    ref_logprobs: Optional[torch.Tensor],  # (B, T) log π_ref, or None when beta = 0
    advantages: torch.Tensor,  # (B,), or (B, T) per token (process supervision)
    mask: torch.Tensor,  # (B, T)
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.04,
    loss_agg: str = "seq-mean-token-mean",
    max_completion_length: Optional[int] = None,
    kl_kind: str = "k3",
    importance_level: str = "token",
    loss_type: str = "clip",  # CISPO: "cispo"; SAPO: "sapo"
    is_weights: Optional[torch.Tensor] = None,  # (B, T) π_train / π_sampler, capped, constant (grpo_async.py)
    delta: Optional[float] = None,  # INTELLECT-2's cap on ρ where Â < 0 (two-sided clipping); None: off
    entropy: Optional[torch.Tensor] = None,  # (B, T) the policy's token entropy, with its gradient, or None
    entropy_coef: float = 0.0,  # the entropy bonus: -coef · H_it in each token's loss
    top_entropy_quantile: float = 1.0,  # the share of tokens, by entropy, that carry the policy gradient
    sapo_temperatures: tuple[float, float] = (1.0, 1.05),  # SAPO's τ for Â > 0 and for Â < 0
    vespo_params: tuple = (2.0, 3.0, 3.0, 2.0),  # VESPO's k and λ for Â >= 0, then for Â < 0
) -> tuple[torch.Tensor, dict]:
    """The negated GRPO objective (see the module docstring), to be minimised.

    Per token: l_it = max(-Â_i ρ_it, -Â_i clip(ρ_it, 1-eps_low, 1+eps_high)) + β KL_it; the KL goes
    into each token's loss before aggregation (DeepSeekMath), not into the reward. Aggregation:
      seq-mean-token-mean      1/B Σ_i 1/|o_i| Σ_t l_it           (GRPO)
      token-mean               Σ_it l_it / Σ_i |o_i|              (DAPO eq. 12)
      seq-mean-token-sum-norm  Σ_it l_it / (B · max_completion_length)   (Dr. GRPO; a constant, never the
                               padded width of this batch, so adding padding changes nothing)
    GSPO (eq. 5): s_i = exp(1/|o_i| Σ_t log ρ_it) for every ρ_it of o_i, clipped whole, gradient through the mean.
    CISPO (MiniMax-M1 eq. 4): l_it = -sg(min(ρ_it, 1+eps_high)) Â_i log π_θ(o_it); no lower bound, no gradient lost.
    SAPO (Qwen 2025, arXiv:2511.20347): l_it = -Â_i f(ρ_it), f(ρ) = σ(τ(ρ - 1)) · 4/τ, a soft gate in place of the
    clip: its slope is 1 at ρ = 1 (the surrogate's) and fades away from it, faster for Â < 0 (τ_neg > τ_pos).
    VESPO (arXiv:2602.10693): l_it = -sg(φ_i) Â_i log π_θ(o_it), φ_i = vespo_weights: a smooth weight of the whole
    completion's ratio in place of the clip, 1 on-policy and falling away from it.
    LUSPO (arXiv:2602.05261): GSPO's clipped sequence ratio, each completion's loss times its length |o_i| (the tokens
    summed, then the mean over completions; loss_agg unused), so that a long completion is not worth less per token.
    delta (INTELLECT-2, Prime Intellect 2025, arXiv:2505.07291, two-sided clipping): the unclipped term reads min(ρ, δ),
    so for Â < 0 the loss stops growing (and its gradient stops) at ρ = δ; for Â > 0 nothing changes (δ > 1+eps_high).
    top_entropy_quantile q < 1 (Wang et al. 2025, arXiv:2506.01939): only the tokens of the highest entropy, a share q
    of this batch's (high_entropy_mask), keep their policy-gradient term; the KL stays on every token, as TRL.
    entropy_coef c: l_it - c H_it, aggregated as the rest, so the bonus means the same under every loss_agg.
    is_weights multiply each token's policy-gradient term, not its KL (as TRL): the tokens came from the
    sampler, π_θold is the trainer's (AReaL's decoupled PPO, Fu et al. 2025, arXiv:2505.24298).
    Returns (loss, metrics) with metrics as floats, token means over this batch's mask: kl (only
    when β != 0), clip_ratio, clip_ratio/low, clip_ratio/high (CISPO: tokens with Â > 0 whose weight was cut, as TRL).
    """
    if importance_level not in ("token", "sequence") or loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown importance_level {importance_level!r} or loss_type {loss_type!r}")
    log_ratio = logprobs - old_logprobs  # (B, T) log ρ_it
    # log s_i, the masked mean (padding must not count), for each token of o_i
    if importance_level == "sequence":
        log_ratio = masked_mean(log_ratio, mask, dim=1)[:, None].expand_as(log_ratio)
    ratio = torch.exp(log_ratio)  # (B, T)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    pg_loss1 = -adv * (ratio if delta is None else torch.clamp(ratio, max=delta))
    pg_loss2 = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.max(pg_loss1, pg_loss2)  # (B, T) pessimistic bound, PPO eq. 7
    if loss_type == "cispo":  # instead: the weight is a constant, so every token's gradient is -w Â ∇log π
        per_token = -torch.clamp(ratio, max=1.0 + eps_high).detach() * adv * logprobs
    if loss_type == "sapo":  # instead: a soft gate, with the temperature of the advantage's sign
        tau = torch.where(adv > 0, *sapo_temperatures)  # τ_pos where Â > 0, else τ_neg
        per_token = -adv * torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    if loss_type == "vespo":  # instead: REINFORCE weighted by φ of the completion's ratio, a constant
        per_token = -vespo_weights(logprobs - old_logprobs, mask, adv, vespo_params) * adv * logprobs
    if is_weights is not None:
        per_token = per_token * is_weights
    if top_entropy_quantile < 1.0:
        per_token = per_token * high_entropy_mask(entropy.detach(), mask, top_entropy_quantile)
    if entropy_coef != 0.0:
        per_token = per_token - entropy_coef * entropy
    kl = None
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("beta != 0 needs ref_logprobs")
        if kl_kind == "k1":
            raise ValueError("k1 in the loss has zero expected gradient; use k3 or k2 (see kl_estimate)")
        kl = kl_estimate(logprobs, ref_logprobs, kl_kind)
        per_token = per_token + beta * kl

    if loss_type == "luspo":  # each completion's tokens summed: its mean loss times its length
        loss = masked_sum(per_token, mask, dim=1).mean()
    elif loss_agg == "seq-mean-token-mean":
        loss = (masked_sum(per_token, mask, dim=1) / mask.sum(dim=1).clamp(min=1)).mean()
    elif loss_agg == "token-mean":
        loss = masked_sum(per_token, mask) / mask.sum().clamp(min=1)
    elif loss_agg == "seq-mean-token-sum-norm":
        if max_completion_length is None:
            raise ValueError("seq-mean-token-sum-norm needs max_completion_length")
        loss = masked_sum(per_token, mask) / (mask.shape[0] * max_completion_length)
    else:
        raise ValueError(f"unknown loss_agg {loss_agg!r}")

    with torch.no_grad():
        clipped_low = (ratio < 1.0 - eps_low) & (adv < 0) & (loss_type != "cispo")  # binds where it lowers J
        clipped_high = (ratio > 1.0 + eps_high) & (adv > 0)
        metrics = {
            "clip_ratio": masked_mean((clipped_low | clipped_high).float(), mask).item(),
            "clip_ratio/low": masked_mean(clipped_low.float(), mask).item(),
            "clip_ratio/high": masked_mean(clipped_high.float(), mask).item(),
        }
        if kl is not None:
            metrics["kl"] = masked_mean(kl, mask).item()
    return loss, metrics


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


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """1 on the tokens whose entropy is in the top `quantile` share of the masked tokens' (at or above their
    (1 - quantile) quantile, linearly interpolated as torch.quantile), 0 elsewhere. (B, T), (B, T) -> (B, T)"""
    threshold = torch.quantile(entropy[mask.bool()].float(), 1.0 - quantile)
    return (entropy >= threshold).to(mask.dtype) * mask


def loss_rows(completion_ids: torch.Tensor, eos: int, mask_truncated: bool) -> torch.Tensor:
    """DAPO's overlong filtering (Yu et al. 2025, arXiv:2503.14476, §3.4): with mask_truncated, 0 for a completion
    cut at the length limit (no EOS), whose loss is then masked out, and 1 for one that ended; all 1 without.
    (B, T) -> (B,)"""
    ended = (completion_ids == eos).any(dim=1)
    return (ended | (not mask_truncated)).float()


def adapted_entropy_coef(args: Args, coef: float, entropy: float) -> float:
    """Skywork-OR1's adaptive entropy control (arXiv:2505.22312, §3.2.3; TRL's use_adaptive_entropy), once a step:
    c <- clip(c + Δ, low, high) while the batch's mean token entropy H <= --entropy-target, clip(c - Δ, ...) above it.
    Without --entropy-target, c as it is."""
    if args.entropy_target is None:
        return coef
    moved = coef + args.entropy_coef_step if entropy <= args.entropy_target else coef - args.entropy_coef_step
    return min(max(moved, args.entropy_coef_bounds[0]), args.entropy_coef_bounds[1])


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args, reward_fn: Optional[Callable[[str, str], float]] = None) -> dict:
    """Train with GRPO; returns the final metrics (also in eval.json). reward_fn(completion, answer) -> float is
    the `correct` reward (default: --verifier's); held-out accuracy is always the last-number verifier's."""
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    reward_fn = reward_fn or tasks.VERIFIERS[args.verifier]
    models.set_seed(args.seed)
    # --device, --precision and --kernels resolved for this machine
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    # --resume's trainer state, checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    train_stream, heldout = tasks.load_problems(
        args.dataset, args.seed, args.eval_size, args.prompts_per_step
    )
    train_stream, heldout = tasks.with_prompt_style(args.prompt_style, train_stream, heldout)  # held-out too
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    # the policy (LoRA, checkpointing, --decode applied) and π_ref, a frozen copy of the start (None if β = 0)
    # π_ref is the starting model, also when resuming; with LoRA it is the policy with its adapter off
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
    # each rank its own draws
    generator = torch.Generator(device=device).manual_seed(args.seed + distributed.rank())
    G = args.group_size

    run = runs.Run(args, "grpo", tokenizer, device, resumed)  # the run folder, metrics.jsonl, checkpoints
    # what a checkpoint holds; resumed here (the entropy bonus's coefficient: adapted each step by --entropy-target)
    adaptive = groups.entropy_state(args, resumed)
    run.checkpointed(policy, generator, optimizer=optimizer, scheduler=scheduler, extra=adaptive.copy)
    # a resumed run's data position: P problems a step
    train_stream = itertools.islice(train_stream, (run.first_step - 1) * args.prompts_per_step, None)

    evaluate = functools.partial(
        tasks.evaluate_policy, policy, tokenizer, heldout, args.max_new_tokens, args.seed
    )

    run.begin(evaluate)
    for step in range(run.first_step, args.steps + 1):
        # ---- 1. sample G completions per prompt from the current policy -------------------------
        t0 = time.time()
        # P/N on a rank
        problems = distributed.share([next(train_stream) for _ in range(args.prompts_per_step)])
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

        # ---- 2. score with each of --rewards (a verifier or a reward model, the format) -----------
        texts = tasks.decode_completions(tokenizer, completion_ids, mask)
        answers = [p.answer for p in problems for _ in range(G)]
        # the reward models' scores (B,), one model's or the ensemble's, in place of the verifier's; None without
        learned = batch_rewards.learned_scores(
            reward_models, prompt_ids, prompt_mask, completion_ids, mask, G, args.reward_ensemble
        )
        scored = tasks.score_completions(texts, answers, args.rewards, reward_fn, device, learned)
        runs.check_rewards(scored.rewards, step)
        per_reward = batch_rewards.capped_rewards(scored.rewards, args.reward_clip)  # (B, K)
        weights = per_reward.new_tensor(args.reward_weights or [1.0] * len(args.rewards))  # (K,)
        # (B,) Σ_k w_k r_ik, or with normalize-then-sum (GDPO) each r_k normalised in its group first
        scores = batch_rewards.weighted_sum(per_reward, weights, G, args.multi_objective_aggregation)
        lengths = mask.sum(1)  # (B,)
        rewards = scores + batch_rewards.overlong_penalty(
            lengths, args.max_new_tokens, args.overlong_buffer, args.overlong_penalty
        )

        # ---- 3. group-relative advantages -------------------------------------------------------
        scale = args.scale_rewards if args.scale_by_std else "none"  # --no-scale-by-std: none
        advantages = group_advantages(rewards, G, scale != "none", std_over=scale)  # (B,)
        stats = batch_rewards.reward_stats(rewards, scores, scored, args.rewards, G, learned is not None)
        stats.update(metrics.completion_stats(completion_ids, mask, tokenizer.eos_token_id, G, time_generate))
        # DAPO's dynamic sampling drops the groups whose every advantage is 0 (equal rewards)
        no_signal = (advantages.view(len(problems), -1) == 0).all(1)  # (P,)
        keep_groups = ~no_signal if args.dynamic_sampling else torch.ones_like(no_signal)
        keep = keep_groups.repeat_interleave(G)  # (B,)
        width = int((mask * keep[:, None]).sum(1).max())  # the columns that are padding in every kept row go
        prompt_ids, prompt_mask = prompt_ids[keep_groups], prompt_mask[keep_groups]
        completion_ids, mask = completion_ids[keep, :width], mask[keep, :width]
        sampler_logprobs = sampler_logprobs[keep, :width]
        advantages = advantages[keep]
        # DAPO's overlong filtering: a completion cut at --max-new-tokens (no EOS) carries no loss
        mask = (
            mask * loss_rows(completion_ids, tokenizer.eos_token_id, args.mask_truncated_completions)[:, None]
        )
        B = completion_ids.shape[0]
        update = B > 0  # a batch left with no group makes no update, but counts as a step
        t1 = time.time()

        # ---- 4. old and reference log-probs, once per batch -------------------------------------
        if update:
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
                        [groups.group_logprobs(policy, sequences, s, G, args.temperature)[0] for s in slices]
                    )
                ref_logprobs = None
                if args.beta != 0.0:
                    with common.reference(policy, ref_model) as ref:
                        ref_logprobs = torch.cat(
                            [groups.group_logprobs(ref, sequences, s, G, args.temperature)[0] for s in slices]
                        )

            # ---- 5. μ policy updates on this batch, accumulating over micro-batches ----------------
            policy.train()
            # the update's metrics, exact
            sums = stepmetrics.MicroBatchSums(batch_tokens, args.num_iterations)
            trainer_logprobs = []  # π_θold's, the trainer's at the update's start, a micro-batch each
            for iteration in range(args.num_iterations):
                for s in slices:
                    logprobs, entropy = groups.group_logprobs(
                        policy, sequences, s, G, args.temperature, *groups.entropy_wanted(args, iteration)
                    )
                    # μ = 1: π_θold is π_θ itself, so ρ = 1 exactly; β = 0: no reference
                    old = old_logprobs[s] if old_logprobs is not None else logprobs.detach()
                    loss, m = grpo_loss(
                        logprobs,
                        old,
                        ref_logprobs[s] if ref_logprobs is not None else None,
                        advantages[s],
                        mask[s],
                        entropy=entropy,
                        **groups.loss_options(args, adaptive["entropy_coef"]),
                    )
                    run.check_finite(loss, step)
                    weight = groups.micro_batch_weight(args.loss_agg, mask[s], int(batch_tokens), batch_rows)
                    (loss * weight).backward()
                    # kl, clip_ratio: token means over the whole batch; the entropy logged: iteration 0's, the sampler's
                    sums.add(m, mask[s], loss, weight, entropy if iteration == 0 else None)
                    if iteration == 0:  # π_θold's log-probs, to hold against the sampler's
                        trainer_logprobs.append(old)
                # Σ over the ranks: each one's loss is its part of the batch's
                distributed.all_reduce_grads(policy)
                grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
                run.check_finite(grad_norm, step, "gradient norm")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)  # now, not at the next backward: idle through sampling
            # the next step's entropy coefficient
            adaptive["entropy_coef"] = adapted_entropy_coef(
                args, adaptive["entropy_coef"], sums.totals()["entropy"]
            )
        # the rate this step used, or would have: warm-up counts batches, skipped too
        stats["lr"] = scheduler.get_last_lr()[0]
        scheduler.step()
        time_train = time.time() - t1

        # ---- 6. log -------------------------------------------------------------------------------
        if update:
            stats.update(sums.totals())
            # the sampler against the trainer, at the tokens sampled
            stats.update(common.mismatch_metrics(torch.cat(trainer_logprobs), sampler_logprobs, mask))
            stats["grad_norm"] = grad_norm.item()
            stats.update(adaptive)
            stats["tokens_per_second/train"] = mask.sum().item() * args.num_iterations / time_train
        else:
            stats["skipped"] = 1
        stats["time/train"] = time_train
        stats["time/step"] = time.time() - t0
        stats["tokens_per_second"] = lengths.sum().item() / stats["time/step"]
        # each rank's mean over an equal share: their mean is the batch's
        stats = distributed.mean_over_ranks(stats)
        run.log(step, stats, ("reward", "completion_length", "kl", "skipped"))

        # ---- 7. evaluate and checkpoint -----------------------------------------------------------
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(evaluate, tasks.before_and_after)


if __name__ == "__main__":
    runs.cli(main, Args)
