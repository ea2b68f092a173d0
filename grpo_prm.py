"""GRPO with process supervision: a process reward model scores each reasoning step, and the step scores, not the
outcome, make the advantages (DeepSeekMath, Shao et al. 2024, arXiv:2402.03300, §4.1.3). A variant of grpo.py: its
loop, copied, with phases 2 and 3 changed; the loss, the logging and every option of grpo.py are its. Copied from
grpo.py unchanged: phases 1, 4, 5, 6 and 7 (tests/test_layout.py checks).

    Â_it = Σ_{index(j) ≥ t} (r_i^index(j) - mean(R)) / std(R)
R is every step reward of the group's G completions, r_i^index(j) the PRM's score σ(z) of o_i's step j, which ends at
token index(j); each token's advantage sums the normalised scores of its step and the steps after it. The steps are
the completion's lines (task/stepwise.py splits them and reads the PRM at each step's end; process_advantages is the
equation above). A group whose step scores are all equal gets exactly 0, and --dynamic-sampling drops it; with
--no-scale-by-std only the mean is subtracted (Dr. GRPO). The outcome reward (the verifier's 0/1) is logged beside it
(`reward`), never trained on, so the options that shape it (--reward-model, --rewards, --reward-weights,
--overlong-buffer) are refused.

Why a file of its own: the PRM is a second scoring model that only this study loads, scored on the completion's
steps retokenised with the PRM's prompt, and its advantages are per token (B, T) where grpo.py's are per completion.

Run:
    python prm.py                                        # the process reward model first: prints its run folder
    python grpo_prm.py --prm runs/prm-smollm2-0-<time>/model
    python grpo_prm.py --model tiny --prm <a tiny prm.py run>/model --steps 3
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass
from typing import Annotated, Callable, Optional

import torch

import common
import grpo
from infra import distributed
from infra import fsdp
from infra import metrics
from infra import models
from infra import runs
from infra import stepmetrics
from task import stepwise, tasks
from common import masked_mean, require


@dataclass
class Args(grpo.Args):
    """GRPO with process supervision: a prm.py checkpoint's step scores as the advantages."""

    prm: Annotated[Optional[str], runs.none_means("required", "DIR")] = None
    """a prm.py checkpoint (<its run folder>/model): each step's score normalised over the group and summed from that
    step on is the advantage (the steps are the completion's lines)"""


def check_args(args: Args) -> None:
    grpo.check_args(args)
    require(
        args.prm,
        "--prm DIR is required: train a process reward model with `python prm.py` (it prints its run folder; the "
        "checkpoint is <run folder>/model)",
    )
    outcome = (
        args.reward_model,
        args.rewards,
        args.reward_weights,
        args.overlong_buffer,
        args.overlong_penalty,
    )
    require(
        outcome == (None, ("correct",), None, 0, Args.overlong_penalty),
        "--prm takes its advantages from the PRM's step scores alone: drop --reward-model, --rewards, "
        "--reward-weights, --overlong-buffer and --overlong-penalty, which shape the outcome reward it only logs",
    )


def main(args: Args, reward_fn: Optional[Callable[[str, str], float]] = None) -> dict:
    """Train with GRPO and process supervision; returns the final metrics (also in eval.json). reward_fn(completion,
    answer) -> float is the outcome reward, only logged (default: --verifier's)."""
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    reward_fn = reward_fn or tasks.VERIFIERS[args.verifier]
    models.set_seed(args.seed)
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    train_stream, heldout = tasks.load_problems(
        args.dataset, args.seed, args.eval_size, args.prompts_per_step
    )
    # DeepSeek-R1's template: <think> … </think><answer> … </answer>, held-out too
    if args.prompt_style == "r1":
        train_stream, heldout = tasks.with_prompt_style("r1", train_stream, heldout)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    # the reference is the starting model, also when resuming; with LoRA it is the policy with its adapter off
    policy, ref_model = models.load_policy(
        args, tokenizer, device, precision, kernels_on, resumed, args.beta != 0
    )
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout), args.max_new_tokens)
    prm = models.load_reward_model(args.prm, tokenizer, device, precision, kernels_on)
    fsdp.shard(args.run.fsdp, policy, ref_model, prm)  # --fsdp: 1/N of each model's weights
    optimizer, scheduler = common.make_optimizer(
        policy, args.lr, args.weight_decay, args.warmup_steps, args.steps if args.lr_decay else 0
    )
    # each rank its own draws
    generator = torch.Generator(device=device).manual_seed(args.seed + distributed.rank())
    G = args.group_size

    run = runs.Run(args, "grpo-prm", tokenizer, device, resumed)  # the run folder, metrics.jsonl, checkpoints
    # what a checkpoint holds; resumed here
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

        # ---- 2. score each step with the PRM, and each outcome with the verifier (logged only) ----
        texts = tasks.decode_completions(tokenizer, completion_ids, mask)
        answers = [p.answer for p in problems for _ in range(G)]
        scored = tasks.score_completions(texts, answers, ("correct",), reward_fn, device)
        runs.check_rewards(scored.rewards, step)
        rewards = scored.rewards[:, 0]  # (B,) the outcome's 0/1
        lengths = mask.sum(1)  # (B,)
        prompts = [p.prompt for p in problems for _ in range(G)]
        # (B, T) Σ of the normalised step scores from each token's step on; (B, K) each step's σ(score), its mask
        advantages, step_scores, step_mask = stepwise.process_supervision(
            prm, tokenizer, prompts, completion_ids, mask, G, args.scale_by_std
        )

        # ---- 3. process-supervised advantages (above), and the groups they leave ----------------
        stats = metrics.reward_stats(rewards, rewards, scored, ("correct",), G, False)
        stats.update(metrics.completion_stats(completion_ids, mask, tokenizer.eos_token_id, G, time_generate))
        stats["prm/step_score"] = masked_mean(step_scores, step_mask).item()
        stats["prm/steps"] = step_mask.sum(1).float().mean().item()
        if args.dynamic_sampling:  # DAPO: drop the groups whose every advantage is 0 (equal step scores)
            keep_groups = (advantages.view(len(problems), -1) != 0).any(1)  # (P,)
            keep = keep_groups.repeat_interleave(G)  # (B,)
            width = int((mask * keep[:, None]).sum(1).max())  # the columns padding in every kept row go
            prompt_ids = prompt_ids[keep_groups]
            prompt_mask = prompt_mask[keep_groups]
            completion_ids = completion_ids[keep, :width]
            mask = mask[keep, :width]
            sampler_logprobs = sampler_logprobs[keep, :width]
            advantages = advantages[keep, :width]
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

            # ---- 5. μ policy updates on this batch, accumulating over micro-batches ----------------
            policy.train()
            # the update's metrics, exact
            sums = stepmetrics.MicroBatchSums(batch_tokens, args.num_iterations)
            trainer_logprobs = []  # π_θold's, the trainer's at the update's start, a micro-batch each
            for iteration in range(args.num_iterations):
                for s in slices:
                    logprobs, entropy = grpo.group_logprobs(
                        policy, sequences, s, G, args.temperature, iteration == 0
                    )
                    # μ = 1: π_θold is π_θ itself, so ρ = 1 exactly; β = 0: no reference
                    old = old_logprobs[s] if old_logprobs is not None else logprobs.detach()
                    loss, m = grpo.grpo_loss(
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
                    weight = grpo.micro_batch_weight(args.loss_agg, mask[s], int(batch_tokens), batch_rows)
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
