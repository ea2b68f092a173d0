"""GRPO as an asynchronous trainer runs it: each step trains on a batch sampled `--staleness k` steps earlier, and
importance weights correct for the sampler not being the trainer (TIS, MIS). A variant of grpo.py: its loop, copied,
with sampling, scoring and advantages (phases 1-3) moved into `sample_batch` and fed through a queue; the loss and
every option of grpo.py are its. Copied from grpo.py unchanged: phases 1, 2, 4 and 7 (tests/test_layout.py checks).

An RL step draws completions with one computation and differentiates another. The sampler decodes token by token
against a key/value cache (on a CPU in bfloat16 with packed weights, see infra/kernels.py), truncates to a nucleus
when --top-p < 1, and here is the policy of k training steps ago; the trainer runs the full sequence through the
current weights. Their log-probs of the same tokens differ, so a loss that assumes the tokens came from the trainer's
π takes a gradient that is not the on-policy one. `mismatch/*` logs the gap (common.mismatch_metrics);
`--is-correction` weighs it (importance_weights).

With w = π_train(y_t | ·) / π_sampler(y_t | ·) at a token the sampler drew, E_sampler[w · f] = E_train[f]:
weighting each token's policy-gradient term by w makes the sampler's tokens stand in for the trainer's.
An unbounded w has an unbounded variance, so it is capped:
- truncated (TIS: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training";
  the truncation of IMPALA's V-trace, Espeholt et al. 2018, arXiv:1802.01561): min(w, C). Biased toward
  the sampler where w > C, variance at most C².
- masked (MIS: Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
  Training-Inference Mismatch"): w where 1/C <= w <= C, else 0, so a token (or sequence) the two
  disagree on by more than a factor C leaves the loss, and the rest keep their w.
Per sequence, w_i = Π_t w_it = π_train(o_i) / π_sampler(o_i), the sequence's own importance ratio, computed in log
space (exp Σ_t log w_it, capped before it can overflow) and given to every token of o_i, so a sequence is kept or
dropped whole: TRL's `sequence_truncate` and `sequence_mask`, verl's sequence level. Only the product makes
E_sampler[w_i · f(o_i)] = E_train[f(o_i)]; the geometric mean exp(mean_t log w_it) (GSPO's ratio) does not, stays
near 1 on a drifted sequence (32 tokens each 0.033 nats off: product 2.87, geometric mean 1.034) and is not built here.
The weight is a constant (no gradient): it rescales each token's ∇ log π, it is not optimised, and it multiplies the
policy-gradient term only, not the KL (grpo.grpo_loss's is_weights; AReaL's decoupled PPO, Fu et al. 2025,
arXiv:2505.24298).

Why a file of its own: the queue reshapes grpo.py's loop (a closure producing batches), and in one process the
sampler and the trainer are the same model, so the correction only has work to do with the simulated staleness (or
the sampler's own numerics, which `mismatch/*` measures). `--resume` with --staleness is refused
(the queue is not in a checkpoint).

Run:
    python grpo_async.py --staleness 2                                   # stale, uncorrected
    python grpo_async.py --staleness 2 --is-correction token-truncate    # TIS, C = 2
    python grpo_async.py --model tiny --steps 3 --staleness 1 --is-correction sequence-mask --is-cap 3

Shapes: B sequences, T completion tokens; log-probs float32, mask 1 on the completion's tokens.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, get_args

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

Correction = Literal["none", "token-truncate", "token-mask", "sequence-truncate", "sequence-mask"]
CORRECTIONS = get_args(Correction)


@dataclass
class Args(grpo.Args):
    """GRPO on batches sampled --staleness steps earlier, with importance weights for the sampler's gap."""

    is_correction: Correction = "none"
    """weight each token's policy-gradient term by w = π_train / π_sampler, truncated (min(w, C)) or
    masked (0 outside [1/C, C]), per token or per sequence (the product of its tokens' w)"""
    is_cap: float = 2.0
    """C, the cap of --is-correction"""
    staleness: int = 0
    """train each step on the batch sampled this many training steps (× μ optimizer steps) earlier (a
    queue, as asynchronous trainers do); 0 = on-policy"""

    @property
    def resumable(self) -> bool:
        """Whether a checkpoint holds the whole run (infra/runs offers --resume only then): not the queue of stale
        batches."""
        return self.staleness == 0


def check_args(args: Args) -> None:
    grpo.check_args(args)
    require(args.is_cap > 1, f"--is-cap must be > 1 (weights are kept within [1/C, C]), not {args.is_cap}")
    require(args.staleness >= 0, f"--staleness must be >= 0, not {args.staleness}")
    require(
        not (args.staleness and args.run.resume),
        "--staleness with --resume: the queue of sampled batches is not in a checkpoint; resume with --staleness 0",
    )


def importance_weights(
    trainer_logprobs: torch.Tensor,  # (B, T) log π_train
    sampler_logprobs: torch.Tensor,  # (B, T) log π_sampler
    mask: torch.Tensor,  # (B, T)
    correction: str,
    cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight of each token's policy-gradient term (see the module docstring) and where the cap acted:
    (B, T) each -> weights (B, T), constant, and cut (B, T) bool: the tokens truncated to C, or dropped.

      none                 1
      token-truncate       min(w_t, C)                                  TIS
      token-mask           w_t · 1[1/C <= w_t <= C]                     MIS, per token
      sequence-truncate    min(w_i, C),  w_i = exp(Σ_t log w_it)        for every token of o_i
      sequence-mask        w_i · 1[1/C <= w_i <= C]                     MIS, per sequence
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown correction {correction!r}; one of {CORRECTIONS}")
    # (B, T) log w, a constant: no gradient flows through a weight
    log_w = (trainer_logprobs - sampler_logprobs).detach().float()
    if correction == "none":
        return torch.ones_like(log_w), torch.zeros_like(log_w, dtype=torch.bool)
    level, action = correction.split("-")
    if level == "sequence":  # log Π_t w_it over the sequence's own tokens, padding left out
        log_w = masked_sum(log_w, mask, dim=1)[:, None].expand_as(log_w)
    # e^800 is inf in float32: min(inf, C) is C and a masked inf is 0, so neither reaches the loss
    weights = torch.exp(log_w)
    if action == "truncate":
        cut = log_w > math.log(cap)
        return weights.clamp(max=cap), cut
    cut = log_w.abs() > math.log(cap)  # w outside [1/C, C]
    return weights.masked_fill(cut, 0.0), cut


class StaleQueue:
    """Batches sampled ahead of the trainer: `next()` returns the batch sampled `staleness` training steps
    before the current one (× μ optimizer steps in GRPO), as an asynchronous trainer's queue would. The first
    call samples staleness + 1 batches from the starting policy, each later call one more, and the last
    `staleness` calls none, so a run samples exactly `total` batches, as many as on-policy. Batch t (from 0)
    is drawn by sample(t), by the policy after max(0, t - staleness) training steps."""

    def __init__(self, sample: Callable[[int], Any], staleness: int, total: int):
        self.sample = sample
        self.staleness = staleness
        self.total = total
        self.drawn = 0
        self.queue = collections.deque()

    def next(self):
        while len(self.queue) <= self.staleness and self.drawn < self.total:
            self.queue.append(self.sample(self.drawn))
            self.drawn += 1
        return self.queue.popleft()


@dataclass
class Batch:
    """One sampled and scored batch, as the update reads it: the groups dynamic sampling kept (B rows, maybe 0)."""

    prompt_ids: torch.Tensor  # (P, S) left-padded
    prompt_mask: torch.Tensor  # (P, S)
    completion_ids: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T)
    sampler_logprobs: torch.Tensor  # (B, T) as the sampler drew the tokens
    advantages: torch.Tensor  # (B,)
    stats: dict  # the rewards and completions of every sampled group, and the sampling's time
    sampled_tokens: int  # completion tokens sampled, kept or not


def main(args: Args, reward_fn: Optional[Callable[[str, str], float]] = None) -> dict:
    """Train with GRPO on stale batches, corrected or not; returns the final metrics (also in eval.json), as grpo.py
    does; reward_fn as grpo.main's."""
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

    # the run folder, metrics.jsonl, checkpoints
    run = runs.Run(args, "grpo-async", tokenizer, device, resumed)
    # what a checkpoint holds; resumed here
    run.checkpointed(policy, generator, optimizer=optimizer, scheduler=scheduler)
    # a resumed run's data position: P problems a step
    train_stream = itertools.islice(train_stream, (run.first_step - 1) * args.prompts_per_step, None)

    evaluate = functools.partial(
        tasks.evaluate_policy, policy, tokenizer, heldout, args.max_new_tokens, args.seed
    )

    def sample_batch(index: int) -> Batch:
        step = run.first_step + index  # the step that trains on this batch
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
            learned = grpo.learned_scores(reward_model, prompt_ids, prompt_mask, completion_ids, mask, G)
        scored = tasks.score_completions(texts, answers, args.rewards, reward_fn, device, learned)
        runs.check_rewards(scored.rewards, step)
        if args.reward_weights is None:
            scores = scored.rewards.sum(1)  # (B,) r_i = Σ_k r_ik
        else:  # DeepSeek-R1's weighted rewards, summed as TRL sums them: r_i = Σ_k w_k r_ik
            scores = scored.rewards @ scored.rewards.new_tensor(args.reward_weights)
        lengths = mask.sum(1)  # (B,)
        rewards = scores
        if args.overlong_buffer > 0:  # DAPO's soft overlong punishment
            rewards = scores + grpo.overlong_penalty(
                lengths, args.max_new_tokens, args.overlong_buffer, args.overlong_penalty
            )

        # ---- 3. group-relative advantages -------------------------------------------------------
        advantages = grpo.group_advantages(rewards, G, args.scale_by_std)  # (B,)
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
        return Batch(
            prompt_ids,
            prompt_mask,
            completion_ids,
            mask,
            sampler_logprobs,
            advantages,
            stats,
            int(lengths.sum()),
        )

    run.begin(evaluate)
    # phases 1-3 above: with --staleness k, step t trains on the batch sampled k steps before it
    batches = StaleQueue(sample_batch, args.staleness, args.steps - run.first_step + 1)
    for step in range(run.first_step, args.steps + 1):
        t0 = time.time()
        batch = batches.next()
        prompt_ids = batch.prompt_ids
        prompt_mask = batch.prompt_mask
        completion_ids = batch.completion_ids
        mask = batch.mask
        advantages = batch.advantages
        stats = dict(batch.stats)  # its sampling's, some steps ago
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
                    # the entropy is logged at the first iteration: the sampling policy's
                    logprobs, entropy = grpo.group_logprobs(
                        policy, sequences, s, G, args.temperature, iteration == 0
                    )
                    # μ = 1: π_θold is π_θ itself, so ρ = 1 exactly; β = 0: no reference
                    old = old_logprobs[s] if old_logprobs is not None else logprobs.detach()
                    # (B_s, T) constant: all 1 without --is-correction
                    is_weights, cut = importance_weights(
                        old, batch.sampler_logprobs[s], mask[s], args.is_correction, args.is_cap
                    )
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
                        is_weights,
                    )
                    if args.is_correction != "none":
                        m["is/weight_mean"] = masked_mean(is_weights, mask[s]).item()
                        m["is/frac_cut"] = masked_mean(cut.float(), mask[s]).item()
                    run.check_finite(loss, step)
                    weight = grpo.micro_batch_weight(args.loss_agg, mask[s], int(batch_tokens), batch_rows)
                    (loss * weight).backward()
                    # kl, clip_ratio: token means over the whole batch; the entropy logged: iteration 0's, the sampler's
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
            stats.update(common.mismatch_metrics(torch.cat(trainer_logprobs), batch.sampler_logprobs, mask))
            stats["grad_norm"] = grad_norm.item()
        else:
            stats["skipped"] = 1
        # time/train, time/step and the tokens a second sampled and trained
        stats.update(metrics.speeds(t0, time_train, batch.sampled_tokens, mask.sum() * args.num_iterations))
        # each rank's mean over an equal share: their mean is the batch's
        stats = distributed.mean_over_ranks(stats)
        run.log(step, stats, ("reward", "completion_length", "kl", "skipped"))

        # ---- 7. evaluate and checkpoint -----------------------------------------------------------
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(evaluate, tasks.before_and_after)


if __name__ == "__main__":
    runs.cli(main, Args)
