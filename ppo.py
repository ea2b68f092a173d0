"""PPO-RLHF: the InstructGPT recipe with its four models — policy, reference, reward model, critic —
in one file.

Stage 3 of RLHF. The policy samples a completion for each prompt; the reward model trained by
reward_model.py scores it; every token pays a KL penalty for moving away from the frozen
reference; a critic (a second copy of a language model with a scalar head) predicts the return
of every prefix, and GAE turns rewards and values into per-token advantages; the policy and the
critic are then updated for a few epochs with PPO's clipped objectives.

Objective (Ouyang et al. 2022, InstructGPT, arXiv:2203.02155, eq. 2, without the pretraining term), maximised:
    objective(φ) = E_(x, y ~ π_φ) [ r_θ(x, y) - β log( π_φ(y|x) / π_ref(y|x) ) ]
Per token t of a completion of length T (Ziegler et al. 2019, arXiv:1909.08593; Stiennon et al. 2020):
    r_t = -β (log π(y_t|·) - log π_ref(y_t|·)) + [t = T] · r_θ(x, y)                 (kl_penalized_rewards)
    δ_t = r_t + γ V(s_t+1) - V(s_t),  Â_t = Σ_l (γλ)^l δ_t+l,  R_t = Â_t + V(s_t)     (GAE, Schulman 2016, eq. 16)
    L^CLIP = -E_t[ min(ρ_t Â_t, clip(ρ_t, 1-ε, 1+ε) Â_t) ],  ρ_t = π_φ(y_t|·) / π_old(y_t|·)   (PPO 2017, eq. 7)
    L^V = ½ E_t[ max( (V - R_t)², (V_old + clip(V - V_old, -ε_v, ε_v) - R_t)² ) ]    (clipped value loss)
    L^KLPEN = -E_t[ ρ_t Â_t - β_old KL(π_old ‖ π_φ) ], β_old halved below d_targ/1.5, doubled above 1.5 d_targ
                                                      (--policy-loss penalty: PPO 2017, eq. 8, §4)

Conventions a reader could get wrong (each pinned by a test):
- s_t is the prompt plus the completion before token t, so V(s_t) is read from the hidden state
  *before* y_t (the last prompt token for t = 1); the value after the last token is 0.
- γ = 1, λ = 1 by default (0.95 in TRL); padding after EOS gets no reward, no value and no advantage.
  Log-probs are recomputed with the logits divided by the sampling temperature.
- The KL penalty is k1 (log π - log π_ref) per sampled token by default, as in InstructGPT (k3 an
  option). It goes into the reward, not into the loss (GRPO does the opposite).
- Advantages are whitened over the batch's completion tokens (population variance); rewards only
  with --whiten-rewards. Losses are token means over the minibatch.

Where this file departs from InstructGPT, and why:
- No pretraining-mix term (PPO-ptx): there is no pretraining corpus offline.
- The critic starts from the reward model (InstructGPT §3.5; Huang et al. 2024, "N implementation
  details of RLHF with PPO") when there is one, else from the policy with a new head of zeros
  (--critic-init): V = 0 at first, where a random head's values were noise (explained variance -1 to -11).
  `--critic-warmup-steps N` trains the critic alone for N steps (verl's critic_warmup).
- The batch is GRPO's (128 completions a step) in 4 minibatches, one epoch: verl's shape (256 in 4 × 64).
- `--missing-eos-penalty` (off by default, as in TRL and verl) subtracts from the score of a completion
  that hits --max-new-tokens without EOS.
- The KL controller is fixed by default; `--target-kl` turns on Ziegler et al.'s adaptive one.
- With --top-p < 1 the tokens come from the nucleus, but the ratio and the KL use the full softmax
  (as TRL does): the update is off-policy by -log(mass kept) per token.

Reward over-optimisation (Gao et al. 2023, arXiv:2210.10760): each step logs the learned `score` beside
the `verifier`'s 0/1 of the same samples, `kl` and `completion_length`, so the two can be watched parting
ways. The mitigations the literature lists (an ensemble of reward models, a clipped or composite reward, a
length penalty, a KL budget) are a study of their own: ppo_overoptimisation.py, this loop with them in it.

Under `torchrun --nproc_per_node N` a rank samples B/N completions and puts M/N of its rows into
each minibatch of M (M < B: other minibatches than one process's). Advantages are whitened, and the
KL that steers β is averaged, over every rank's completions; losses are divided by the whole
minibatch's tokens and the ranks sum gradients: exact token means.

Run:
    python reward_model.py                                   # stage 2 first: prints its run folder
    python ppo.py --reward-model runs/rm-smollm2-0-<time>/model
    python ppo.py --reward verifier                          # the verifier as the reward; critic from the policy
    torchrun --nproc_per_node 2 ppo.py --reward verifier     # 2 ranks; --fsdp: each holds half of every model

Shapes: B prompts = completions (one each), S prompt tokens, T completion tokens, H hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Callable, Literal, Optional

import torch
from tqdm.auto import tqdm

import common
from infra import distributed
from infra import fsdp
from infra import models
from infra import runs
from infra import stepmetrics
from task import tasks
from common import masked_mean, masked_whiten, require


@dataclass
class Args:
    """PPO-RLHF with four models on the arithmetic task."""

    # ---- experiment: what to train and how it is evaluated ---------------------------------------
    model: str = "smollm2"
    """policy (and reference): smollm2 (embedded), tiny (random, for smoke runs), or a hub id /
    local checkpoint"""
    reward_model: Annotated[Optional[str], runs.none_means("none; required with --reward model", "DIR")] = (
        None
    )
    """a reward_model.py checkpoint (runs/rm-.../model): it scores completions, and the critic
    starts from it"""
    reward: Literal["model", "verifier"] = "model"
    """model: the learned reward model (the RLHF recipe); verifier: the arithmetic verifier's 0/1"""
    critic_init: Annotated[
        Optional[Literal["reward-model", "policy"]],
        runs.none_means("the reward model, else the policy", "{reward-model,policy}"),
    ] = None
    """initialise the critic from the reward model (InstructGPT) or from the policy's backbone with
    a new head"""
    dataset: Annotated[Optional[str], runs.none_means("the built-in arithmetic task", "FILE|DIR|HUB-ID")] = (
        None
    )
    """JSONL file with fields prompt, answer (numeric), or a Hugging Face dataset: a save_to_disk folder or a Hub id
    (openai/gsm8k: its question and #### answer understood)"""
    seed: int = 0
    """seed for problems, sampling and initialisation"""
    eval_every: int = 10
    """evaluate (accuracy and reward) and save a checkpoint every this many steps (0 = only before
    and after)"""
    eval_size: Annotated[Optional[int], runs.none_means("200; 16 for the tiny random models", "INT")] = None
    """held-out problems for greedy accuracy (verifier reward)"""
    pass_k: Annotated[Optional[int], runs.none_means("8; 0 (off) for the tiny random models", "INT")] = None
    """pass@k at the first and last evaluation: k samples a held-out problem at temperature 1 (0 = off)"""
    # ---- algorithm: PPO, GAE and the KL penalty in the reward ------------------------------------
    steps: int = 40
    """PPO iterations, each on a fresh batch of completions (40 × 128: GRPO's 5,120 completions)"""
    batch_size: int = 128
    """prompts per iteration, one completion each: GRPO's batch (16 × 8); verl's GSM8K PPO takes 256"""
    minibatch_size: int = 32
    """completions per gradient step; must divide --batch-size (4 optimizer steps a batch, as verl's 256 / 64)"""
    ppo_epochs: int = 1
    """passes over each batch (verl's ppo_epochs = 1: the policy moves 4 steps a batch, not 8)"""
    clip_eps: float = 0.2
    """ε of the policy's clipped surrogate"""
    policy_loss: Literal["clip", "penalty"] = "clip"
    """clip: L^CLIP (PPO eq. 7); penalty: L^KLPEN (eq. 8), no clipping, a KL(π_old ‖ π) penalty whose β_old
    starts at 1 and adapts to --kl-old-target after each update"""
    kl_old_target: float = 0.01
    """d_targ of --policy-loss penalty: the KL(π_old ‖ π) per token β_old steers to"""
    critic_warmup_steps: int = 0
    """the first this many steps train the critic alone, the policy fixed (verl's critic_warmup, OpenRLHF's
    freezing_actor_steps)"""
    value_clip: float = 0.2
    """ε_v of the clipped value loss"""
    vf_coef: float = 0.1
    """weight of the value loss (TRL's vf_coef); with the critic's own AdamW it matters mostly
    through clipping"""
    entropy_coef: float = 0.0
    """weight of the entropy bonus (0 = off)"""
    gamma: float = 1.0
    """discount γ of GAE"""
    lam: float = 1.0
    """λ of GAE (verl's 1.0: the advantage is the return less V(s_t), not a sum of the critic's own errors)"""
    kl_coef: float = 0.001
    """β of the per-token KL penalty in the reward (the starting value when --target-kl is set; verl's GSM8K
    quickstart: 0.001)"""
    kl_estimator: Literal["k1", "k3"] = "k1"
    """per-token KL penalty: k1 = log π - log π_ref (InstructGPT), k3 = r - 1 - log r with r = π_ref/π"""
    target_kl: Annotated[Optional[float], runs.none_means("a fixed --kl-coef", "FLOAT")] = None
    """adaptive KL controller (Ziegler et al. 2019): the KL per completion to steer towards"""
    kl_horizon: int = 10000
    """horizon of the adaptive KL controller, in completions"""
    missing_eos_penalty: float = 0.0
    """subtracted from the score of a completion that hits --max-new-tokens without EOS (0 = off, as in TRL and
    verl: at 1 it was most batches' only signal, and the policy learned to stop, not to add)"""
    whiten_rewards: bool = False
    """whiten the per-token rewards over the batch before GAE (population variance, mean kept)"""
    # ---- generation: sampling the completions ----------------------------------------------------
    max_new_tokens: int = 32
    """completion length limit, in training and evaluation"""
    temperature: float = 1.0
    """sampling temperature; the same temperature divides the logits when log-probs are recomputed"""
    top_p: float = 1.0
    """nucleus sampling (1.0 = off; no top-k). Below 1 the update is off-policy: ratios and KL use
    the full softmax"""
    # ---- optimisation: the two optimizers, memory and saving -------------------------------------
    lr: float = 1e-5
    """AdamW learning rate of the policy (GRPO's; docs/ppo.md has the search that chose it)"""
    critic_lr: float = 3e-5
    """AdamW learning rate of the critic (3 × the policy's; verl 10 ×, OpenRLHF 18 ×)"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm, for each of the two models"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass to save memory (policy and critic)"""
    run: Annotated[runs.RunOptions, runs.FlatFlags] = runs.option_group(runs.RunOptions)
    lora: Annotated[common.LoraOptions, runs.FlatFlags] = runs.option_group(common.LoraOptions)


def check_args(args: Args) -> None:
    runs.check_options(
        args,
        at_least_one=(
            "steps",
            "batch_size",
            "minibatch_size",
            "ppo_epochs",
            "max_new_tokens",
            "eval_size",
            "kl_horizon",
        ),
        divided_over_ranks="minibatch_size",
    )
    require(
        args.batch_size % args.minibatch_size == 0,
        f"--minibatch-size {args.minibatch_size} must divide --batch-size {args.batch_size}",
    )
    require(
        args.reward != "model" or args.reward_model is not None,
        "--reward model needs --reward-model PATH: train one with `python reward_model.py` (it prints its run "
        "folder; the checkpoint is <run folder>/model), or score with --reward verifier",
    )
    require(
        args.critic_init != "reward-model" or args.reward_model is not None,
        "--critic-init reward-model needs --reward-model PATH; without one leave --critic-init out "
        "(the critic starts from the policy)",
    )
    require(args.temperature > 0, "--temperature must be > 0 for sampling (evaluation is always greedy)")
    require(0 < args.top_p <= 1, "--top-p must be in (0, 1]")
    require(args.target_kl is None or args.target_kl > 0, "--target-kl must be > 0")
    require(args.critic_warmup_steps >= 0, "--critic-warmup-steps must be >= 0")
    require(0 <= args.lam <= 1 and 0 <= args.gamma <= 1, "--gamma and --lam must be in [0, 1]")


# ---------------------------------------------------------------------------------------------
# The math: rewards, GAE, losses, the KL controller
# ---------------------------------------------------------------------------------------------
def kl_penalized_rewards(
    scores: torch.Tensor,  # (B,) r_θ(x, y), one per completion
    logprobs: torch.Tensor,  # (B, T) log π_old of the sampled tokens
    ref_logprobs: torch.Tensor,  # (B, T) log π_ref of the same tokens
    mask: torch.Tensor,  # (B, T)
    kl_coef: float,
    kl_kind: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """r_t = -β·KL_t on every completion token, plus the score on the last one (Ziegler et al. 2019,
    eq. 2), with KL_t = k1 = log π - log π_ref, or k3 = r - 1 - log r with r = π_ref/π. Padding gets
    0. -> rewards, kl (B, T)"""
    log_ratio = logprobs - ref_logprobs  # (B, T)
    kl = log_ratio if kl_kind == "k1" else torch.exp(-log_ratio) - 1 + log_ratio
    rewards = -kl_coef * kl * mask  # (B, T)
    last = (mask.sum(1) - 1).clamp(min=0).long()  # (B,) index of the last completion token
    rewards[torch.arange(len(scores)), last] += scores
    return rewards, kl * mask


def compute_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016, eq. 16): Â_t = Σ_l (γλ)^l δ_t+l with δ_t = r_t + γ V(s_t+1) - V(s_t).

    rewards, values, mask (B, T) -> (advantages (B, T), returns (B, T)), returns = Â + V.
    The completion ends at its last masked token: V after it is 0, and padding gets 0 advantage and return.
    """
    T = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    next_advantage = torch.zeros_like(rewards[:, 0])  # (B,)
    next_value = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        m = mask[:, t].to(rewards.dtype)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = advantage * m
        # at padding, carry nothing back: the token before it is the last one
        next_advantage = advantage * m
        next_value = values[:, t] * m
    returns = (advantages + values) * mask
    return advantages, returns


def ppo_policy_loss(
    logprobs, old_logprobs, advantages, mask, clip_eps: float = 0.2, penalty: Optional[float] = None
) -> tuple[torch.Tensor, dict]:
    """L^CLIP (PPO eq. 7), or with `penalty` = β L^KLPEN (eq. 8): -(ρ Â - β KL(π_old ‖ π_θ)), unclipped; negated
    for minimising, token mean over the mask. All (B, T); advantages per token. The KL per token is k3 of the
    sampled token, drawn from π_old: ρ - 1 - log ρ, unbiased (E_old[ρ] = 1) and ≥ 0.
    -> (loss, {approx_kl: mean ½(log ρ)² as TRL, clip_ratio: the share of tokens where the clipped term is used,
    kl_old: the k3 KL's mean})"""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)  # (B, T)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    kl = ratio - 1.0 - log_ratio  # (B, T)
    loss = masked_mean(torch.max(pg_loss1, pg_loss2) if penalty is None else pg_loss1 + penalty * kl, mask)
    with torch.no_grad():
        metrics = {
            "approx_kl": masked_mean(0.5 * log_ratio**2, mask).item(),
            "clip_ratio": masked_mean((pg_loss2 > pg_loss1) & (penalty is None), mask).item(),
            "kl_old": masked_mean(kl, mask).item(),
        }
    return loss, metrics


def adapted_penalty(beta: float, kl: float, target: float) -> float:
    """PPO §4's rule for β after each update, d (`kl`) the update's KL and d_targ its `target`: halved if
    d < d_targ/1.5, doubled if d > 1.5 d_targ, else kept."""
    if kl < target / 1.5:
        return beta / 2
    if kl > target * 1.5:
        return beta * 2
    return beta


@torch.no_grad()
def updated_kl(
    policy, prompt_ids, prompt_mask, completion_ids, old_logprobs, mask, temperature: float
) -> float:
    """d of PPO §4, read once the update's epochs are done: Ê_t[KL(π_old ‖ π_θ)] of the updated policy on the batch's
    completion tokens, k3 of the sampled token (ρ - 1 - log ρ, as ppo_policy_loss's), over every rank's tokens."""
    ones = torch.ones(len(completion_ids), dtype=torch.long, device=completion_ids.device)
    logprobs, _ = common.completion_logprobs(
        policy, prompt_ids, prompt_mask, completion_ids, ones, temperature
    )
    log_ratio = logprobs - old_logprobs  # (B, T)
    kl = torch.exp(log_ratio) - 1.0 - log_ratio
    return masked_mean(kl, mask, all_sum=distributed.all_sum).item()


def ppo_value_loss(values, old_values, returns, mask, clip_range: float = 0.2) -> tuple[torch.Tensor, float]:
    """½ max((V - R)², (V_old + clip(V - V_old, ±ε_v) - R)²), token mean. All (B, T).
    -> (loss, value clip ratio: the share of tokens where the clipped term was larger)"""
    clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    vf_loss1 = (values - returns) ** 2
    vf_loss2 = (clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(vf_loss1, vf_loss2), mask)
    return loss, masked_mean((vf_loss2 > vf_loss1).float(), mask).item()


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, all_sum: Optional[Callable] = None
) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens (every rank's, with all_sum as in masked_mean): 1 is a perfect
    critic, 0 no better than a mean."""

    def mean(x: torch.Tensor) -> torch.Tensor:
        return masked_mean(x, mask, all_sum=all_sum)

    var_returns = mean((returns - mean(returns)) ** 2)
    residual = returns - values
    var_residual = mean((residual - mean(residual)) ** 2)
    return (1.0 - var_residual / var_returns).item() if var_returns > 0 else float("nan")


def adaptive_kl_coef(kl_coef: float, kl: float, target: float, horizon: int, n_completions: int) -> float:
    """Ziegler et al. 2019, §2.2: e = clip(KL/target - 1, -0.2, 0.2); β ← β (1 + e · n / horizon)."""
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return kl_coef * (1.0 + error * n_completions / horizon)


def token_values(critic, prompt_ids, prompt_mask, completion_ids) -> torch.Tensor:
    """V(s_t) for each completion token t: the critic's head on the hidden state *before* y_t. (B, T)
    The hidden state at position S-1+t has read the prompt and y_<t, which is the state s_t."""
    S, T = prompt_ids.shape[1], completion_ids.shape[1]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, S+T)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    inner = common.unwrap(critic)  # through a LoRA wrapper
    with common.autocast(critic):
        # (B, S+T, H)
        hidden = inner.base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=common.position_ids(attention_mask),
        ).last_hidden_state
        return inner.score(hidden[:, S - 1 : S + T - 1]).squeeze(-1).float()  # (B, T)


# ---------------------------------------------------------------------------------------------
# The four models, the reward, the evaluation
# ---------------------------------------------------------------------------------------------
def load_models(
    args: Args, tokenizer, device, precision: str, kernels_on: bool, resumed: Optional[dict]
) -> tuple:
    """The reward model (frozen; none with --reward verifier), the critic, the policy and its frozen reference
    (the starting model, also when resuming; with LoRA none: the policy with its adapter off).

    The critic starts from the reward model (InstructGPT §3.5) or from the policy's backbone with a new head
    (--critic-init). With LoRA the critic is its own model with its own adapter and a fully trained head, not a
    second adapter on the policy's weights: the value head would then read features the policy's adapter keeps
    moving. The critic loads before the policy and gets its adapter after the policy's, so that each random
    initialisation draws what it always has. -> (policy, ref_model, reward_model, critic)"""
    reward_model = None
    if args.reward == "model":
        reward_model = models.load_reward_model(
            args.reward_model, tokenizer, device, precision, kernels_on=kernels_on
        )
    critic_init = args.critic_init or ("reward-model" if args.reward_model is not None else "policy")
    critic_source = args.reward_model if critic_init == "reward-model" else args.model
    critic = models.load_model(
        f"{args.run.resume}/model/critic" if resumed else critic_source,
        len(tokenizer),
        device,
        precision,
        args.seed,
        head="value",
        keep_adapter=bool(resumed),
        kernels_on=kernels_on,
    )
    policy, ref_model = models.load_policy(
        args, tokenizer, device, precision, kernels_on, resumed, with_reference=True
    )
    if args.lora.lora_r and not resumed:
        critic = common.add_lora(critic, critic_source, args.lora)
    if args.gradient_checkpointing:
        critic.activation_checkpointing_enable()
    return policy, ref_model, reward_model, critic


def score_completions(
    reward_model, reward_fn, tokenizer, prompt_ids, prompt_mask, completion_ids, mask, problems
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reward r_θ(x, y) of each completion: the reward model's score of the prompt and completion tokens, or,
    with no reward model (--reward verifier), reward_fn(text, answer). Beside it the verifier's 0/1 of the same
    completions, logged as the true reward. -> (scores (B,), verified (B,))"""
    texts = tasks.decode_completions(tokenizer, completion_ids, mask)
    answers = [p.answer for p in problems]
    verified = torch.tensor([tasks.verify(t, a) for t, a in zip(texts, answers)], device=mask.device)
    if reward_model is None:
        scores = torch.tensor([reward_fn(t, a) for t, a in zip(texts, answers)], device=mask.device)
        return scores, verified
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, mask], dim=1)
    return common.reward_scores(reward_model, input_ids, attention_mask), verified


def evaluate_with_reward(
    policy, tokenizer, heldout, args: Args, score: Callable, step: int, pass_k: int = 0
) -> dict:
    """Greedy held-out accuracy by the verifier, beside the mean reward (`score`'s) of the same completions; each
    sample keeps its own. It reads the models and changes nothing the training uses."""
    result = tasks.evaluate_policy(
        policy,
        tokenizer,
        heldout,
        args.max_new_tokens,
        args.seed,
        step,
        pass_k,
        score=lambda *batch: score(*batch)[0],
    )
    # (N,): every rank's share of the problems, in order
    scores = distributed.concat(result.pop("scores"))
    for sample, reward in zip(result["samples"], scores):
        sample["score"] = round(reward.item(), 4)
    result["score"] = scores.mean().item()
    tqdm.write(f"step {step}: held-out mean reward {result['score']:.3f} ({args.reward})")
    return result


def eval_row(result: dict) -> dict:
    """An evaluation's numbers in eval.json's list of evaluations: held-out accuracy and mean reward."""
    return {"accuracy": result["accuracy"], "score": result["score"]}


def results(before: dict, after: dict) -> dict:
    """eval.json's own numbers: the task's before and after (tasks.before_and_after), and the mean reward's."""
    return {
        **tasks.before_and_after(before, after),
        "score_before": before["score"],
        "score_after": after["score"],
    }


def headline(before: dict, after: dict) -> str:
    """The summary's line: held-out accuracy and mean reward, before -> after."""
    return (
        f"held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}; "
        f"reward {before['score']:.3f} -> {after['score']:.3f}"
    )


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args, reward_fn: Callable[[str, str], float] = tasks.verify) -> dict:
    """Train with PPO-RLHF; returns the final metrics (also in eval.json). With --reward verifier,
    reward_fn(completion, answer) scores the samples; held-out accuracy always uses the verifier."""
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    models.set_seed(args.seed)
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    train_stream, heldout = tasks.load_problems(args.dataset, args.seed, args.eval_size, args.batch_size)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    policy, ref_model, reward_model, critic = load_models(
        args, tokenizer, device, precision, kernels_on, resumed
    )
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout), args.max_new_tokens)
    # --fsdp: 1/N of each model on a rank
    fsdp.shard(args.run.fsdp, policy, ref_model, critic, reward_model)
    policy_optimizer, _ = common.make_optimizer(policy, args.lr)  # constant rates, no warm-up
    critic_optimizer, _ = common.make_optimizer(critic, args.critic_lr)
    # each rank its own draws
    generator = torch.Generator(device=device).manual_seed(args.seed + distributed.rank())
    minibatch_order = torch.Generator().manual_seed(args.seed)  # the same on every rank, over its own rows
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    kl_coef = resumed["kl_coef"] if resumed else args.kl_coef
    penalty = resumed["penalty"] if resumed else 1.0  # --policy-loss penalty: β_old
    run = runs.Run(args, "ppo", tokenizer, device, resumed, eval_row=eval_row)
    run.checkpointed(
        policy,
        generator,
        others={"critic": critic},
        extra=lambda: {"kl_coef": kl_coef, "penalty": penalty},
        policy_optimizer=policy_optimizer,
        critic_optimizer=critic_optimizer,
        minibatch_order=minibatch_order,
    )
    # a resumed run's data position: batch-size problems a step
    for _ in range((run.first_step - 1) * args.batch_size):
        next(train_stream)

    def score(*batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt_ids, prompt_mask, completion_ids, mask, problems) -> the reward (B,), the verifier's 0/1 (B,)"""
        return score_completions(reward_model, reward_fn, tokenizer, *batch)

    def evaluate(step: int, pass_k: int = 0) -> dict:
        return evaluate_with_reward(policy, tokenizer, heldout, args, score, step, pass_k)

    clock = stepmetrics.PhaseClock(device)  # each phase's time and peak memory, logged
    run.begin(evaluate)
    for step in range(run.first_step, args.steps + 1):
        # ---- 1. sample one completion per prompt from the policy --------------------------------
        clock.start()
        problems = distributed.share([next(train_stream) for _ in range(args.batch_size)])  # B/N on a rank
        prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in problems], device)
        policy.eval()
        # (B, T) each: the tokens, and their log-probs as the sampler drew them
        completion_ids, sampler_logprobs = common.sample_with_logprobs(
            policy,
            prompt_ids,
            prompt_mask,
            1,
            args.max_new_tokens,
            eos,
            pad,
            args.temperature,
            args.top_p,
            generator,
        )
        mask = common.completion_mask(completion_ids, eos)  # (B, T), EOS included
        width = int(mask.sum(1).max())  # drop columns that are padding in every row
        completion_ids, mask = completion_ids[:, :width], mask[:, :width]
        sampler_logprobs = sampler_logprobs[:, :width]
        # this rank's rows of a (mini)batch
        B = len(problems)
        M = args.minibatch_size // distributed.world_size()
        ones = torch.ones(B, dtype=torch.long, device=device)
        clock.lap("generate")

        # ---- 2. score, and the frozen quantities of this batch -------------------------------------
        with torch.no_grad():
            # (B,) each
            scores, verified = score(prompt_ids, prompt_mask, completion_ids, mask, problems)
            # caught here, it is not blamed on the loss and --lr
            runs.check_rewards(scores, step, "reward model" if args.reward == "model" else "reward function")
            finished = (completion_ids == eos).any(1)  # (B,)
            penalised = scores - args.missing_eos_penalty * (~finished).float()
            # (B, T)
            old_logprobs, _ = common.completion_logprobs(
                policy, prompt_ids, prompt_mask, completion_ids, ones, args.temperature
            )
            with common.reference(policy, ref_model) as ref:
                ref_logprobs, _ = common.completion_logprobs(
                    ref, prompt_ids, prompt_mask, completion_ids, ones, args.temperature
                )
            critic.eval()
            old_values = token_values(critic, prompt_ids, prompt_mask, completion_ids)  # (B, T)

            # ---- 3. per-token rewards, GAE, whitened advantages ---------------------------------------
            rewards, kl = kl_penalized_rewards(
                penalised, old_logprobs, ref_logprobs, mask, kl_coef, args.kl_estimator
            )
            if args.whiten_rewards:  # over the whole batch's tokens: every rank's
                rewards = masked_whiten(rewards, mask, shift_mean=False, all_sum=distributed.all_sum) * mask
            advantages, returns = compute_gae(rewards, old_values, mask, args.gamma, args.lam)
            advantages = masked_whiten(advantages, mask, all_sum=distributed.all_sum) * mask
        # the whole batch's
        kl_per_completion = distributed.mean_over_ranks({"kl": kl.sum(1).mean().item()})["kl"]
        clock.lap("score")

        # ---- 4. PPO epochs over minibatches: policy and critic, each with its optimizer ------------
        policy.train()
        critic.train()
        step_metrics = stepmetrics.MinibatchMeans()
        for epoch in range(args.ppo_epochs):
            # under torchrun: M/N of each rank's B/N rows
            order = torch.randperm(B, generator=minibatch_order)
            for start in range(0, B, M):
                rows = order[start : start + M].to(device)
                logprobs, entropy = common.completion_logprobs(
                    policy,
                    prompt_ids[rows],
                    prompt_mask[rows],
                    completion_ids[rows],
                    ones[rows],
                    args.temperature,
                    with_entropy=True,
                    entropy_grad=args.entropy_coef > 0,
                )
                pg_loss, m = ppo_policy_loss(
                    logprobs,
                    old_logprobs[rows],
                    advantages[rows],
                    mask[rows],
                    args.clip_eps,
                    penalty if args.policy_loss == "penalty" else None,
                )
                entropy_mean = masked_mean(entropy, mask[rows])
                policy_loss = pg_loss - args.entropy_coef * entropy_mean
                values = token_values(critic, prompt_ids[rows], prompt_mask[rows], completion_ids[rows])
                vf_loss, vf_clip = ppo_value_loss(
                    values, old_values[rows], returns[rows], mask[rows], args.value_clip
                )
                run.check_finite(policy_loss + vf_loss, step)
                # this rank's part of the minibatch's tokens; 1.0 alone
                share = distributed.share_of(mask[rows].sum())
                # the two models share no parameters
                ((policy_loss + args.vf_coef * vf_loss) * share).backward()
                # Σ over the ranks
                distributed.all_reduce_grads(policy)
                distributed.all_reduce_grads(critic)
                policy_grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
                run.check_finite(policy_grad_norm, step, "policy gradient norm")
                critic_grad_norm = torch.nn.utils.clip_grad_norm_(critic.parameters(), args.max_grad_norm)
                run.check_finite(critic_grad_norm, step, "critic gradient norm")
                # --critic-warmup-steps: the policy waits while the critic learns (verl's critic_warmup)
                if step > args.critic_warmup_steps:
                    policy_optimizer.step()
                critic_optimizer.step()
                # now, not at the next backward: idle through sampling
                policy_optimizer.zero_grad(set_to_none=True)
                critic_optimizer.zero_grad(set_to_none=True)
                stepmetrics.add_ppo_minibatch(
                    step_metrics,
                    share,
                    m,
                    pg_loss=pg_loss,
                    policy_loss=policy_loss,
                    vf_loss=vf_loss,
                    value_clip_ratio=vf_clip,
                    entropy=entropy_mean,
                    grad_norm=policy_grad_norm,
                    critic_grad_norm=critic_grad_norm,
                )
        clock.lap("update")

        # ---- 5. adaptive KL, log -------------------------------------------------------------------
        kl_used = kl_coef
        if args.target_kl is not None:
            kl_coef = adaptive_kl_coef(
                kl_coef, kl_per_completion, args.target_kl, args.kl_horizon, args.batch_size
            )
        averaged = step_metrics.mean()
        if args.policy_loss == "penalty":
            averaged["penalty"] = penalty
            # PPO §4's d, after the epochs: the updated policy's KL on the batch, every rank's (one β on every rank)
            averaged["kl_old_after"] = updated_kl(
                policy, prompt_ids, prompt_mask, completion_ids, old_logprobs, mask, args.temperature
            )
            penalty = adapted_penalty(penalty, averaged["kl_old_after"], args.kl_old_target)
        stats = stepmetrics.ppo_step_stats(
            scores=scores,
            penalised=penalised,
            verified=verified,
            kl=kl,
            kl_per_completion=kl_per_completion,
            kl_coef=kl_used,
            minibatch_means=averaged,
            explained_variance=explained_variance(old_values, returns, mask, all_sum=distributed.all_sum),
            completion_ids=completion_ids,
            mask=mask,
            finished=finished,
            old_logprobs=old_logprobs,
            sampler_logprobs=sampler_logprobs,
            clock=clock,
        )
        run.log(
            step,
            stats,
            {
                "score": f"{stats['score']:.3f}",
                "verifier": f"{stats['verifier']:.2f}",
                "kl": f"{stats['kl']:.3f}",
            },
        )

        # ---- 6. evaluate and checkpoint -------------------------------------------------------------
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(evaluate, results, headline)


if __name__ == "__main__":
    runs.cli(main, Args)
