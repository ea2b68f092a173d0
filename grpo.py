"""GRPO: Group Relative Policy Optimization with a verifiable reward, in one file.

For each prompt, sample a group of G completions, score each with the verifier, and use the reward's deviation from
its group's mean (divided by the group's std) as the advantage of every token of that completion. No critic: the group
is the baseline. The policy is updated with PPO's clipped surrogate, plus a KL penalty to the frozen reference model.

Objective (DeepSeekMath, Shao et al. 2024, arXiv:2402.03300, eq. 3), maximised:
    J(θ) = E[ 1/G Σ_i 1/|o_i| Σ_t { min(ρ_it Â_it, clip(ρ_it, 1-ε_low, 1+ε_high) Â_it) - β D_KL[π_θ||π_ref]_it } ]
    ρ_it = π_θ(o_it | q, o_i,<t) / π_θold(o_it | q, o_i,<t)
    Â_it = (r_i - mean(r)) / std(r)                                            (outcome supervision, §4.1.2)
    D_KL ≈ π_ref/π_θ - log(π_ref/π_θ) - 1                                      (k3, eq. 4)

GRPO's paper family, each option an `if` in the loop:
- DeepSeekMath: μ updates per batch (`--num-iterations`), the k3 or k2 KL in the loss, a reward model as the
  scorer (`--reward-model runs/rm-.../model`, read as ppo.py reads it; `verifier` logs the verifier beside it).
- DAPO (Yu et al. 2025, arXiv:2503.14476): clip-higher (`--eps-high 0.28`), `--loss-agg token-mean`,
  `--dynamic-sampling`, overlong shaping (`--overlong-buffer`) and filtering (`--mask-truncated-completions`).
- Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): `--no-scale-by-std`, `--loss-agg seq-mean-token-sum-norm`.
- DeepSeek-R1 (arXiv:2501.12948): weighted rewards (`--rewards correct format --reward-weights 1 0.5`), summed, then
  normalised per group (as TRL); `format` pays `<think>…</think><answer>…</answer>`, `--prompt-style r1` asks for it.
Later papers' options (GSPO, CISPO, SAPO, VESPO, LUSPO, δ, entropy controls, batch std, GDPO, reward caps and
ensembles) are the catalogue's, grpo_options.py. Variants of this loop: grpo_async.py (stale batches), grpo_prm.py
(process supervision), grpo_adaptive.py (a second draw), grpo_tools.py (a calculator).

The reward is the verifier's 0/1: the last number in the completion, which also pays for restating an operand ("the
sum of 0 and 24"), or with `--verifier strict` only a result stated as one ("= 24"); `reward/unearned` logs the share
the first pays and the second refuses. `mismatch/*` logs the sampler's log-probs against the update's.

Where this file departs from the papers, and why:
- The std in Â is the population std (÷ G) plus eps = 1e-4; TRL's sample std (÷ G-1) makes |Â| smaller by √((G-1)/G).
- Dynamic sampling drops zero-variance groups without refilling the batch as DAPO does (`frac_reward_zero_std` says
  how much it shrinks); a batch left with no group makes no update but counts as a step (`skipped`). One process only.
- β defaults to 0.04 (DeepSeekMath; `--beta 0` loads no reference model). The lr warms up, then is constant or decays.
- After SFT, use `--lr 2e-6 --prompts-per-step 16 --steps 10`: the policy is peaked (entropy 0.03, most groups all
  right or all wrong); 1e-5 on a few mixed groups undid SFT (0.915 → 0.730), later steps drift down (docs/results.md).

Several processes, `torchrun --nproc_per_node N grpo.py ...`: a rank samples and scores P/N prompts, whole groups (Â
needs no communication); it divides its loss by the whole batch's count and the ranks sum gradients, so each --loss-agg
is exact: seq-mean-token-mean by all ranks' B, seq-mean-token-sum-norm by B × max_new_tokens, token-mean by Σ tokens.

Run:
    python grpo.py                      # SmolLM2-135M-Instruct (embedded) on arithmetic, CPU or GPU
    python grpo.py --loss-agg token-mean --eps-high 0.28 --dynamic-sampling --beta 0   # DAPO-style
    python grpo.py --model runs/sft-smollm2-0-<time>/model --lr 2e-6 --prompts-per-step 16 --steps 10   # after SFT

Shapes: P prompts, G completions per prompt, B = P*G sequences, S prompt tokens, T completion tokens.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass
from typing import Annotated, Callable, ClassVar, Literal, Optional

import torch

import common
from infra import distributed
from infra import fsdp
from infra import metrics
from infra import models
from infra import runs
from infra import stepmetrics
from task import tasks
from common import masked_mean, masked_sum, require


@dataclass
class Args:
    """GRPO on the arithmetic task with the verifier reward."""

    # ---- experiment: what to train and how it is evaluated ---------------------------------------
    model: str = "smollm2"
    """smollm2 (embedded SmolLM2-135M-Instruct), tiny (random, for smoke runs), or a hub id / local checkpoint"""
    dataset: Annotated[Optional[str], runs.none_means("the arithmetic task", "FILE|DIR|HUB-ID")] = None
    """JSONL with fields prompt, answer (numeric), or a Hugging Face dataset folder or Hub id (openai/gsm8k too)"""
    seed: int = 0
    """seed for problems, sampling and initialisation"""
    eval_every: int = 10
    """evaluate held-out accuracy and save a checkpoint every this many steps (0 = only before and after)"""
    eval_size: Annotated[Optional[int], runs.none_means("200; 16 for the tiny random models", "INT")] = None
    """held-out problems for greedy accuracy (verifier reward)"""
    pass_k: Annotated[Optional[int], runs.none_means("8; 0 (off) for the tiny random models", "INT")] = None
    """pass@k at the first and last evaluation: k samples a held-out problem at temperature 1 (0 = off)"""
    verifier: Literal["last-number", "strict"] = "last-number"
    """the training reward: the last number, or strict (only a result stated as one); held-out: last-number"""
    reward_model: Annotated[Optional[str], runs.none_means("the verifier", "DIR")] = None
    """a reward_model.py checkpoint whose score is the `correct` reward; the verifier is logged beside it"""
    rewards: tuple[Literal["correct", "format", "repetition", "concise"], ...] = ("correct",)
    """rewards summed into one: correct (--verifier's, or --reward-model's score), format (<think>…</think><answer>),
    repetition (minus the share of repeated word 3-grams), concise (1 for 1 to 8 words; task/rewards.py)"""
    reward_weights: Annotated[Optional[tuple[float, ...]], runs.none_means("1 each", "FLOAT ...")] = None
    """the weight of each of --rewards, in their order"""
    prompt_style: Literal["question", "r1"] = "question"
    """question alone, or r1: it asks for <think> reasoning </think><answer> answer </answer> (held-out too)"""
    # ---- algorithm: GRPO, and the DAPO / Dr. GRPO options ----------------------------------------
    steps: int = 40
    """training batches, each freshly sampled (μ optimizer steps each, none if skipped; warm-up counts batches)"""
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
    """KL estimator in the loss: k3 (DeepSeekMath; follows KL(π_ref||π_θ)) or k2 (KL(π_θ||π_ref)); see kl_estimate"""
    loss_agg: Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"] = "seq-mean-token-mean"
    """loss aggregation: GRPO (per-sequence mean), DAPO (per-token mean), Dr. GRPO (sum / (B × max_new_tokens))"""
    scale_by_std: bool = True
    """divide advantages by their group's reward std (off in Dr. GRPO)"""
    dynamic_sampling: bool = False
    """drop groups whose rewards are all equal (DAPO); a batch left with none still counts as a step"""
    mask_truncated_completions: bool = False
    """DAPO's overlong filtering: a completion cut at max_new_tokens (no EOS) carries no loss (its reward counts)"""
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
    """nucleus sampling (1.0 = off). Below 1 the update is off-policy: ratios and KL use the full softmax"""
    # ---- optimisation: the optimizer, memory and saving ------------------------------------------
    lr: float = 1e-5
    """AdamW learning rate"""
    warmup_steps: int = 10
    """linear learning-rate warm-up, in batches (a batch that dynamic sampling skips counts too)"""
    lr_decay: bool = False
    """after the warm-up, decay the learning rate linearly to 0 at --steps (TRL's usual schedule); off: constant"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm"""
    batch_size: Annotated[Optional[int], runs.none_means("the whole batch P*G at once", "INT", "32")] = 32
    """micro-batch in sequences, for gradient accumulation: the same gradient at any size, one micro-batch's memory"""
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
    )
    require(args.group_size >= 2, "--group-size must be at least 2 (the group is the baseline)")
    # any size: the last micro-batch takes the rows left (48 rows: 32 + 16), each weighted by its share
    require(
        args.batch_size is None or args.batch_size >= 1,
        f"--batch-size must be at least 1, not {args.batch_size}",
    )
    require(0 <= args.eps_low < 1 and args.eps_high >= 0, "--eps-low must be in [0, 1) and --eps-high >= 0")
    require(
        args.overlong_buffer < args.max_new_tokens, "--overlong-buffer must be smaller than --max-new-tokens"
    )
    require(
        len(args.reward_weights or args.rewards) == len(args.rewards) > 0,
        "--reward-weights: one per --rewards",
    )


# ---- the math: rewards, advantages, KL, loss ---------------------------------------------------------------------
def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO eq. 13, soft overlong punishment, (B,) -> (B,): 0 up to L_max - L_cache, then falling linearly to
    -penalty at L_max, where L_max = max_new_tokens and L_cache = buffer > 0."""
    over = (lengths - (max_new_tokens - buffer)).clamp(min=0).float()
    return -penalty * (over / buffer).clamp(max=1.0)


def group_advantages(rewards: torch.Tensor, group_size: int, scale_by_std: bool = True, eps: float = 1e-4):
    """Â_i = (r_i - mean(r_group)) / (std(r_group) + eps), DeepSeekMath §4.1.2. (N,) -> (N,)

    Groups are consecutive runs of `group_size`; std is the population std (÷ G). With scale_by_std=False (Dr. GRPO)
    only the mean is subtracted. A group whose rewards are all equal gets exactly zero advantages either way, found as
    max == min: the float32 std of eight copies of 0.7 is 6e-8, not 0, and (r - mean) / (std + eps) gives ±6e-4."""
    grouped = rewards.view(-1, group_size)  # (P, G)
    centered = grouped - grouped.mean(1, keepdim=True)
    if scale_by_std:
        centered = centered / (grouped.std(1, unbiased=False, keepdim=True) + eps)
    all_equal = grouped.amax(1, keepdim=True) == grouped.amin(1, keepdim=True)  # (P, 1)
    return torch.where(all_equal, 0.0, centered).reshape(-1)


def completion_ended(completion_ids: torch.Tensor, eos: int) -> torch.Tensor:
    """1 for a completion that ended with EOS, 0 for one cut at the length limit, whose loss DAPO's overlong
    filtering masks out (Yu et al. 2025, arXiv:2503.14476, §3.4). (B, T) -> (B,)"""
    return (completion_ids == eos).any(dim=1).float()


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π_θ || π_ref) from tokens sampled from π_θ (Schulman 2020, "Approximating KL").

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


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float):
    """PPO's pessimistic bound per token, negated (PPO eq. 7, DeepSeekMath eq. 3), to be minimised:
    l_it = max(-Â_i ρ_it, -Â_i clip(ρ_it, 1-eps_low, 1+eps_high)). (B, T) ρ, (B, 1) or (B, T) Â -> (B, T)"""
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return torch.max(unclipped, clipped)


def aggregate_loss(
    per_token: torch.Tensor, mask: torch.Tensor, loss_agg: str, max_completion_length: Optional[int] = None
) -> torch.Tensor:
    """A batch's loss from each token's, (B, T) -> ():
    seq-mean-token-mean      1/B Σ_i 1/|o_i| Σ_t l_it           (GRPO)
    token-mean               Σ_it l_it / Σ_i |o_i|              (DAPO eq. 12)
    seq-mean-token-sum-norm  Σ_it l_it / (B · max_completion_length)   (Dr. GRPO; a constant, never the
                             padded width of this batch, so adding padding changes nothing)"""
    if loss_agg == "seq-mean-token-mean":
        return (masked_sum(per_token, mask, 1) / mask.sum(1).clamp(min=1)).mean()
    if loss_agg == "token-mean":
        return masked_sum(per_token, mask) / mask.sum().clamp(min=1)
    if loss_agg == "seq-mean-token-sum-norm":
        if max_completion_length is None:
            raise ValueError("seq-mean-token-sum-norm needs max_completion_length")
        return masked_sum(per_token, mask) / (mask.shape[0] * max_completion_length)
    raise ValueError(f"unknown loss_agg {loss_agg!r}")


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
    is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict]:
    """The negated GRPO objective (see the module docstring), to be minimised.

    Per token: l_it = max(-Â_i ρ_it, -Â_i clip(ρ_it, 1-eps_low, 1+eps_high)) + β KL_it (clipped_surrogate,
    kl_estimate): the KL goes into each token's loss before aggregation (DeepSeekMath), not into the reward; then
    aggregated as loss_agg says (aggregate_loss). is_weights (B, T), constant, multiply each token's policy-gradient
    term, not its KL (as TRL): grpo_async.py's importance weights for the tokens a stale sampler drew.
    Returns (loss, metrics): floats, token means over this batch's mask: kl (when β != 0) and the clip fractions."""
    ratio = torch.exp(logprobs - old_logprobs)  # (B, T) ρ_it
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    per_token = clipped_surrogate(ratio, adv, eps_low, eps_high)  # (B, T)
    stats = stepmetrics.clip_fractions(ratio, adv, mask, eps_low, eps_high)
    if is_weights is not None:
        per_token = per_token * is_weights
    if beta != 0.0:
        if kl_kind == "k1":
            raise ValueError("k1 in the loss has zero expected gradient; use k3 or k2 (see kl_estimate)")
        kl = kl_estimate(logprobs, ref_logprobs, kl_kind)
        per_token = per_token + beta * kl
        stats["kl"] = masked_mean(kl.detach(), mask).item()
    return aggregate_loss(per_token, mask, loss_agg, max_completion_length), stats


def micro_batch_weight(loss_agg: str, micro_mask: torch.Tensor, batch_tokens: int, batch_rows: int) -> float:
    """Weight of one micro-batch's loss so that the accumulated gradient equals the whole batch's (every rank's): its
    share of the batch's sequences (sequence-level aggregations), or of its tokens (token-mean)."""
    if loss_agg == "token-mean":
        return micro_mask.sum().item() / batch_tokens
    return micro_mask.shape[0] / batch_rows


def group_logprobs(model, sequences, rows, group_size, temperature, entropy=False, entropy_grad=False):
    """log π of the completions in `rows` (and their entropy when asked, with its gradient if entropy_grad), each
    prompt encoded once for its group's rows: row r belongs to prompt r // G. sequences = (prompt_ids (P, S),
    prompt_mask (P, S), completion_ids (B, T)) -> (B_rows, T), and (B_rows, T) or None"""
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


@torch.no_grad()
def learned_scores(reward_model, prompt_ids, prompt_mask, completion_ids, mask, group_size):
    """The reward model's score of each prompt + completion, (B,), read at its last real token as ppo.py reads it.
    prompt_ids, prompt_mask (P, S) each prompt once; completion_ids, mask (B, T), G = group_size rows a prompt."""
    input_ids = torch.cat([prompt_ids.repeat_interleave(group_size, 0), completion_ids], 1)  # (B, S+T)
    attention_mask = torch.cat([prompt_mask.repeat_interleave(group_size, 0), mask], 1)
    return common.reward_scores(reward_model, input_ids, attention_mask)


# ---- training --------------------------------------------------------------------------------------------------
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
    if args.prompt_style == "r1":  # DeepSeek-R1's template, held-out too
        train_stream, heldout = tasks.with_prompt_style("r1", train_stream, heldout)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    # the policy and π_ref, the start (also when resuming; None if β = 0; with LoRA the policy, its adapter off)
    policy, ref_model = models.load_policy(
        args, tokenizer, device, precision, kernels_on, resumed, args.beta != 0
    )
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout), args.max_new_tokens)
    reward_model = None
    if args.reward_model is not None:
        reward_model = models.load_reward_model(args.reward_model, tokenizer, device, precision, kernels_on)
    fsdp.shard(args.run.fsdp, policy, ref_model, reward_model)  # --fsdp: 1/N of each model's weights
    optimizer, scheduler = common.make_optimizer(
        policy, args.lr, args.weight_decay, args.warmup_steps, args.steps if args.lr_decay else 0
    )
    # each rank its own draws
    generator = torch.Generator(device=device).manual_seed(args.seed + distributed.rank())
    G = args.group_size

    run = runs.Run(args, "grpo", tokenizer, device, resumed)  # the run folder, metrics.jsonl, checkpoints
    run.checkpointed(policy, generator, optimizer=optimizer, scheduler=scheduler)
    # a resumed run's data position: P problems a step
    train_stream = itertools.islice(train_stream, (run.first_step - 1) * args.prompts_per_step, None)

    evaluate = functools.partial(
        tasks.evaluate_policy, policy, tokenizer, heldout, args.max_new_tokens, args.seed
    )

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

        # ---- 2. score with each of --rewards (the verifier or a reward model, the format) ---------
        texts = tasks.decode_completions(tokenizer, completion_ids, mask)
        answers = [p.answer for p in problems for _ in range(G)]
        learned = None  # a reward model's scores (B,), in place of the verifier's
        if reward_model is not None:
            learned = learned_scores(reward_model, prompt_ids, prompt_mask, completion_ids, mask, G)
        scored = tasks.score_completions(texts, answers, args.rewards, reward_fn, device, learned)
        runs.check_rewards(scored.rewards, step)
        if args.reward_weights is None:
            scores = scored.rewards.sum(1)  # (B,) r_i = Σ_k r_ik
        else:  # DeepSeek-R1's weighted rewards, summed as TRL sums them: r_i = Σ_k w_k r_ik
            scores = scored.rewards @ scored.rewards.new_tensor(args.reward_weights)
        lengths = mask.sum(1)  # (B,)
        rewards = scores
        if args.overlong_buffer > 0:  # DAPO's soft overlong punishment
            rewards = scores + overlong_penalty(
                lengths, args.max_new_tokens, args.overlong_buffer, args.overlong_penalty
            )

        # ---- 3. group-relative advantages -------------------------------------------------------
        advantages = group_advantages(rewards, G, args.scale_by_std)  # (B,)
        stats = metrics.reward_stats(rewards, scores, scored, args.rewards, G, learned is not None)
        stats.update(metrics.completion_stats(completion_ids, mask, tokenizer.eos_token_id, G, time_generate))
        if args.dynamic_sampling:  # DAPO: drop the groups whose every advantage is 0 (equal rewards)
            keep_groups = (advantages.view(-1, G) != 0).any(1)  # (P,)
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
            mask = mask * completion_ended(completion_ids, tokenizer.eos_token_id)[:, None]
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
                        [group_logprobs(policy, sequences, s, G, args.temperature)[0] for s in slices]
                    )
                ref_logprobs = None
                if args.beta != 0.0:
                    with common.reference(policy, ref_model) as ref:
                        ref_logprobs = torch.cat(
                            [group_logprobs(ref, sequences, s, G, args.temperature)[0] for s in slices]
                        )

            # ---- 5. μ policy updates on this batch, accumulating over micro-batches ----------------
            policy.train()
            # the update's metrics, exact
            sums = stepmetrics.MicroBatchSums(batch_tokens, args.num_iterations)
            trainer_logprobs = []  # π_θold's, the trainer's at the update's start, a micro-batch each
            for iteration in range(args.num_iterations):
                for s in slices:
                    logprobs, entropy = group_logprobs(
                        policy, sequences, s, G, args.temperature, iteration == 0
                    )
                    # μ = 1: π_θold is π_θ itself, so ρ = 1 exactly; β = 0: no reference
                    old = old_logprobs[s] if old_logprobs is not None else logprobs.detach()
                    loss, m = grpo_loss(
                        logprobs,
                        old,
                        ref_logprobs[s] if ref_logprobs is not None else None,
                        advantages[s],
                        mask[s],
                        args.eps_low,
                        args.eps_high,
                        args.beta,
                        args.loss_agg,
                        args.max_new_tokens,
                        args.kl_estimator,
                    )
                    run.check_finite(loss, step)
                    weight = micro_batch_weight(args.loss_agg, mask[s], int(batch_tokens), batch_rows)
                    (loss * weight).backward()
                    # kl, clip_ratio: token means over the whole batch; the entropy: iteration 0's, the sampler's
                    sums.add(m, mask[s], loss, weight, entropy)
                    if iteration == 0:  # π_θold's log-probs, to hold against the sampler's
                        trainer_logprobs.append(old)
                # Σ over the ranks: each one's loss is its part of the batch's
                distributed.all_reduce_grads(policy)
                grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
                run.check_finite(grad_norm, step, "gradient norm")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)  # now, not at the next backward: idle through sampling
        # the rate this step used, or would have: warm-up counts batches, skipped too
        stats["lr"] = scheduler.get_last_lr()[0]
        scheduler.step()
        time_train = time.time() - t1

        # ---- 6. log -------------------------------------------------------------------------------
        if B > 0:
            stats.update(sums.totals())
            # the sampler against the trainer, at the tokens sampled
            stats.update(common.mismatch_metrics(torch.cat(trainer_logprobs), sampler_logprobs, mask))
            stats["grad_norm"] = grad_norm.item()
        else:
            stats["skipped"] = 1
        # time/train, time/step and the tokens a second sampled and trained
        stats.update(metrics.speeds(t0, time_train, lengths.sum(), mask.sum() * args.num_iterations))
        stats = distributed.mean_over_ranks(stats)  # each rank's mean over an equal share
        run.log(step, stats, ("reward", "completion_length", "kl", "skipped"))

        # ---- 7. evaluate and checkpoint -----------------------------------------------------------
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(evaluate, tasks.before_and_after)


if __name__ == "__main__":
    runs.cli(main, Args)
