"""GRPO with an adaptive group size: more completions for the prompts whose first group is all right or all wrong.
A variant of grpo.py: its loop, copied, with phases 1 to 3 changed and 4 to 6 reading the ragged groups; the loss, the
logging and every option of grpo.py are its. Copied from grpo.py unchanged: phase 7 (tests/test_layout.py checks).

A group whose rewards are all equal has every advantage 0: it costs its samples and teaches nothing. DAPO's dynamic
sampling (--dynamic-sampling) drops such groups. Here each prompt first gets --first-samples G0 completions; each
prompt whose G0 rewards are all equal gets G - G0 more (G = --group-size), in the hope that a rare right (or wrong)
answer turns up and gives the group a signal. The groups are then of two sizes, G0 and G, and each is normalised
over its own completions:

    Â_i = (r_i - mean(r_g(i))) / (std(r_g(i)) + eps)          (ragged_group_advantages; 0 for an all-equal group)

A step samples P·G0 + (uniform prompts)·(G - G0) completions, at most P·G: `samples` logs how many (every rank's), to
compare with grpo.py at the same number of samples. A prompt sampled again has G rows where the others have G0: under
--loss-agg seq-mean-token-mean, which weighs every completion alike, it weighs G/G0 times as much in the loss; the
token-sum aggregations weigh its tokens as every other token. Only the verifier's reward (and --rewards format,
repetition) is supported: a reward model's prompts would have to follow the ragged rows too.

Run:
    python grpo_adaptive.py                                  # G0 = 4, G = 8: 4 more for a prompt whose 4 agree
    python grpo_adaptive.py --first-samples 2 --group-size 8
    python grpo_adaptive.py --model tiny --steps 3
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

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
from common import require


@dataclass
class Args(grpo.Args):
    """GRPO with an adaptive group size: G0 completions a prompt, G for a prompt whose G0 rewards are all equal."""

    first_samples: int = 4
    """G0: completions every prompt gets first; a prompt whose G0 rewards are all equal gets --group-size - G0 more"""


def check_args(args: Args) -> None:
    grpo.check_args(args)
    require(
        2 <= args.first_samples < args.group_size,
        f"--first-samples must be at least 2 and below --group-size {args.group_size}, not {args.first_samples}",
    )
    require(
        args.reward_model is None,
        "--reward-model is not supported here (the ragged groups score with the verifier and --rewards); use grpo.py",
    )


def ragged_group_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-4
) -> torch.Tensor:
    """grpo.group_advantages for groups of any size: Â_i = (r_i - mean(r_g)) / (std(r_g) + eps) over the rows of
    i's group g (population std), 0 for a group whose rewards are all equal. rewards (N,), group_index (N,) the
    group of each row, 0..P-1 -> (N,)"""
    groups = int(group_index.max()) + 1
    counts = torch.zeros(groups, device=rewards.device).index_add(0, group_index, torch.ones_like(rewards))
    mean = torch.zeros(groups, device=rewards.device).index_add(0, group_index, rewards) / counts  # (P,)
    centered = rewards - mean[group_index]  # (N,)
    if scale_by_std:
        variance = torch.zeros(groups, device=rewards.device).index_add(0, group_index, centered**2) / counts
        centered = centered / (variance.sqrt()[group_index] + eps)
    highest = torch.full((groups,), -torch.inf, device=rewards.device).scatter_reduce(
        0, group_index, rewards, "amax"
    )
    lowest = torch.full((groups,), torch.inf, device=rewards.device).scatter_reduce(
        0, group_index, rewards, "amin"
    )
    return torch.where((highest == lowest)[group_index], 0.0, centered)


def ragged_group_logprobs(
    model, sequences: tuple, rows: slice, group_index: torch.Tensor, temperature: float, entropy=False
):
    """grpo.group_logprobs for ragged groups: log π of the completions in `rows` (and their entropy), each prompt
    encoded once for its rows, which are consecutive. sequences = (prompt_ids (P, S), prompt_mask (P, S),
    completion_ids (N, T)), group_index (N,) -> (N_rows, T), and (N_rows, T) or None"""
    prompt_ids, prompt_mask, completion_ids = sequences
    prompts, repeats = torch.unique_consecutive(group_index[rows], return_counts=True)
    return common.completion_logprobs(
        model, prompt_ids[prompts], prompt_mask[prompts], completion_ids[rows], repeats, temperature, entropy
    )


class Sampled(NamedTuple):
    """One sampling call's completions and what the rewards say of them."""

    completion_ids: torch.Tensor  # (N, T)
    mask: torch.Tensor  # (N, T), EOS included
    sampler_logprobs: torch.Tensor  # (N, T), as the sampler drew them
    rewards: torch.Tensor  # (N,) what the advantages are made of: the scores and any overlong penalty
    scores: torch.Tensor  # (N,) the weighted --rewards
    scored: tasks.Scored


def sample_and_score(
    policy, tokenizer, problems, prompt_ids, prompt_mask, count, args, reward_fn, generator, device, step
) -> Sampled:
    """`count` completions of each prompt, and their rewards; N = len(problems) · count."""
    completion_ids, sampler_logprobs = common.sample_with_logprobs(
        policy,
        prompt_ids,
        prompt_mask,
        count,
        args.max_new_tokens,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        args.temperature,
        args.top_p,
        generator,
    )
    mask = common.completion_mask(completion_ids, tokenizer.eos_token_id)  # (N, T), EOS included
    texts = tasks.decode_completions(tokenizer, completion_ids, mask)
    answers = [p.answer for p in problems for _ in range(count)]
    scored = tasks.score_completions(texts, answers, args.rewards, reward_fn, device)
    runs.check_rewards(scored.rewards, step)
    if args.reward_weights is None:
        scores = scored.rewards.sum(dim=1)  # (N,) r_i = Σ_k r_ik
    else:  # DeepSeek-R1's weighted rewards, summed as TRL sums them: r_i = Σ_k w_k r_ik
        scores = scored.rewards @ scored.rewards.new_tensor(args.reward_weights)
    rewards = scores
    if args.overlong_buffer > 0:  # DAPO's soft overlong punishment
        rewards = scores + grpo.overlong_penalty(
            mask.sum(1), args.max_new_tokens, args.overlong_buffer, args.overlong_penalty
        )
    return Sampled(completion_ids, mask, sampler_logprobs, rewards, scores, scored)


def padded_to(tensor: torch.Tensor, width: int, value: float = 0) -> torch.Tensor:
    """(N, T) -> (N, width), padded on the right with `value`."""
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=value)


def main(args: Args, reward_fn: Optional[Callable[[str, str], float]] = None) -> dict:
    """Train with GRPO and an adaptive group size; returns the final metrics (also in eval.json). reward_fn(completion,
    answer) -> float is the `correct` reward (default: --verifier's)."""
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
    fsdp.shard(args.run.fsdp, policy, ref_model)  # --fsdp: 1/N of each model's weights
    optimizer, scheduler = common.make_optimizer(
        policy, args.lr, args.weight_decay, args.warmup_steps, args.steps if args.lr_decay else 0
    )
    # each rank its own draws
    generator = torch.Generator(device=device).manual_seed(args.seed + distributed.rank())
    G0 = args.first_samples

    # the run folder, metrics.jsonl, checkpoints
    run = runs.Run(args, "grpo-adaptive", tokenizer, device, resumed)
    # what a checkpoint holds; resumed here
    run.checkpointed(policy, generator, optimizer=optimizer, scheduler=scheduler)
    # a resumed run's data position: P problems a step
    train_stream = itertools.islice(train_stream, (run.first_step - 1) * args.prompts_per_step, None)

    evaluate = functools.partial(
        tasks.evaluate_policy, policy, tokenizer, heldout, args.max_new_tokens, args.seed
    )

    run.begin(evaluate)
    for step in range(run.first_step, args.steps + 1):
        # ---- 1. sample G0 completions per prompt, and G - G0 more for each prompt whose G0 agree --------
        t0 = time.time()
        # P/N on a rank
        problems = distributed.share([next(train_stream) for _ in range(args.prompts_per_step)])
        prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in problems], device)
        P = len(problems)
        policy.eval()
        sample = functools.partial(
            sample_and_score,
            policy,
            tokenizer,
            args=args,
            reward_fn=reward_fn,
            generator=generator,
            device=device,
            step=step,
        )
        first = sample(problems, prompt_ids, prompt_mask, G0)
        first_rewards = first.rewards.view(P, G0)  # (P, G0)
        # (P,): every one of the G0 right, or every one wrong
        uniform = first_rewards.amax(1) == first_rewards.amin(1)
        parts = [first]
        group_index = torch.arange(P, device=device).repeat_interleave(G0)  # (N,) each row's prompt
        if uniform.any():
            extra = [p for p, u in zip(problems, uniform.tolist()) if u]
            more = args.group_size - G0
            parts.append(sample(extra, prompt_ids[uniform], prompt_mask[uniform], more))
            group_index = torch.cat([group_index, uniform.nonzero()[:, 0].repeat_interleave(more)])
        width = max(part.completion_ids.shape[1] for part in parts)
        # each prompt's rows consecutive (the first round's, then its extra), as ragged_group_logprobs reads them
        order = torch.sort(group_index, stable=True).indices
        group_index = group_index[order]
        pad = tokenizer.pad_token_id
        completion_ids = torch.cat([padded_to(part.completion_ids, width, pad) for part in parts])[order]
        mask = torch.cat([padded_to(part.mask, width) for part in parts])[order]
        sampler_logprobs = torch.cat([padded_to(part.sampler_logprobs, width) for part in parts])[order]
        rewards = torch.cat([part.rewards for part in parts])[order]
        scores = torch.cat([part.scores for part in parts])[order]
        time_generate = time.time() - t0

        # ---- 2. the rewards (above, with each part's sampling), and what they say ----------------------
        # the first round's: every prompt's G0, an unbiased draw of the policy; `score` below is every sample's
        stats = metrics.reward_stats(first.rewards, first.scores, first.scored, args.rewards, G0, False)
        stats["samples"] = distributed.all_sum(len(rewards))  # every rank's
        stats["frac_prompts_sampled_again"] = uniform.float().mean().item()
        stats["score"] = scores.mean().item()
        stats.update(
            # each prompt's group, G0 or G rows (consecutive): distinct within a group, as grpo.py's
            metrics.completion_stats(
                completion_ids,
                mask,
                tokenizer.eos_token_id,
                torch.bincount(group_index).tolist(),
                time_generate,
            )
        )
        lengths = mask.sum(1)  # (N,)

        # ---- 3. group-relative advantages over each prompt's own completions, ragged ---------------------
        advantages = ragged_group_advantages(rewards, group_index, args.scale_by_std)  # (N,)
        # the groups still all equal after the extra samples: 0 advantages; --dynamic-sampling drops them
        signal = torch.zeros(P, device=device).index_add(0, group_index, (advantages != 0).float())  # (P,)
        stats["frac_reward_zero_std/after"] = (signal == 0).float().mean().item()
        if args.dynamic_sampling:  # DAPO: drop the groups whose every advantage is 0 (equal rewards)
            keep_groups = signal > 0  # (P,)
            keep = keep_groups[group_index]  # (N,)
            # the columns that are padding in every kept row go
            width = int((mask * keep[:, None]).sum(1).max()) if keep.any() else 0
            # the kept prompts, renumbered 0..P'-1 in order
            renumber = torch.cumsum(keep_groups.long(), 0) - 1
            prompt_ids = prompt_ids[keep_groups]
            prompt_mask = prompt_mask[keep_groups]
            group_index = renumber[group_index[keep]]
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
            # the batch's rows: each kept prompt once, and its completions
            sequences = (prompt_ids, prompt_mask, completion_ids)
            micro = min(args.batch_size or B, B)
            slices = [slice(i, min(i + micro, B)) for i in range(0, B, micro)]
            batch_tokens = distributed.all_sum(mask.sum()).clamp(min=1)  # every rank's (1: every row masked)
            batch_rows = distributed.all_sum(B)
            logprobs_of = functools.partial(
                ragged_group_logprobs,
                sequences=sequences,
                group_index=group_index,
                temperature=args.temperature,
            )
            with torch.no_grad():
                # μ = 1: π_θold is the current π, old = current.detach() below (ρ = 1 exactly); μ > 1: frozen here
                old_logprobs = None
                if args.num_iterations > 1:
                    old_logprobs = torch.cat([logprobs_of(policy, rows=s)[0] for s in slices])
                ref_logprobs = None
                if args.beta != 0.0:
                    with common.reference(policy, ref_model) as ref:
                        ref_logprobs = torch.cat([logprobs_of(ref, rows=s)[0] for s in slices])

            # ---- 5. μ policy updates on this batch, accumulating over micro-batches ----------------
            policy.train()
            # the update's metrics, exact
            sums = stepmetrics.MicroBatchSums(batch_tokens, args.num_iterations)
            trainer_logprobs = []  # π_θold's, the trainer's at the update's start, a micro-batch each
            for iteration in range(args.num_iterations):
                for s in slices:
                    logprobs, entropy = logprobs_of(policy, rows=s, entropy=iteration == 0)
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
                    # kl, clip_ratio: token means over the whole batch; entropy: iteration 0's (None after)
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
        # each rank's mean over an equal share: their mean is the batch's
        stats = distributed.mean_over_ranks(stats)
        run.log(step, stats, ("reward", "samples", "kl", "skipped"))

        # ---- 7. evaluate and checkpoint -----------------------------------------------------------
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(evaluate, tasks.before_and_after)


if __name__ == "__main__":
    runs.cli(main, Args)
