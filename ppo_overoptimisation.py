"""PPO-RLHF against reward over-optimisation: ppo.py's loop with the mitigations the literature lists. Copied from
ppo.py unchanged: no phase (each carries a mitigation's option; tests/test_layout.py checks what a variant copies).

A policy trained on a learned reward finds what the reward model pays for that the task does not. Gao et al.
2023 ("Scaling Laws for Reward Model Overoptimization", arXiv:2210.10760) measure it against a gold reward:
as the policy moves away from its start (in KL), the learned score keeps rising while the gold score rises,
peaks and falls. Here the gold reward is the verifier: every step logs its 0/1 (`verifier`) beside the learned
`score` of the same samples, as ppo.py does. This file is ppo.py's loop with each mitigation as an option, off
by default; with none set a run is ppo.py's run, number for number. The math (rewards, GAE, losses, the KL
controller), the four models, the reward and the evaluation's accuracy are ppo.py's, imported.

The reward the policy is trained on, per completion, before ppo.py's missing-EOS penalty and KL penalty:
    s = agg_i( (s_i - μ_i) / σ_i )                    over the K reward models of --ensemble    (ensemble_score)
    r = clip( (s - μ_0) / σ_0, -C, C ) + w · verifier - λ · |y|                                 (shaped_score)
- --ensemble PATH ...: more reward_model.py checkpoints (other seeds) score with --reward-model as one ensemble
  (Coste et al. 2024, "Reward Model Ensembles Help Mitigate Overoptimization", arXiv:2310.02743). A
  Bradley-Terry score has an arbitrary offset and scale per model, so each member's score s_i is first
  standardised by its own mean μ_i and population std σ_i on the starting policy's held-out answers (the first
  evaluation; a resumed run reads them back from its checkpoint). agg is --ensemble-agg: min (worst-case
  optimisation) or mean - k·std over the members (uncertainty-weighted; Coste et al. subtract k times the
  variance, this file the std, so that k is in the score's units). One model: its own score, unstandardised.
- --reward-clip C: the score in units of the starting policy's spread, (s - μ_0) / σ_0 with μ_0, σ_0 its mean and
  population std on the first evaluation's held-out answers, clipped to [-C, C]: C means the same for any
  reward model.
- --verifier-weight w: a composite reward with the true reward in it, + w · verifier (after the clip).
- --length-penalty λ: - λ · |y| per completion token, against the verbosity a reward model learns to pay for.
- --kl-budget: end training before the first update whose batch has a KL per completion (as logged in `kl`)
  above the budget. eval.json's steps_trained says how many steps trained; the checkpoint is the last step
  trained, with the sampler's RNG rewound to before the batch that stopped it, so --resume draws it again.
Each step also logs `score_shaped`: r's batch mean, before the missing-EOS penalty.

What they do on this project's over-optimised case (the SFT model and its reward model, where held-out accuracy
falls from 0.915 to 0.180 while the learned score rises): docs/results.md, "Reward over-optimisation: what
mitigates it"; the ensemble against one reward model on 3 seeds: "PPO on an ensemble of reward models".

Run:
    bash scripts/pipeline.sh runs/pipeline        # first: the SFT model, its reward model, plain ppo.py
    bash scripts/mitigations.sh runs/pipeline     # one run of this file per mitigation, then the table
    python ppo_overoptimisation.py --model <SFT> --reward-model <RM> --reward-clip 1 --verifier-weight 1
    python ppo_overoptimisation.py --reward-model <RM, seed 0> --ensemble <RM, seed 1> <RM, seed 2> --ensemble-agg min

Shapes: B prompts = completions (one each), K reward models, N held-out problems, T completion tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Callable, Literal, Optional

import torch
from tqdm.auto import tqdm

import common
import ppo
from infra import distributed
from infra import fsdp
from infra import metrics
from infra import models
from infra import runs
from task import tasks
from common import InputError, masked_mean, masked_whiten, require
from ppo import (
    adaptive_kl_coef,
    compute_gae,
    explained_variance,
    kl_penalized_rewards,
    ppo_policy_loss,
    ppo_value_loss,
    token_values,
)


@dataclass
class Args(ppo.Args):
    """PPO-RLHF with the mitigations of reward over-optimisation, on the arithmetic task."""

    # ---- the study: mitigations of reward over-optimisation, all off unless set ------------------
    ensemble: tuple[str, ...] = ()
    """more reward_model.py checkpoints (other --seed values): with --reward-model they score as one
    ensemble"""
    ensemble_agg: Literal["min", "mean-std"] = "min"
    """how the ensemble's standardised scores combine (Coste et al. 2024): min, or mean − k·std"""
    ensemble_std_coef: float = 1.0
    """k in mean − k·std"""
    reward_clip: Annotated[Optional[float], runs.none_means("off", "FLOAT")] = None
    """standardise the learned score by the starting policy's held-out mean and std, then clip it to
    [−C, C]"""
    length_penalty: float = 0.0
    """subtracted from the score per completion token"""
    verifier_weight: float = 0.0
    """composite reward: add this times the verifier's 0/1 to the learned score (after --reward-clip)"""
    kl_budget: Annotated[Optional[float], runs.none_means("off", "FLOAT")] = None
    """stop before the first update whose batch has a KL per completion above this (--resume redraws
    that batch)"""


def check_args(args: Args) -> None:
    ppo.check_args(args)
    for name, used in (
        ("ensemble", args.ensemble),
        ("reward-clip", args.reward_clip is not None),
        ("verifier-weight", args.verifier_weight),
    ):
        require(
            not used or args.reward == "model",
            f"--{name} shapes a learned reward: use it with --reward model --reward-model PATH",
        )
    require(args.reward_clip is None or args.reward_clip > 0, "--reward-clip must be > 0")
    require(args.kl_budget is None or args.kl_budget > 0, "--kl-budget must be > 0")
    require(
        args.policy_loss == "clip" and args.kl_old_target == Args.kl_old_target,
        "--policy-loss penalty and its --kl-old-target are ppo.py's: this variant's loop clips",
    )


# ---------------------------------------------------------------------------------------------
# The mitigations: an ensemble's score, and the shaped reward
# ---------------------------------------------------------------------------------------------
def ensemble_score(
    scores: torch.Tensor,
    agg: str = "min",
    std_coef: float = 1.0,
    mean: Optional[torch.Tensor] = None,
    std: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """(K, B) scores of K reward models -> (B,): the minimum over models (worst-case optimisation), or
    mean − k·std with the population std over models (uncertainty-weighted; Coste et al. 2024,
    arXiv:2310.02743, use the variance). One model: its score either way. With several, each is first
    standardised by its own (K,) mean and std on the starting policy: a Bradley-Terry score has an
    arbitrary offset and scale per model."""
    if len(scores) > 1 and mean is not None:
        scores = (scores - mean[:, None]) / std[:, None]
    if agg == "min":
        return scores.amin(0)
    if agg == "mean-std":
        return scores.mean(0) - std_coef * scores.std(0, unbiased=False)
    raise ValueError(f"unknown ensemble aggregation {agg!r}")


def shaped_score(
    scores: torch.Tensor,
    verified: torch.Tensor,
    lengths: torch.Tensor,
    start_score: float,
    start_score_std: float,
    reward_clip: Optional[float] = None,
    verifier_weight: float = 0.0,
    length_penalty: float = 0.0,
) -> torch.Tensor:
    """The reward the policy is trained on, from the reward model's scores (B,), the verifier's 0/1
    (B,) and the completion lengths (B,), before the missing-EOS penalty and the KL. Each term is
    off at its default:
    - reward_clip C: the score in units of the starting policy's spread, (s - mean) / std, clipped
      to [-C, C], so C means the same for any reward model (start_score, start_score_std: the
      starting policy's held-out ones);
    - verifier_weight w: + w · verifier, a composite reward with the true reward in it;
    - length_penalty λ: - λ · length, against the verbosity a reward model learns to pay for. -> (B,)"""
    shaped = scores
    if reward_clip is not None:
        shaped = ((shaped - start_score) / max(start_score_std, 1e-6)).clamp(-reward_clip, reward_clip)
    return shaped + verifier_weight * verified - length_penalty * lengths


# ---------------------------------------------------------------------------------------------
# Training: ppo.py's loop, the reward shaped, the KL budget checked before each update
# ---------------------------------------------------------------------------------------------
def main(args: Args, reward_fn: Callable[[str, str], float] = tasks.verify) -> dict:
    """Train with PPO-RLHF and the mitigations set; returns the final metrics (also in eval.json). With
    --reward verifier, reward_fn(completion, answer) scores the samples; held-out accuracy always uses the
    verifier."""
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    models.set_seed(args.seed)
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    train_stream, heldout = tasks.load_problems(args.dataset, args.seed, args.eval_size, args.batch_size)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    # the ensemble's other members, frozen: before ppo.py's four models, so that each initialisation draws
    # what it draws there
    members = [
        models.load_reward_model(path, tokenizer, device, precision, kernels_on=kernels_on)
        for path in args.ensemble
    ]
    policy, ref_model, reward_model, critic = ppo.load_models(
        args, tokenizer, device, precision, kernels_on, resumed
    )
    # K = 1 + len(--ensemble); with --reward verifier one "model", None: reward_fn
    reward_models = [reward_model, *members]
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout), args.max_new_tokens)
    # --fsdp: 1/N of each model on a rank
    fsdp.shard(args.run.fsdp, policy, ref_model, critic, *reward_models)
    policy_optimizer, _ = common.make_optimizer(policy, args.lr)  # constant rates, no warm-up
    critic_optimizer, _ = common.make_optimizer(critic, args.critic_lr)
    # each rank its own draws
    generator = torch.Generator(device=device).manual_seed(args.seed + distributed.rank())
    minibatch_order = torch.Generator().manual_seed(args.seed)  # the same on every rank, over its own rows
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    kl_coef = resumed["kl_coef"] if resumed else args.kl_coef
    run = runs.Run(
        args,
        "ppo",
        tokenizer,
        device,
        resumed,
        eval_row=lambda result: {"accuracy": result["accuracy"], "score": result["score"]},
    )
    run.checkpointed(
        policy,
        generator,
        others={"critic": critic},
        extra=lambda: {"kl_coef": kl_coef},
        policy_optimizer=policy_optimizer,
        critic_optimizer=critic_optimizer,
        minibatch_order=minibatch_order,
    )
    # a resumed run's data position: batch-size problems a step
    for _ in range((run.first_step - 1) * args.batch_size):
        next(train_stream)

    def score_ensemble(
        prompt_ids, prompt_mask, completion_ids, mask, problems
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(raw scores (K, B): each reward model's, or reward_fn's as K = 1; the verifier's 0/1 (B,))."""
        scored = [
            ppo.score_completions(
                m, reward_fn, tokenizer, prompt_ids, prompt_mask, completion_ids, mask, problems
            )
            for m in reward_models
        ]
        return torch.stack([scores for scores, _ in scored]), scored[0][1]

    ensemble_norm = {}  # each reward model's mean and std on the starting policy's held-out answers (first evaluation)

    def learned_score(raw: torch.Tensor) -> torch.Tensor:
        return ensemble_score(raw, args.ensemble_agg, args.ensemble_std_coef, **ensemble_norm)

    def evaluate(step: int, pass_k: int = 0) -> dict:
        """Greedy held-out accuracy by the verifier, beside the learned score (the ensemble's) of the same
        completions, its mean and std. The first (the starting policy's) also fixes each member's
        standardisation, and its mean and std are --reward-clip's."""
        result = tasks.evaluate_policy(
            policy,
            tokenizer,
            heldout,
            args.max_new_tokens,
            args.seed,
            step,
            pass_k,
            score=lambda *batch: score_ensemble(*batch)[0],
        )
        # (K, N): every rank's share of the problems, in order
        raw = distributed.concat(result.pop("scores").T).T
        if not ensemble_norm:  # the starting policy
            ensemble_norm.update(mean=raw.mean(1), std=raw.std(1, unbiased=False).clamp(min=1e-6))
        scores = learned_score(raw)  # (N,)
        for sample, score in zip(result["samples"], scores):
            sample["score"] = round(score.item(), 4)
        result.update(
            score=scores.mean().item(),
            score_std=scores.std(unbiased=False).item(),
            ensemble_norm={k: v.tolist() for k, v in ensemble_norm.items()},
        )
        tqdm.write(f"step {step}: held-out mean reward {result['score']:.3f} ({args.reward})")
        return result

    before = run.begin(evaluate)
    if resumed:  # the ensemble's standardisation is the starting policy's, from the first evaluation
        ensemble_norm.update({k: torch.tensor(v, device=device) for k, v in before["ensemble_norm"].items()})
    stopped_at = args.steps  # the last step trained: --kl-budget may stop early
    for step in range(run.first_step, args.steps + 1):
        # ---- 1. sample one completion per prompt from the policy --------------------------------
        t0 = time.time()
        # what a --kl-budget stop saves, to sample it again
        rng_before_sampling = distributed.rng_state(generator)
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
        memory_generate = runs.peak_memory_gb(device)
        time_generate = time.time() - t0

        # ---- 2. score, shape the score, and the frozen quantities of this batch -----------------------
        t1 = time.time()
        with torch.no_grad():
            # (K, B), (B,)
            raw, verified = score_ensemble(prompt_ids, prompt_mask, completion_ids, mask, problems)
            scores = learned_score(raw)  # (B,)
            if not torch.isfinite(scores).all():  # caught here, it is not blamed on the loss and --lr
                source = "reward model" if args.reward == "model" else "reward function"
                raise InputError(
                    f"reward became {scores[~torch.isfinite(scores)][0].item()} at step {step}: "
                    f"the {source} returned a non-finite score"
                )
            # (B,) each
            finished = (completion_ids == eos).any(1)
            lengths = mask.sum(1)
            shaped = shaped_score(
                scores,
                verified,
                lengths,
                before["score"],
                before["score_std"],
                args.reward_clip,
                args.verifier_weight,
                args.length_penalty,
            )
            penalised = shaped - args.missing_eos_penalty * (~finished).float()
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
        if args.kl_budget is not None and kl_per_completion > args.kl_budget:
            stopped_at = step - 1
            distributed.set_rng_state(rng_before_sampling, generator)  # rewound: the checkpoint resumes here
            tqdm.write(
                f"step {step}: KL per completion {kl_per_completion:.3f} > --kl-budget {args.kl_budget}: "
                "stopped before this update"
            )
            break
        memory_score = runs.peak_memory_gb(device)
        time_score = time.time() - t1

        # ---- 4. PPO epochs over minibatches: policy and critic, each with its optimizer ------------
        t2 = time.time()
        policy.train()
        critic.train()
        step_metrics = []
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
                    logprobs, old_logprobs[rows], advantages[rows], mask[rows], args.clip_eps
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
                token_means = {
                    **m,
                    "pg_loss": pg_loss.item(),
                    "policy_loss": policy_loss.item(),
                    "vf_loss": vf_loss.item(),
                    "value_clip_ratio": vf_clip,
                    "entropy": entropy_mean.item(),
                }
                # × share × N: the mean over the ranks (mean_over_ranks, below) is then the minibatch's token mean
                step_metrics.append(
                    {
                        **{k: v * share * distributed.world_size() for k, v in token_means.items()},
                        "grad_norm": policy_grad_norm.item(),
                        "critic/grad_norm": critic_grad_norm.item(),
                    }
                )
        memory_update = runs.peak_memory_gb(device)
        time_update = time.time() - t2

        # ---- 5. adaptive KL, log -------------------------------------------------------------------
        kl_used = kl_coef
        if args.target_kl is not None:
            kl_coef = adaptive_kl_coef(
                kl_coef, kl_per_completion, args.target_kl, args.kl_horizon, args.batch_size
            )
        non_score = (-kl_used * kl).sum(1)  # (B,)
        averaged = {k: sum(m[k] for m in step_metrics) / len(step_metrics) for k in step_metrics[0]}
        step_time = time.time() - t0
        stats = {
            "score": scores.mean().item(),
            "score_shaped": shaped.mean().item(),  # after the mitigations, before the missing-EOS penalty
            "score_penalised": penalised.mean().item(),
            "verifier": verified.mean().item(),  # the true reward of the same samples: over-optimisation shows
            "kl": kl_per_completion,
            "kl_coef": kl_used,
            "non_score_reward": non_score.mean().item(),
            "rlhf_reward": (penalised + non_score).mean().item(),
            **averaged,
            "explained_variance": explained_variance(old_values, returns, mask, all_sum=distributed.all_sum),
            "completion_length": mask.sum(1).float().mean().item(),
            "completion_finished": finished.float().mean().item(),
            # the batch (a rank's share)
            "completions/distinct": metrics.distinct_fraction(completion_ids, mask, B),
            # the sampler against the trainer (π_old), at the sampled tokens
            **common.mismatch_metrics(old_logprobs, sampler_logprobs, mask),
            "time/generate": time_generate,
            "time/score": time_score,
            "time/update": time_update,
            "time/step": step_time,
            "tokens_per_second": mask.sum().item() / step_time,
            "memory/generate_gb": memory_generate,
            "memory/score_gb": memory_score,
            "memory/update_gb": memory_update,
        }
        # the batch's (but distinct: within a rank's share; timings)
        stats = distributed.mean_over_ranks(stats)
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

    return run.finish(
        evaluate,
        lambda before, after: {
            **tasks.before_and_after(before, after),
            "score_before": before["score"],
            "score_after": after["score"],
            "steps_trained": stopped_at,
        },
        lambda before, after: (
            f"held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}; "
            f"reward {before['score']:.3f} -> {after['score']:.3f}"
        ),
        last_step=stopped_at,
    )


if __name__ == "__main__":
    runs.cli(main, Args)
