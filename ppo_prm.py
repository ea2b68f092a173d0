"""PPO with a process reward model's dense rewards: each reasoning step's score on the token that ends it, GAE carrying
it back to the tokens before. A variant of ppo.py: its loop, copied, with phases 2 and 3 changed and the rest following
the dense rewards and one process; the losses, the critic, the KL penalty and every option of ppo.py are its. Copied
from ppo.py unchanged: phase 6 (tests/test_layout.py checks).

    r_t = -β (log π(y_t|·) - log π_ref(y_t|·)) + Σ_j [t = index(j)] σ(z_j) - [t = T] · missing_eos_penalty · [no EOS]
z_j is the PRM's logit at step j's last token index(j) (the steps are the completion's lines, found on the sampled
tokens: task/stepwise.py's completion_steps, score_steps and dense_step_rewards); there is no outcome score, and the
verifier's 0/1 of the same samples is logged as `score`, never trained on. Math-Shepherd's step-by-step PPO (Wang et
al. 2023, arXiv:2312.08935, §3.3); the source documents' argument for a critic: dense, step-wise rewards are what
GAE's bootstrapping is for, where a group's statistics see only a sum (grpo_prm.py is the GRPO side).

Why a file of its own: the PRM is a second scoring model that only this study loads, scored on the completion's
steps; its rewards are per token (B, T) where ppo.py's score is per completion.

Run:
    python prm.py                                        # the process reward model first: prints its run folder
    python ppo_prm.py --prm runs/prm-smollm2-0-<time>/model
    python ppo_prm.py --model tiny --prm <a tiny prm.py run>/model --steps 3
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Annotated, Callable, Literal, Optional

import torch

import common
import ppo
from infra import distributed
from infra import fsdp
from infra import metrics
from infra import models
from infra import runs
from task import stepwise, tasks
from common import masked_mean, masked_whiten, require


@dataclass
class Args(ppo.Args):
    """PPO on a prm.py checkpoint's dense step rewards."""

    reward: Literal["model", "verifier"] = "verifier"
    """the outcome, only logged: verifier (its 0/1 as `score`)"""
    prm: Annotated[Optional[str], runs.none_means("required", "DIR")] = None
    """a prm.py checkpoint (<its run folder>/model): the σ of its score at each step's last token is that token's
    reward (the steps are the completion's lines)"""


def check_args(args: Args) -> None:
    ppo.check_args(args)
    require(
        args.prm is not None,
        "--prm DIR is required: train a process reward model with `python prm.py` (it prints its run folder; the "
        "checkpoint is <run folder>/model)",
    )
    require(
        args.reward == "verifier" and args.reward_model is None,
        "--prm takes its rewards from the PRM's step scores alone: drop --reward model and --reward-model, whose "
        "outcome score it would not train on",
    )
    # two ranks were measured to end with other weights than one process: refused until that is found
    require(distributed.world_size() == 1, "ppo_prm.py does not run under torchrun yet: run it alone")


def main(args: Args, reward_fn: Callable[[str, str], float] = tasks.verify) -> dict:
    """Train with PPO on the PRM's dense step rewards; returns the final metrics (also in eval.json).
    reward_fn(completion, answer), the outcome, is only logged; held-out accuracy always uses the verifier."""
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    models.set_seed(args.seed)
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    train_stream, heldout = tasks.load_problems(args.dataset, args.seed, args.eval_size, args.batch_size)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    policy, ref_model, _, critic = ppo.load_models(args, tokenizer, device, precision, kernels_on, resumed)
    prm = models.load_reward_model(args.prm, tokenizer, device, precision, kernels_on)
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout), args.max_new_tokens)
    # --fsdp: 1/N of each model on a rank
    fsdp.shard(args.run.fsdp, policy, ref_model, critic, prm)
    policy_optimizer, _ = common.make_optimizer(policy, args.lr)  # constant rates, no warm-up
    critic_optimizer, _ = common.make_optimizer(critic, args.critic_lr)
    # each rank its own draws
    generator = torch.Generator(device=device).manual_seed(args.seed + distributed.rank())
    minibatch_order = torch.Generator().manual_seed(args.seed)  # the same on every rank, over its own rows
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    kl_coef = resumed["kl_coef"] if resumed else args.kl_coef
    penalty = resumed["penalty"] if resumed else 1.0  # --policy-loss penalty: β_old
    run = runs.Run(
        args,
        "ppo-prm",
        tokenizer,
        device,
        resumed,
        eval_row=lambda result: {"accuracy": result["accuracy"], "score": result["score"]},
    )
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
    # (prompt_ids, prompt_mask, completion_ids, mask, problems) -> the reward (B,), the verifier's 0/1 (B,)
    score = functools.partial(ppo.score_completions, None, reward_fn, tokenizer)
    evaluate = functools.partial(ppo.evaluate_with_reward, policy, tokenizer, heldout, args, score)

    run.begin(evaluate)
    for step in range(run.first_step, args.steps + 1):
        # ---- 1. sample one completion per prompt from the policy --------------------------------
        t0 = time.time()
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

        # ---- 2. score each step with the PRM (trained on), each outcome with the verifier (logged) --
        t1 = time.time()
        with torch.no_grad():
            # (B,) each: the outcome reward_fn's, only logged, and the verifier's 0/1
            scores, verified = score(prompt_ids, prompt_mask, completion_ids, mask, problems)
            texts, step_ends, step_mask = stepwise.completion_steps(tokenizer, completion_ids, mask)
            prompts = [p.prompt for p in problems]
            step_scores = torch.sigmoid(stepwise.score_steps(prm, tokenizer, prompts, texts)[0])  # (B, K)
            # (B, T): each step's σ(score) on the token that ends it
            dense = stepwise.dense_step_rewards(step_scores, step_ends, step_mask, completion_ids.shape[1])
            finished = (completion_ids == eos).any(1)  # (B,)
            # no outcome score: the truncation penalty alone goes on the last token, as in ppo.py
            penalised = -args.missing_eos_penalty * (~finished).float()
            # (B, T)
            old_logprobs, _ = common.completion_logprobs(
                policy, prompt_ids, prompt_mask, completion_ids, ones, args.temperature
            )
            with common.reference(policy, ref_model) as ref:
                ref_logprobs, _ = common.completion_logprobs(
                    ref, prompt_ids, prompt_mask, completion_ids, ones, args.temperature
                )
            critic.eval()
            old_values = ppo.token_values(critic, prompt_ids, prompt_mask, completion_ids)  # (B, T)

            # ---- 3. per-token rewards (the KL penalty, and the PRM's step rewards), GAE, advantages --
            rewards, kl = ppo.kl_penalized_rewards(
                penalised, old_logprobs, ref_logprobs, mask, kl_coef, args.kl_estimator
            )
            rewards = rewards + dense * mask
            if args.whiten_rewards:  # over the whole batch's tokens: every rank's
                rewards = masked_whiten(rewards, mask, shift_mean=False, all_sum=distributed.all_sum) * mask
            advantages, returns = ppo.compute_gae(rewards, old_values, mask, args.gamma, args.lam)
            advantages = masked_whiten(advantages, mask, all_sum=distributed.all_sum) * mask
        # the whole batch's
        kl_per_completion = distributed.mean_over_ranks({"kl": kl.sum(1).mean().item()})["kl"]
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
                pg_loss, m = ppo.ppo_policy_loss(
                    logprobs,
                    old_logprobs[rows],
                    advantages[rows],
                    mask[rows],
                    args.clip_eps,
                    penalty if args.policy_loss == "penalty" else None,
                )
                entropy_mean = masked_mean(entropy, mask[rows])
                policy_loss = pg_loss - args.entropy_coef * entropy_mean
                values = ppo.token_values(critic, prompt_ids[rows], prompt_mask[rows], completion_ids[rows])
                vf_loss, vf_clip = ppo.ppo_value_loss(
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
            kl_coef = ppo.adaptive_kl_coef(
                kl_coef, kl_per_completion, args.target_kl, args.kl_horizon, args.batch_size
            )
        non_score = (-kl_used * kl).sum(1)  # (B,)
        averaged = {k: sum(m[k] for m in step_metrics) / len(step_metrics) for k in step_metrics[0]}
        if args.policy_loss == "penalty":
            averaged["penalty"] = penalty
            # PPO §4's d, after the epochs: the updated policy's KL on the batch, every rank's (one β on every rank)
            averaged["kl_old_after"] = ppo.updated_kl(
                policy, prompt_ids, prompt_mask, completion_ids, old_logprobs, mask, args.temperature
            )
            penalty = ppo.adapted_penalty(penalty, averaged["kl_old_after"], args.kl_old_target)
        step_time = time.time() - t0
        stats = {
            "score": scores.mean().item(),
            "prm/step_score": masked_mean(step_scores, step_mask).item(),
            "prm/steps": step_mask.sum(1).float().mean().item(),
            "prm/reward": dense.sum(1).mean().item(),
            "score_penalised": penalised.mean().item(),
            "verifier": verified.mean().item(),  # the true reward of the same samples: over-optimisation shows
            "kl": kl_per_completion,
            "kl_coef": kl_used,
            "non_score_reward": non_score.mean().item(),
            "rlhf_reward": (penalised + dense.sum(1) + non_score).mean().item(),
            **averaged,
            "explained_variance": ppo.explained_variance(
                old_values, returns, mask, all_sum=distributed.all_sum
            ),
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

    return run.finish(evaluate, ppo.results, ppo.headline)


if __name__ == "__main__":
    runs.cli(main, Args)
