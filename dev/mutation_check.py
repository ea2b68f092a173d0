"""Mutation check: does the test suite catch the bugs it claims to guard against?

Each mutation below is one plausible bug a reader could make in the loss, advantage or loop code
(a flipped sign, a dropped clip branch, the sample std for the population std, the temperature
left out when log-probs are recomputed, ...). The conventions the algorithm files list as "pinned
by a test" are exactly these bugs. For each mutation the script copies the repository (its .py
and .sh files, tests/ and pytest.ini; no runs/ or caches) into a temporary folder, makes the one textual
replacement there, and runs the narrowest pytest target that should catch it:

    KILLED    the target failed: the tests caught the bug
    SURVIVED  the target passed: the tests do not see this bug (a gap, listed at the end)
    STALE     the original snippet is not in the file exactly once: the code has moved on and the
              mutation must be updated (never silently skipped)
    ERROR     the run neither passed nor failed (time-out, or pytest could not run)

The working tree is never touched: the script takes one snapshot of it and works on copies. Before
any mutation, the targets are run on the unmutated snapshot (one pytest per test file); if a test
fails there, the check reports it and stops (exit status 1), since a kill would mean nothing.
Otherwise the exit status is 0 whatever the kill rate: this is a report.

Run (from the repository root; standard library and pytest only):
    python dev/mutation_check.py                  # all mutations, one at a time (~40 min on 2 cores)
    python dev/mutation_check.py --list           # the mutations and whether each snippet is found
    python dev/mutation_check.py --only ppo.py    # those whose "file: description" contains the text
    python dev/mutation_check.py --only GAE --only KTO --jobs 2

Tests marked `embedded` (the real SmolLM2) are never run here: they check that a step runs, not a formula.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]


class Mutation(NamedTuple):
    file: str  # path relative to the repository root
    original: str  # must occur exactly once in the file
    mutated: str
    description: str
    target: str  # "tests/test_x.py" or "tests/test_x.py -k EXPR": the narrowest tests that should fail


GRPO, PPO, DPO, RM = (
    "tests/test_grpo.py",
    "tests/test_ppo.py",
    "tests/test_dpo.py",
    "tests/test_reward_model.py",
)
COMMON, TASKS, VARIANTS = "tests/test_common.py", "tests/test_tasks.py", "tests/test_variants.py"
REL, SFT, BANDIT = "tests/test_reliability.py", "tests/test_sft.py", "tests/test_bandit.py"
MEMORY, PRM, DIST = "tests/test_memory_plan.py", "tests/test_prm.py", "tests/test_distributed.py"
ASYNC = "tests/test_grpo_async.py"
DECODING = "tests/test_decoding.py"
GRPO_PRM = "tests/test_grpo_prm.py"
RFT, JUDGE = "tests/test_rft.py", "tests/test_judge.py"

MUTATIONS = [
    # ---- grpo.py: advantages, KL, the clipped loss, aggregation, the loop ---------------------------------
    Mutation(
        "grpo.py",
        "grouped.std(dim=1, unbiased=False, keepdim=True)",
        "grouped.std(dim=1, keepdim=True)",
        "sample std (G-1) instead of population std in Â",
        f"{GRPO} -k group_advantages",
    ),
    Mutation(
        "grpo.py",
        "centered = grouped - grouped.mean(dim=1, keepdim=True)",
        "centered = grouped.mean(dim=1, keepdim=True) - grouped",
        "advantage sign flipped (mean - r)",
        f"{GRPO} -k group_advantages",
    ),
    Mutation(
        "grpo.py",
        "all_equal = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)",
        "all_equal = grouped.std(dim=1, keepdim=True) == 0",
        "all-equal group detected by std == 0 (float32 std of equal rewards is not 0)",
        f"{GRPO} -k all_equal",
    ),
    Mutation(
        "grpo.py",
        "return torch.exp(log_ratio) - log_ratio - 1.0",
        "return torch.exp(-log_ratio) + log_ratio - 1.0",
        "k3 with the ratio inverted (π/π_ref instead of π_ref/π)",
        f"{GRPO} -k kl_estimator",
    ),
    Mutation(
        "grpo.py",
        "per_token = torch.max(pg_loss1, pg_loss2)",
        "per_token = torch.min(pg_loss1, pg_loss2)",
        "clipped surrogate: min instead of max of the negated terms (optimistic bound)",
        f"{GRPO} -k 'clip_branches or ragged_mask'",
    ),
    Mutation(
        "grpo.py",
        "torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)",
        "torch.clamp(ratio, max=1.0 + eps_high)",
        "lower clip branch dropped (ρ never clipped at 1 - ε_low)",
        f"{GRPO} -k clip_branches",
    ),
    Mutation(
        "grpo.py",
        "per_token = per_token + beta * kl",
        "per_token = per_token",
        "KL term dropped from the loss",
        f"{GRPO} -k beta_adds",
    ),
    Mutation(
        "grpo.py",
        "loss = masked_sum(per_token, mask) / (mask.shape[0] * max_completion_length)",
        "loss = masked_sum(per_token, mask) / (mask.shape[0] * mask.shape[1])",
        "Dr. GRPO normaliser uses the padded width, not max_completion_length",
        f"{GRPO} -k ragged_mask",
    ),
    Mutation(
        "grpo.py",
        "return micro_mask.sum().item() / batch_tokens",
        "return micro_mask.shape[0] / batch_rows",
        "token-mean micro-batch weighted by its share of rows, not of tokens",
        f"{GRPO} -k weighted_micro_batches",
    ),
    Mutation(
        "grpo.py",
        "slices = [slice(i, min(i + micro, B)) for i in range(0, B, micro)]",
        "slices = [slice(i, i + micro) for i in range(0, B - B % micro, micro)]",
        "a micro-batch size that does not divide the batch: the ragged last rows left out of the update",
        f"{GRPO} -k ragged_one",
    ),
    Mutation(
        "grpo.py",
        "args.batch_size is None or args.batch_size >= 1,",
        "args.batch_size is None or args.batch_size >= 1 and 6 * 8 % args.batch_size == 0,",
        "--batch-size refused when it does not divide prompts-per-step × group-size (48 rows at 32)",
        f"{GRPO} -k ragged_one",
    ),
    Mutation(
        "grpo.py",
        "(loss * weight).backward()",
        "loss.backward()",
        "micro-batch loss not weighted before accumulation",
        f"{GRPO} -k '8_equals_8_of_1 and sum-norm'",
    ),
    Mutation(
        "grpo.py",
        "old_logprobs[s] if old_logprobs is not None else logprobs.detach()\n",
        "old_logprobs[s] if old_logprobs is not None else logprobs\n",
        "μ = 1: old log-probs not detached (ratio ≡ 1, no policy gradient)",
        f"{GRPO} -k dense_reward",
    ),
    Mutation(
        "grpo.py",
        (
            "        rewards = scores + overlong_penalty(\n"
            "            lengths, args.max_new_tokens, args.overlong_buffer, args.overlong_penalty\n"
            "        )\n"
        ),
        "        rewards = scores\n",
        "overlong penalty never added to the reward in the loop",
        f"{GRPO} -k overlong",
    ),
    Mutation(
        "grpo.py",
        "completion_ids[rows], repeats, temperature, entropy",
        "completion_ids[rows], repeats, 1.0, entropy",
        "log-probs recomputed at temperature 1, not the sampling temperature",
        f"{GRPO} -k sampling_temperature",
    ),
    Mutation(
        "grpo.py",
        "                    reward_model, input_ids, torch.cat([prompt_mask.repeat_interleave(G, 0), mask], 1)\n",
        (
            "                    reward_model,\n"
            "                    input_ids,\n"
            "                    torch.cat([prompt_mask.repeat_interleave(G, 0), torch.ones_like(mask)], 1),\n"
        ),
        "learned reward read through the padding after EOS",
        f"{GRPO} -k learned_reward",
    ),
    # ---- grpo.py and task/tasks.py: GSPO, CISPO, weighted rewards, the R1 format ---------------------------------
    Mutation(
        "grpo.py",
        "        log_ratio = masked_mean(log_ratio, mask, dim=1)[:, None].expand_as(log_ratio)",
        "        log_ratio = log_ratio",
        "GSPO: ratio clipped per token, not per sequence",
        f"{GRPO} -k gspo_clips",
    ),
    Mutation(
        "grpo.py",
        "masked_mean(log_ratio, mask, dim=1)[:, None]",
        "log_ratio.mean(dim=1)[:, None]",
        "GSPO: log-ratio averaged over the padded width, not the completion's tokens",
        f"{GRPO} -k gspo_clips",
    ),
    Mutation(
        "grpo.py",
        "masked_mean(log_ratio, mask, dim=1)[:, None]",
        "masked_mean(log_ratio, mask, dim=1).detach()[:, None]",
        "GSPO: sequence ratio detached (no gradient through the mean)",
        f"{GRPO} -k 'gspo_clips or exactly_one'",
    ),
    Mutation(
        "grpo.py",
        "torch.clamp(ratio, max=1.0 + eps_high).detach() * adv * logprobs",
        "torch.clamp(ratio, max=1.0 + eps_high) * adv * logprobs",
        "CISPO: truncated weight not detached",
        f"{GRPO} -k 'cispo_weights or exactly_one'",
    ),
    Mutation(
        "grpo.py",
        "torch.clamp(ratio, max=1.0 + eps_high).detach()",
        "torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high).detach()",
        "CISPO: weight also bounded below at 1 - ε_low (the paper sets no lower bound)",
        f"{GRPO} -k cispo_weights",
    ),
    Mutation(
        "grpo.py",
        "per_token = -torch.clamp(ratio, max=1.0 + eps_high)",
        "per_token = torch.clamp(ratio, max=1.0 + eps_high)",
        "CISPO: sign flipped (descends the objective)",
        f"{GRPO} -k cispo_weights",
    ),
    Mutation(
        "grpo.py",
        '    if loss_type == "cispo":  # instead',
        "    if False:  # instead",
        "CISPO: PPO's clipped surrogate kept (clipped tokens lose their gradient)",
        f"{GRPO} -k clipped_token",
    ),
    Mutation(
        "grpo.py",
        (
            "kl_kind=args.kl_estimator,\n"
            "                        importance_level=args.importance_level,\n"
            "                        loss_type=args.loss_type,\n"
        ),
        "kl_kind=args.kl_estimator,\n",
        "GSPO/CISPO: options never reach the loss in the loop",
        f"{GRPO} -k run_together",
    ),
    Mutation(
        "grpo.py",
        "return (per_reward * weights).sum(dim=1)",
        "return per_reward.sum(dim=1)",
        "weighted rewards: weights ignored",
        f"{GRPO} -k weighted_rewards",
    ),
    Mutation(
        "grpo.py",
        "            per_reward, per_reward.new_tensor(args.reward_weights or [1.0] * len(args.rewards))\n",
        (
            "            (per_reward - per_reward.mean(0)) / (per_reward.std(0, unbiased=False) + 1e-4),\n"
            "            per_reward.new_tensor(args.reward_weights or [1.0] * len(args.rewards)),\n"
        ),
        "weighted rewards: each reward normalised on its own before the sum",
        f"{GRPO} -k weighted_rewards_in_the_loop",
    ),
    Mutation(
        "grpo.py",
        "scored.rewards[:, k].mean().item() for k, name in enumerate(names)",
        "scored.rewards[:, -1 - k].mean().item() for k, name in enumerate(names)",
        "weighted rewards: rewards/<name>/mean logged under another reward's name",
        f"{GRPO} -k weighted_rewards_in_the_loop",
    ),
    Mutation(
        "grpo.py",
        "    train_stream, heldout = tasks.with_prompt_style(args.prompt_style, train_stream, heldout)",
        "    pass",
        "R1 prompt: --prompt-style r1 never applied in the loop",
        f"{GRPO} -k run_together",
    ),
    Mutation(
        "task/rewards.py",
        "        repeated = repeated + (gram in seen)\n",
        "        repeated = repeated + (gram in seen and gram != grams[-1])\n",
        "repetition penalty: the last n-gram never counts as a repeat",
        f"{TASKS} -k repetition",
    ),
    Mutation(
        "task/rewards.py",
        "    return -repeated / len(grams)",
        "    return repeated / len(grams)",
        "repetition penalty paid as a bonus",
        f"{TASKS} -k repetition",
    ),
    Mutation(
        "task/rewards.py",
        "        seen.add(gram)\n",
        "        seen = {gram}\n",
        "repetition penalty: only a repeat of the n-gram just before counts",
        f"{TASKS} -k repetition",
    ),
    Mutation(
        "task/rewards.py",
        "_R1_FORM.fullmatch(completion.strip())",
        "_R1_FORM.search(completion.strip())",
        "format reward: text outside the tags still pays",
        f"{TASKS} -k format_reward",
    ),
    Mutation(
        "task/rewards.py",
        '_NO_TAG = r"(?:(?!</?(?:think|answer)>).)+"',
        '_NO_TAG = r".+"',
        "format reward: a tag inside the reasoning or the answer still pays",
        f"{TASKS} -k format_reward",
    ),
    Mutation(
        "task/tasks.py",
        "return map(r1, train_stream), [r1(p) for p in heldout]",
        "return map(r1, train_stream), heldout",
        "R1 prompt: held-out questions not asked for the format",
        f"{TASKS} -k r1_prompt",
    ),
    # ---- grpo_async.py and the sampler's log-probs: the mismatch, the corrections, staleness ---------------------
    Mutation(
        "infra/runs.py",
        'if saved and same and getattr(args, "resumable", True):',
        "if saved and same:",
        "out of memory in a stale grpo_async.py run offers the --resume it refuses",
        f"{ASYNC} -k never_offered",
    ),
    Mutation(
        "grpo_async.py",
        "        return self.staleness == 0",
        "        return True",
        "a stale grpo_async.py run, interrupted, offers the --resume it refuses",
        f"{ASYNC} -k never_offered",
    ),
    Mutation(
        "grpo_async.py",
        "return weights.clamp(max=cap), cut",
        "return weights, cut",
        "truncated IS: the cap never applied",
        f"{ASYNC} -k truncation",
    ),
    Mutation(
        "grpo_async.py",
        "cut = log_w.abs() > math.log(cap)  # w outside [1/C, C]",
        "cut = log_w > math.log(cap)  # w outside [1/C, C]",
        "masked IS: only the upper bound (w < 1/C kept)",
        f"{ASYNC} -k masking",
    ),
    Mutation(
        "grpo_async.py",
        "return weights.masked_fill(cut, 0.0), cut",
        "return torch.ones_like(weights).masked_fill(cut, 0.0), cut",
        "masked IS: the tokens kept weighted 1, not w",
        f"{ASYNC} -k masking",
    ),
    Mutation(
        "grpo_async.py",
        "log_w = masked_sum(log_w, mask, dim=1)[:, None].expand_as(log_w)",
        "log_w = log_w.sum(dim=1, keepdim=True).expand_as(log_w)",
        "sequence weight: padding counted in the product",
        f"{ASYNC} -k product",
    ),
    Mutation(
        "grpo_async.py",
        "log_w = masked_sum(log_w, mask, dim=1)[:, None].expand_as(log_w)",
        "log_w = masked_mean(log_w, mask, dim=1)[:, None].expand_as(log_w)",
        "sequence weight: the geometric mean of the token ratios, not their product (TRL's and verl's)",
        f"{ASYNC} -k 'product or drifted'",
    ),
    Mutation(
        "grpo_async.py",
        "log_w = masked_sum(log_w, mask, dim=1)[:, None].expand_as(log_w)",
        "log_w = torch.log(masked_sum(torch.exp(log_w), mask, dim=1))[:, None].expand_as(log_w)",
        "sequence weight: the sum of the token ratios, not their product",
        f"{ASYNC} -k 'product or drifted'",
    ),
    Mutation(
        "grpo_async.py",
        "return weights.masked_fill(cut, 0.0), cut",
        "return weights * ~cut, cut",
        "masked IS: the cut multiplied out, inf · 0 = NaN on a long drifted sequence",
        f"{ASYNC} -k overflows",
    ),
    Mutation(
        "grpo_async.py",
        "    log_w = (trainer_logprobs - sampler_logprobs).detach().float()\n    if correction",
        "    log_w = (trainer_logprobs - sampler_logprobs).float()\n    if correction",
        "importance weight not detached (its own gradient joins the loss's)",
        f"{ASYNC} -k constant_of_the_gradient",
    ),
    Mutation(
        "grpo_async.py",
        "    log_w = (trainer_logprobs - sampler_logprobs).detach().float()\n    if correction",
        "    log_w = (sampler_logprobs - trainer_logprobs).detach().float()\n    if correction",
        "importance weight inverted (π_sampler / π_train)",
        f"{ASYNC} -k truncation",
    ),
    Mutation(
        "common.py",
        "k3 = torch.exp(log_w) - 1.0 - log_w",
        "k3 = -log_w",
        "mismatch KL by k1, not k3",
        f"{COMMON} -k mismatch_metrics",
    ),
    Mutation(
        "common.py",
        '"mismatch/k1": masked_mean(-log_w, mask).item()',
        '"mismatch/k1": masked_mean(log_w, mask).item()',
        "mismatch k1 with its sign flipped (KL(train || sampler)'s k1)",
        f"{COMMON} -k 'mismatch_metrics or nucleus'",
    ),
    Mutation(
        "common.py",
        "largest = log_w.abs().masked_fill(mask == 0, 0.0).max()",
        "largest = log_w.abs().max()",
        "largest log ratio read from padding too",
        f"{COMMON} -k mismatch_metrics",
    ),
    Mutation(
        "grpo_async.py",
        "while len(self.queue) <= self.staleness and self.drawn < self.total:",
        "while len(self.queue) < self.staleness and self.drawn < self.total:",
        "stale queue one batch short (staleness k - 1, and none at 0)",
        f"{ASYNC} -k queue",
    ),
    Mutation(
        "grpo_async.py",
        "while len(self.queue) <= self.staleness and self.drawn < self.total:",
        "while len(self.queue) <= self.staleness:",
        "stale queue samples past the run's batches (more sampling than at staleness 0)",
        f"{ASYNC} -k queue",
    ),
    Mutation(
        "common.py",
        "logprob = torch.log(probs.gather(-1, token)) - torch.log(cdf[:, -1:])",
        "logprob = torch.log(probs.gather(-1, token))",
        "sampler log-prob: the nucleus's renormalisation left out",
        f"{COMMON} -k 'distribution_it_drew or nucleus'",
    ),
    Mutation(
        "common.py",
        "logprobs.append(torch.where(finished, 0.0, logprob))",
        "logprobs.append(logprob)",
        "sampler log-probs after EOS not zeroed (padding's draws kept)",
        f"{COMMON} -k nucleus",
    ),
    Mutation(
        "grpo.py",
        "per_token = per_token * is_weights",
        "per_token = per_token",
        "--is-correction: the weights never reach the loss",
        f"{GRPO} -k importance_weights_scale",
    ),
    Mutation(
        "grpo.py",
        "per_token = per_token + beta * kl",
        "per_token = (per_token + beta * kl) * (1.0 if is_weights is None else is_weights)",
        "--is-correction: the KL term weighted too",
        f"{GRPO} -k importance_weights_scale",
    ),
    Mutation(
        "grpo_async.py",
        "old, batch.sampler_logprobs[s], mask[s], args.is_correction, args.is_cap",
        "old, batch.sampler_logprobs[s], mask[s], args.is_correction, 2.0",
        "--is-cap ignored in the loop",
        f"{ASYNC} -k sampler_against",
    ),
    Mutation(
        "grpo.py",
        "common.mismatch_metrics(torch.cat(trainer_logprobs), sampler_logprobs, mask)",
        "common.mismatch_metrics(sampler_logprobs, torch.cat(trainer_logprobs), mask)",
        "mismatch measured the wrong way round (KL(train || sampler))",
        f"{GRPO} -k sampler_against",
    ),
    Mutation(
        "grpo_async.py",
        "common.mismatch_metrics(torch.cat(trainer_logprobs), batch.sampler_logprobs, mask)",
        "common.mismatch_metrics(batch.sampler_logprobs, torch.cat(trainer_logprobs), mask)",
        "stale batches: mismatch measured the wrong way round (KL(train || sampler))",
        f"{ASYNC} -k sampler_against",
    ),
    Mutation(
        "grpo_async.py",
        "StaleQueue(sample_batch, args.staleness,",
        "StaleQueue(sample_batch, 0,",
        "--staleness ignored: every batch on-policy",
        f"{ASYNC} -k stale_batches",
    ),
    Mutation(
        "ppo.py",
        "**common.mismatch_metrics(old_logprobs, sampler_logprobs, mask)",
        "**common.mismatch_metrics(ref_logprobs, sampler_logprobs, mask)",
        "PPO's mismatch measured against the reference, not π_old",
        f"{PPO} -k run_folder_and_metrics",
    ),
    Mutation(
        "variants.py",
        "**common.mismatch_metrics(logprobs, sampler_logprobs, mask)",
        "**common.mismatch_metrics(ref_logprobs, sampler_logprobs, mask)",
        "online variants' mismatch measured against the reference, not the trainer",
        f"{VARIANTS} -k sampler_against",
    ),
    # ---- ppo.py: per-token rewards, GAE, both losses, the KL controller, the loop -------------------------
    Mutation(
        "grpo_tools.py",
        "            transcript.policy += [0] * len(environment)",
        "            transcript.policy += [1] * len(environment)",
        "tool use: the environment's result tokens trained on as if the model wrote them, and counted",
        "tests/test_grpo_tools.py -k context_not_policy",
    ),
    Mutation(
        "grpo_tools.py",
        "[reward_fn(t.last_turn, a) for t, a in zip(transcripts, answers)]",
        "[reward_fn(tokenizer.decode(t.tokens), a) for t, a in zip(transcripts, answers)]",
        "tool use: the reward reads the whole transcript, the environment's number included",
        "tests/test_grpo_tools.py -k context_not_policy",
    ),
    Mutation(
        "grpo_tools.py",
        "        contexts = [prompts[i] + transcripts[i].tokens for i in active]",
        "        contexts = [prompts[i] for i in active]",
        "tool use: each turn sampled from the prompt alone, not the transcript so far",
        "tests/test_grpo_tools.py -k agree",
    ),
    Mutation(
        "grpo_tools.py",
        "            transcript.logprobs += [0.0] * len(environment)",
        "            transcript.logprobs += [-1.0] * len(environment)",
        "tool use: the environment's tokens given sampler log-probs",
        "tests/test_grpo_tools.py -k agree",
    ),
    Mutation(
        "task/tools.py",
        "            term = term * int(number)",
        "            total = total + sign * term\n            term = int(number)",
        "calculator: × read as +",
        "tests/test_grpo_tools.py -k calculator",
    ),
    Mutation(
        "task/tools.py",
        '        if match is None:\n            return "error"',
        "        if match is None:\n            break",
        "calculator: text it cannot read is skipped, not an error",
        "tests/test_grpo_tools.py -k calculator",
    ),
    Mutation(
        "distill.py",
        "        completion_ids = common.sample_completions(\n            student,",
        "        completion_ids = common.sample_completions(\n            teacher,",
        "distillation on the teacher's samples (off-policy), not the student's",
        "tests/test_distill.py -k student_samples",
    ),
    Mutation(
        "distill.py",
        "advantages = -sampled_reverse_kl(student_logprobs, teacher_logprobs).detach()",
        "advantages = -sampled_reverse_kl(teacher_logprobs, student_logprobs).detach()",
        "distillation's per-token KL in the wrong direction: log π_T - log π_S as the divergence",
        "tests/test_distill.py -k expected_gradient",
    ),
    Mutation(
        "distill.py",
        "advantages = -sampled_reverse_kl(student_logprobs, teacher_logprobs).detach()",
        "advantages = -sampled_reverse_kl(student_logprobs, teacher_logprobs)",
        "distillation's advantage not detached: the gradient flows through it too",
        "tests/test_distill.py -k expected_gradient",
    ),
    Mutation(
        "distill.py",
        "    return (student.exp() * (student - teacher)).sum(-1)",
        "    return (teacher.exp() * (student - teacher)).sum(-1)",
        "reverse KL weighted by the teacher's probabilities",
        "tests/test_distill.py -k by_hand",
    ),
    Mutation(
        "distill.py",
        "torch.stack([teacher + math.log(beta), student + math.log(1 - beta)])",
        "torch.stack([teacher + math.log(1 - beta), student + math.log(beta)])",
        "generalized JSD with the mixture's weights swapped",
        "tests/test_distill.py -k by_hand",
    ),
    Mutation(
        "distill.py",
        "    return torch.log_softmax(logits.float() / temperature, dim=-1)",
        "    return torch.log_softmax(logits.float(), dim=-1)",
        "distillation's full-vocabulary log-probs without the temperature",
        "tests/test_distill.py -k vocabulary_logprobs",
    ),
    Mutation(
        "distill.py",
        "        return forward_kl(student, teacher)\n    if beta == 1.0:\n        return reverse_kl(student, teacher)",
        "        return reverse_kl(student, teacher)\n    if beta == 1.0:\n        return forward_kl(student, teacher)",
        "generalized JSD's endpoints the wrong way round: β = 0 the reverse KL",
        "tests/test_distill.py -k by_hand",
    ),
    Mutation(
        "grpo_adaptive.py",
        "group_index = torch.cat([group_index, uniform.nonzero()[:, 0].repeat_interleave(more)])",
        "group_index = torch.cat([group_index, torch.arange(len(extra), device=device).repeat_interleave(more)])",
        "adaptive group size: the extra completions counted to the first prompts, not the ones sampled again",
        "tests/test_grpo_adaptive.py -k own_prompt",
    ),
    Mutation(
        "grpo_adaptive.py",
        "completion_ids = torch.cat([padded_to(part.completion_ids, width, pad) for part in parts])[order]",
        "completion_ids = torch.cat([padded_to(part.completion_ids, width, pad) for part in parts])",
        "adaptive group size: the completions left in sampling order while their groups are sorted",
        "tests/test_grpo_adaptive.py -k own_prompt",
    ),
    Mutation(
        "grpo_adaptive.py",
        "group_index = renumber[group_index[keep]]",
        "group_index = group_index[keep]",
        "adaptive group size: the kept groups' rows still point at the dropped prompts' numbers",
        "tests/test_grpo_adaptive.py -k own_prompt",
    ),
    Mutation(
        "grpo_adaptive.py",
        "centered = centered / (variance.sqrt()[group_index] + eps)",
        "centered = centered / (variance.sqrt().mean() + eps)",
        "adaptive group size: one std for every group, not each group's own",
        "tests/test_grpo_adaptive.py -k by_hand",
    ),
    Mutation(
        "grpo_adaptive.py",
        "return torch.where((highest == lowest)[group_index], 0.0, centered)",
        "return centered",
        "adaptive group size: an all-equal group's rounding left as an advantage",
        "tests/test_grpo_adaptive.py -k by_hand",
    ),
    Mutation(
        "grpo_adaptive.py",
        "uniform = first_rewards.amax(1) == first_rewards.amin(1)",
        "uniform = first_rewards.amax(1) != first_rewards.amin(1)",
        "adaptive group size: the extra samples go to the groups that already have a signal",
        "tests/test_grpo_adaptive.py -k sampled_again",
    ),
    Mutation(
        "ppo_prm.py",
        "            rewards = rewards + dense * mask\n",
        "",
        "PPO with a PRM: the step rewards never reach GAE",
        "tests/test_ppo_prm.py -k tokens_that_end",
    ),
    Mutation(
        "ppo_prm.py",
        "            penalised = -args.missing_eos_penalty * (~finished).float()",
        "            penalised = scores - args.missing_eos_penalty * (~finished).float()",
        "PPO with a PRM: the outcome it only logs is trained on too",
        "tests/test_ppo_prm.py -k tokens_that_end",
    ),
    Mutation(
        "ppo_prm.py",
        "step_scores = torch.sigmoid(stepwise.score_steps(prm, tokenizer, prompts, texts)[0])",
        "step_scores = stepwise.score_steps(prm, tokenizer, prompts, texts)[0]",
        "PPO with a PRM: the step reward is the raw logit, not σ(z)",
        "tests/test_ppo_prm.py -k tokens_that_end",
    ),
    Mutation(
        "ppo.py",
        "if penalty is None else pg_loss1 + penalty * kl, mask)",
        "if penalty is None else torch.max(pg_loss1, pg_loss2) + penalty * kl, mask)",
        "PPO-Penalty still clips the surrogate",
        f"{PPO} -k penalty_loss_by_hand",
    ),
    Mutation(
        "ppo.py",
        "kl = ratio - 1.0 - log_ratio  # (B, T)",
        "kl = 1.0 / ratio - 1.0 + log_ratio  # (B, T)",
        "PPO-Penalty's KL in the other direction, KL(π_θ ‖ π_old)",
        f"{PPO} -k penalty_loss_by_hand",
    ),
    Mutation(
        "ppo.py",
        "return beta / 2 if kl < target / 1.5 else beta * 2 if kl > target * 1.5 else beta",
        "return beta * 2 if kl < target / 1.5 else beta / 2 if kl > target * 1.5 else beta",
        "PPO-Penalty's β adapts the wrong way: raised when the KL is small",
        f"{PPO} -k penalty_coefficient",
    ),
    Mutation(
        "ppo.py",
        'penalty = resumed["penalty"] if resumed else 1.0',
        "penalty = 1.0",
        "PPO-Penalty's β restarts at 1 on --resume",
        f"{PPO} -k penalty_run_adapts",
    ),
    Mutation(
        "ppo.py",
        'penalty = adapted_penalty(penalty, averaged["kl_old_after"], args.kl_old_target)',
        'penalty = adapted_penalty(penalty, averaged["kl_old"], args.kl_old_target)',
        "PPO-Penalty adapts β on the minibatches' KL before each step, not the updated policy's (PPO §4's d)",
        f"{PPO} -k updated_policy",
    ),
    Mutation(
        "ppo_prm.py",
        'penalty = ppo.adapted_penalty(penalty, averaged["kl_old_after"], args.kl_old_target)',
        'penalty = ppo.adapted_penalty(penalty, averaged["kl_old"], args.kl_old_target)',
        "PPO with a PRM: PPO-Penalty adapts β on the minibatches' KL before each step",
        "tests/test_ppo_prm.py -k penalty",
    ),
    Mutation(
        "infra/models.py",
        "                torch.nn.init.zeros_(model.score.weight)\n",
        "                pass\n",
        "PPO's new critic head left random: V is noise at the start, not 0",
        f"{PPO} -k critic_head",
    ),
    Mutation(
        "ppo.py",
        "                if step > args.critic_warmup_steps:\n",
        "                if step >= args.critic_warmup_steps:\n",
        "PPO's critic warm-up ends a step early: the policy trains in its last step",
        f"{PPO} -k critic_warmup",
    ),
    Mutation(
        "ppo.py",
        "(pg_loss2 > pg_loss1) & (penalty is None)",
        "(pg_loss2 > pg_loss1)",
        "PPO-Penalty reports a clip ratio for a surrogate it does not clip",
        f"{PPO} -k penalty_loss_by_hand",
    ),
    Mutation(
        "scripts/baseline_variance.py",
        "return rloo_advantages(rewards, group_size)",
        "return group_advantages(rewards, group_size, scale_by_std=False)",
        "baseline variance: a leave-one-out mean that includes the sample itself (biased by (G-1)/G)",
        "tests/test_baseline_variance.py -k leave_one_out",
    ),
    Mutation(
        "scripts/baseline_variance.py",
        "    return rewards - baseline",
        "    return rewards",
        "baseline variance: the critic's constant baseline dropped (REINFORCE in its place)",
        "tests/test_baseline_variance.py -k constant",
    ),
    Mutation(
        "scripts/baseline_variance.py",
        "    return one_hot - pi",
        "    return one_hot",
        "baseline variance: ∇log π = e_a, the softmax score without its −π",
        "tests/test_baseline_variance.py -k 'by_hand or scores'",
    ),
    Mutation(
        "scripts/baseline_variance.py",
        "((pi * r * squared_norms).sum() / (pi * squared_norms).sum())",
        "(pi * r).sum()",
        "baseline variance: the variance-optimal constant b* taken to be V = E_π[r]",
        "tests/test_baseline_variance.py -k optimal_constant",
    ),
    Mutation(
        "scripts/dpo_then_ppo.sh",
        'python ppo.py --model "$DPO" --reward-model "$RM"',
        'python ppo.py --model "$START" --reward-model "$RM"',
        "DPO then PPO: the last mile starts from the starting model, not the DPO policy",
        f"{PPO} -k dpo_then_ppo",
    ),
    Mutation(
        "scripts/iterative_dpo.sh",
        '    POLICY=$(last "$OUT/round-$round")model\n',
        "",
        "iterative DPO: every round trains the starting model again (one round, repeated)",
        "tests/test_dpo.py -k iterative",
    ),
    Mutation(
        "scripts/prm_reward.py",
        "    return samples(args) // args.ppo_batch_size\n",
        "    return args.steps\n",
        "PRM as a reward: PPO runs GRPO's steps, not GRPO's number of samples",
        "tests/test_compare.py -k prm_reward",
    ),
    Mutation(
        "scripts/prm_reward.py",
        '    "ppo-outcome": ("ppo.py", False),',
        '    "ppo-outcome": ("ppo.py", True),',
        "PRM as a reward: the outcome row of PPO is handed the PRM too",
        "tests/test_compare.py -k prm_reward",
    ),
    Mutation(
        "scripts/sycophancy.py",
        '"agrees_with_suggestion": sum(tasks.verify(t, w) for t, w in zip(nudged, wrong)) / n,',
        '"agrees_with_suggestion": sum(tasks.verify(t, w) for t, w in zip(plain, wrong)) / n,',
        "sycophancy: agreement read from the answers to the plain question",
        "tests/test_sycophancy.py -k final_number",
    ),
    Mutation(
        "scripts/dpo_then_ppo.sh",
        'python dpo.py --model "$START" --output-dir "$OUT/dpo" "${DPO_EXTRA[@]}" "$@"',
        'python dpo.py --model "$START" --output-dir "$OUT/dpo" "$@"',
        "DPO then PPO: DPO_OPTIONS never reach the DPO stage",
        f"{PPO} -k dpo_then_ppo",
    ),
    Mutation(
        "scripts/sycophancy.py",
        "            margins += (wrong_scores - right_scores).float().tolist()",
        "            margins += (right_scores - wrong_scores).float().tolist()",
        "sycophancy probe: the reward model's margin taken right minus wrong",
        "tests/test_sycophancy.py -k likes_agreement",
    ),
    Mutation(
        "scripts/sycophancy.py",
        '        "suggested": [suggested(p, w) for p, w in zip(problems, wrong)],',
        '        "suggested": [p.prompt for p in problems],',
        "sycophancy probe: the 'suggested' scores read after the plain question",
        "tests/test_sycophancy.py -k likes_agreement",
    ),
    Mutation(
        "scripts/sycophancy.py",
        "    offsets = [d for d in (-10, -1, 1, 10) if right + d >= 0]",
        "    offsets = [d for d in (-10, -1, 0, 1, 10) if right + d >= 0]",
        "sycophancy: a 'wrong' suggestion that can be the right answer",
        "tests/test_sycophancy.py -k plausible",
    ),
    Mutation(
        "scripts/pass_at_k_curve.py",
        "sum(tasks.pass_at_k(n, c, k) for c in correct)",
        "sum(float(c > 0) for c in correct)",
        "pass@k as the share of problems with any right sample among n, whatever k",
        "tests/test_pass_at_k_curve.py -k by_hand",
    ),
    Mutation(
        "ppo.py",
        "rewards = -kl_coef * kl * mask",
        "rewards = kl_coef * kl * mask",
        "KL enters the reward as a bonus, not a penalty",
        f"{PPO} -k kl_penalized",
    ),
    Mutation(
        "ppo.py",
        "last = (mask.sum(1) - 1).clamp(min=0).long()",
        "last = torch.full_like(mask[:, 0], mask.shape[1] - 1).long()",
        "score put on the last column (padding), not the last real token",
        f"{PPO} -k kl_penalized",
    ),
    Mutation(
        "ppo.py",
        "advantage = delta + gamma * lam * next_advantage",
        "advantage = delta + lam * next_advantage",
        "GAE: γ left out of the γλ decay",
        f"{PPO} -k gae",
    ),
    Mutation(
        "ppo.py",
        "next_value = values[:, t] * m",
        "next_value = values[:, t]",
        "GAE: V after the last token read from padding instead of 0",
        f"{PPO} -k gae",
    ),
    Mutation(
        "ppo.py",
        "pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)",
        "pg_loss2 = -advantages * ratio",
        "policy loss: clip dropped (plain ratio surrogate)",
        f"{PPO} -k policy_loss_both_clip",
    ),
    Mutation(
        "ppo.py",
        "loss = 0.5 * masked_mean(torch.max(vf_loss1, vf_loss2), mask)",
        "loss = 0.5 * masked_mean(torch.min(vf_loss1, vf_loss2), mask)",
        "clipped value loss: min instead of max",
        f"{PPO} -k value_loss",
    ),
    Mutation(
        "ppo.py",
        "clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)",
        "clipped = torch.clamp(values, -clip_range, clip_range)",
        "value clipped around 0 instead of around V_old",
        f"{PPO} -k 'value_loss or value_clip'",
    ),
    Mutation(
        "ppo.py",
        "                kl_coef, kl_per_completion, args.target_kl, args.kl_horizon, args.batch_size\n",
        "                kl_coef, -kl_per_completion, args.target_kl, args.kl_horizon, args.batch_size\n",
        "adaptive KL controller fed -KL",
        f"{PPO} -k adaptive_kl",
    ),
    Mutation(
        "ppo.py",
        "penalised = scores - args.missing_eos_penalty * (~finished).float()",
        "penalised = scores + args.missing_eos_penalty * (~finished).float()",
        "missing-EOS penalty added instead of subtracted",
        f"{PPO} -k missing_eos",
    ),
    Mutation(
        "ppo.py",
        "finished = (completion_ids == eos).any(1)",
        "finished = mask.sum(1) < args.max_new_tokens",
        "a completion ending in EOS on the last allowed token counted as truncated",
        f"{PPO} -k missing_eos",
    ),
    Mutation(
        "ppo.py",
        "ones[rows],\n                    args.temperature,\n                    with_entropy=True,",
        "ones[rows],\n                    1.0,\n                    with_entropy=True,",
        "log-probs recomputed at temperature 1 in the PPO epochs",
        f"{PPO} -k sampling_temperature",
    ),
    Mutation(
        "ppo.py",
        "inner.score(hidden[:, S - 1 : S + T - 1])",
        "inner.score(hidden[:, S : S + T])",
        "V(s_t) read after y_t instead of before it (off by one)",
        f"{PPO} -k value_of_the_first_token",
    ),
    Mutation(
        "ppo.py",
        "rewards = masked_whiten(rewards, mask, shift_mean=False, all_sum=distributed.all_sum) * mask",
        "rewards = masked_whiten(rewards, mask, all_sum=distributed.all_sum) * mask",
        "--whiten-rewards also removes the rewards' mean",
        f"{PPO} -k whiten_rewards",
    ),
    Mutation(
        "ppo.py",
        "policy_loss = pg_loss - args.entropy_coef * entropy_mean",
        "policy_loss = pg_loss + args.entropy_coef * entropy_mean",
        "entropy bonus with the wrong sign (a penalty)",
        f"{PPO} -k entropy_bonus",
    ),
    # ---- dpo.py ------------------------------------------------------------------------------------------
    Mutation(
        "dpo.py",
        "logits = chosen_logratios - rejected_logratios",
        "logits = rejected_logratios - chosen_logratios",
        "chosen and rejected swapped in h",
        f"{DPO} -k 'dpo_loss or beta_scales or pushes_chosen'",
    ),
    Mutation(
        "dpo.py",
        (
            "    losses = -(1 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(\n"
            "        -beta * logits\n"
        ),
        (
            "    losses = -(1 - label_smoothing) * beta *"
            " F.logsigmoid(logits) - label_smoothing * beta * F.logsigmoid(\n"
            "        -logits\n"
        ),
        "β outside the sigmoid",
        f"{DPO} -k 'dpo_loss or beta_scales'",
    ),
    Mutation(
        "dpo.py",
        "    losses = -(1 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(\n",
        "    losses = -(1 - label_smoothing) * F.logsigmoid(beta * logits) + label_smoothing * F.logsigmoid(\n",
        "label-smoothing (cDPO) term with the wrong sign",
        f"{DPO} -k label_smoothing",
    ),
    Mutation(
        "dpo.py",
        "return logps[:, 0], logps[:, 1], lengths.view(len(pairs), 2), tokens",
        "return logps[:, 1], logps[:, 0], lengths.view(len(pairs), 2), tokens",
        "concatenated forward returns rejected as chosen",
        f"{DPO} -k concatenated_forward",
    ),
    Mutation(
        "dpo.py",
        "with torch.no_grad(), common.reference(policy, ref_model) as ref:",
        "with torch.no_grad(), common.reference(policy, policy) as ref:",
        "DPO --no-precompute-ref-logprobs: the reference is the current policy, not the starting model",
        f"{DPO} -k precomputed_reference_equals_on_the_fly",
    ),
    # ---- dpo_online.py -----------------------------------------------------------------------------------
    Mutation(
        "dpo_online.py",
        "chosen, rejected = (2 * i, 2 * i + 1) if first > second else (2 * i + 1, 2 * i)",
        "chosen, rejected = 2 * i, 2 * i + 1",
        "online DPO: chosen by the sample's position, not by the verifier",
        "tests/test_dpo_online.py -k online",
    ),
    Mutation(
        "dpo_online.py",
        "        if first == second:",
        "        if False:",
        "online DPO: pairs with equal labels kept, not dropped",
        "tests/test_dpo_online.py -k online",
    ),
    Mutation(
        "dpo_online.py",
        "with torch.no_grad(), common.reference(policy, ref_model) as ref:",
        "with torch.no_grad(), common.reference(policy, policy) as ref:",
        "online DPO: the reference is the current policy, not the starting model",
        "tests/test_dpo_online.py -k online_loss_equals_offline",
    ),
    Mutation(
        "dpo_online.py",
        "    for _ in range((run.first_step - 1) * args.batch_size):",
        "    for _ in range(0):",
        "online DPO: a resumed run draws the problems of the steps before again",
        "tests/test_dpo_online.py -k online_resume",
    ),
    # ---- rft.py -------------------------------------------------------------------------------------------
    Mutation(
        "rft.py",
        "if reward != 1.0 or not done",
        "if reward <= 0.0 or not done",
        "RFT keeps a partly right completion (any positive reward), not only the verified",
        f"{RFT} -k filter",
    ),
    Mutation(
        "rft.py",
        "if reward != 1.0 or not done or",
        "if reward != 1.0 or",
        "RFT keeps completions cut off at max_new_tokens",
        f"{RFT} -k filter",
    ),
    Mutation(
        "rft.py",
        "or (prompt, completion) in seen or",
        "or",
        "RFT keeps duplicates of one completion",
        f"{RFT} -k filter",
    ),
    Mutation(
        "rft.py",
        "count == max_per_prompt:",
        "count > max_per_prompt:",
        "RFT's cap per prompt off by one",
        f"{RFT} -k filter",
    ),
    Mutation(
        "rft.py",
        "return -masked_sum(logprobs, mask) / mask.sum().clamp(min=1)",
        "return -(masked_sum(logprobs, mask, dim=1) / mask.sum(1)).mean()",
        "RFT loss as a mean of per-sequence means, not a token mean",
        f"{RFT} -k token_mean",
    ),
    Mutation(
        "rft.py",
        "return -masked_sum(logprobs, mask) / mask.sum().clamp(min=1)",
        "return masked_sum(logprobs, mask) / mask.sum().clamp(min=1)",
        "RFT loss sign flipped: the kept completions made less likely",
        f"{RFT} -k raises",
    ),
    Mutation(
        "rft.py",
        'tasks.tokenize_completions(tokenizer, [r["completion"] for r in rows], device)',
        'tasks.tokenize_completions(tokenizer, [r["completion"] for r in rows], device, None, [False] * len(rows))',
        "RFT never learns to end: no EOS target",
        f"{RFT} -k only_completion",
    ),
    Mutation(
        "rft.py",
        'all_kept = resumed["kept"] if resumed else []',
        "all_kept = []",
        "RFT resumed mid-round forgets the round's kept set",
        f"{RFT} -k resume",
    ),
    Mutation(
        "rft.py",
        "    for _ in range(rounds_begun * args.prompts_per_round):",
        "    for _ in range(0):",
        "RFT resumed draws the problems of earlier rounds again",
        f"{RFT} -k resume",
    ),
    Mutation(
        "rft.py",
        "if (step - 1) % args.steps_per_round == 0:",
        "if step % args.steps_per_round == 0:",
        "RFT samples a round's set after its first step, not before",
        f"{RFT} -k raises",
    ),
    Mutation(
        "scripts/r1_recipe.sh",
        'python rft.py --model "$GRPO"',
        'python rft.py --model "$SFT"',
        "R1 recipe: rejection sampling from the cold-start model, not the RL policy",
        f"{RFT} -k r1_recipe",
    ),
    Mutation(
        "scripts/r1_recipe.sh",
        "--steps 8 --steps-per-round 8",
        "--steps 16 --steps-per-round 8",
        "R1 recipe: two rounds of rejection sampling, not one",
        f"{RFT} -k r1_recipe",
    ),
    # ---- sft.py -------------------------------------------------------------------------------------------
    Mutation(
        "sft.py",
        "return -masked_sum(logprobs, mask) / mask.sum().clamp(min=1)",
        "return -(masked_sum(logprobs, mask, dim=1) / mask.sum(1)).mean()",
        "SFT loss as a mean of per-sequence means, not a token mean over the batch",
        f"{SFT} -k token_mean",
    ),
    Mutation(
        "sft.py",
        "logits_to_keep=T + 1,\n        ).logits",
        "logits_to_keep=T,\n        ).logits",
        "SFT logits not shifted: each token predicts itself",
        f"{SFT} -k only_completion",
    ),
    Mutation(
        "sft.py",
        'tokenizer, [r["completion"] for r in rows], device, max_completion_tokens\n',
        'tokenizer, [r["completion"] for r in rows], device, max_completion_tokens, [False] * len(rows)\n',
        "SFT never learns to end: no EOS target",
        f"{SFT} -k only_completion",
    ),
    Mutation(
        "sft.py",
        (
            "        # prompt + completion tokens seen so far, as TRL counts them\n"
            "        num_tokens += distributed.all_sum(tokens)\n"
        ),
        (
            "        num_tokens = distributed.all_sum(tokens)  # prompt"
            " + completion tokens seen so far, as TRL counts them\n"
        ),
        "num_tokens not cumulative",
        f"{SFT} -k fixed_mapping",
    ),
    # ---- reward_model.py ---------------------------------------------------------------------------------
    Mutation(
        "reward_model.py",
        "diff = chosen_scores - rejected_scores",
        "diff = rejected_scores - chosen_scores",
        "Bradley-Terry with chosen and rejected swapped",
        f"{RM} -k bradley_terry",
    ),
    Mutation(
        "reward_model.py",
        "diff = diff - margin",
        "diff = diff + margin",
        "margin added instead of subtracted",
        f"{RM} -k margin",
    ),
    # ---- common.py: log-probs, masks, whitening, positions -------------------------------------------------
    Mutation(
        "common.py",
        "return (positions <= first_eos[:, None]).long()",
        "return (positions < first_eos[:, None]).long()",
        "completion_mask excludes the EOS token",
        f"{COMMON} -k completion_mask",
    ),
    Mutation(
        "common.py",
        "return (attention_mask.cumsum(-1) - 1).clamp(min=0)",
        "return torch.arange(attention_mask.shape[-1], device=attention_mask.device).expand_as(attention_mask)",
        "position ids from arange instead of the attention mask",
        f"{COMMON} -k padding_amount",
    ),
    Mutation(
        "common.py",
        "log_p = torch.log_softmax(logits.float() / temperature, dim=-1)",
        "log_p = torch.log_softmax(logits.float(), dim=-1)",
        "log-probs ignore the temperature (plain path)",
        f"{COMMON} -k 'one_token_at_a_time or entropy_by_hand'",
    ),
    Mutation(
        "common.py",
        (
            "    # sequences a piece: about LOGPROB_PIECE logits, at least one\n"
            "    rows = max(1, LOGPROB_PIECE // max(1, T * V))\n"
        ),
        "    rows = B  # sequences a piece: about LOGPROB_PIECE logits, at least one\n",
        "plain log-probs computed whole: float32 (B, T, V) temporaries",
        f"{COMMON} -k full_vocabulary",
    ),
    Mutation(
        "common.py",
        "            labels[start : start + rows],",
        "            labels[:rows],",
        "plain log-probs: every piece scored against the first piece's labels",
        f"{COMMON} -k full_vocabulary",
    ),
    Mutation(
        "common.py",
        "return logprobs, -(log_p.exp() * log_p.clamp(min=-1e4)).sum(-1)",
        "return logprobs, -(log_p.exp() * log_p).sum(-1)",
        "entropy NaN where a logit is -inf (plain path)",
        f"{COMMON} -k minus_infinity",
    ),
    Mutation(
        "infra/kernels.py",
        "z = z_buffer[: t.stop - t.start].copy_(logits[b, t]).div_(temperature)",
        "z = z_buffer[: t.stop - t.start].copy_(logits[b, t])",
        "kernel log-probs ignore the temperature",
        "tests/test_kernels.py -k token_logprobs",
    ),
    Mutation(
        "infra/kernels.py",
        "logprobs[b, t] = z.gather(-1, labels[b, t, None]).squeeze(-1) - lse[b, t]",
        "logprobs[b, t] = z.gather(-1, labels[b, t, None]).squeeze(-1)",
        "kernel returns logits, not log-probs",
        f"{COMMON} -k gather_logprobs",
    ),
    Mutation(
        "infra/kernels.py",
        "grad[b, t] = dz.div_(ctx.temperature)",
        "grad[b, t] = dz",
        "kernel log-prob gradient without the temperature's 1/τ",
        "tests/test_kernels.py -k token_logprobs",
    ),
    Mutation(
        "infra/kernels.py",
        "weight = torch.add(log_p, entropy[b, t, None]",
        "weight = torch.sub(log_p, entropy[b, t, None]",
        "kernel entropy gradient -p (log p - H) instead of -p (log p + H)",
        "tests/test_kernels.py -k token_logprobs",
    ),
    Mutation(
        "infra/kernels.py",
        "dz.scatter_add_(-1, labels[b, t, None], g[b, t, None])",
        "pass",
        "kernel log-prob gradient without the label's +1",
        "tests/test_kernels.py -k token_logprobs",
    ),
    Mutation(
        "infra/kernels.py",
        "grad[:, T:] = 0  # positions past the labels predict nothing",
        "pass",
        "kernel: positions past the labels get uninitialised gradient",
        f"{COMMON} -k past_the_labels",
    ),
    Mutation(
        "common.py",
        "position_ids=positions[:, S - 1 :],",
        "position_ids=positions[:, S - 1 :] + 1,",
        "shared-prompt forward: completion positions off by one",
        f"{COMMON} -k 'shared_prompt or one_token_prompts'",
    ),
    Mutation(
        "common.py",
        "return masked_sum(x, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).clamp(min=1)",
        "return masked_sum(x, mask, dim) / (mask.numel() if dim is None else mask.shape[dim])",
        "masked_mean divides by the padded size",
        f"{COMMON} -k masked_mean",
    ),
    Mutation(
        "common.py",
        "var = masked_mean((x - mean) ** 2, mask, all_sum=all_sum)",
        "var = masked_mean((x - mean) ** 2, mask, all_sum=all_sum) * mask.sum() / (mask.sum() - 1)",
        "masked_whiten with the sample variance (N-1)",
        f"{PPO} -k masked_whiten",
    ),
    Mutation(
        "common.py",
        "last = attention_mask.shape[1] - 1 - attention_mask.flip(1).argmax(1)",
        "last = attention_mask.sum(1) - 1",
        "reward read at index (number of real tokens - 1): wrong with left padding",
        f"{RM} -k 'score_does_not_depend or appended_eos'",
    ),
    Mutation(
        "common.py",
        "        with policy.disable_adapter():\n            yield policy",
        "        yield policy",
        "LoRA reference = the adapted policy itself (KL always 0)",
        "tests/test_lora.py -k reference_is",
    ),
    Mutation(
        "common.py",
        'modules_to_save=["score"] if hasattr(model, "score") else None,',
        "modules_to_save=None,",
        "LoRA reward model / critic with a frozen random score head",
        "tests/test_lora.py -k only_adapters",
    ),
    # ---- task/tasks.py and task/preferences.py: the verifier, the data --------------------------------------------
    Mutation(
        "task/tasks.py",
        "data = Path(path).read_bytes().removeprefix(codecs.BOM_UTF8)",
        "data = Path(path).read_bytes()",
        "a data file's UTF-8 BOM kept (its first row no longer parses)",
        f"{TASKS} -k not_utf8",
    ),
    Mutation(
        "task/tasks.py",
        'line_no = data[: e.start].count(b"\\n") + 1',
        'line_no = data[: e.start].count(b"\\n")',
        "a byte that is not UTF-8 named one line early",
        f"{TASKS} -k not_utf8",
    ),
    Mutation(
        "task/tasks.py",
        '    return float(matches[-1].replace(",", "")) if matches else None\n',
        '    return float(matches[0].replace(",", "")) if matches else None\n',
        "verifier reads the first number, not the last",
        f"{TASKS} -k verifier",
    ),
    Mutation(
        "task/tasks.py",
        ".input_ids + [tokenizer.eos_token_id] * done\n",
        ".input_ids + [tokenizer.eos_token_id]\n",
        "truncated samples get an EOS appended",
        f"{TASKS} -k truncated",
    ),
    Mutation(
        "task/preferences.py",
        '"chosen": c["completion"],\n                "rejected": r["completion"],',
        '"chosen": r["completion"],\n                "rejected": c["completion"],',
        "preference pairs with chosen and rejected swapped",
        f"{TASKS} -k pair_samples",
    ),
    Mutation(
        "task/preferences.py",
        "return common.masked_sum(logprobs, mask, dim=1), mask.sum(1).float()",
        "return common.masked_mean(logprobs, mask, dim=1), mask.sum(1).float()",
        "sequence log-prob is the mean of token log-probs, not the sum",
        f"{DPO} -k concatenated_forward",
    ),
    # ---- variants.py: IPO, KTO, SimPO, ORPO, RLOO, ReMax ----------------------------------------------------------
    Mutation(
        "variants.py",
        "losses = (h - 1.0 / (2.0 * tau)) ** 2",
        "losses = (h - 1.0 / tau) ** 2",
        "IPO target 1/τ instead of 1/(2τ)",
        f"{VARIANTS} -k ipo_loss",
    ),
    Mutation(
        "variants.py",
        "        shifted = texts[2:] + texts[:2]\n        shifted_finished = finished[2:] + finished[:2]\n",
        "        shifted = texts\n        shifted_finished = finished\n",
        "KTO z0 from matched pairs, not mismatched ones",
        f"{VARIANTS} -k kto_reference_point_pairs",
    ),
    Mutation(
        "variants.py",
        "undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r)))",
        "undesirable_weight * (1 - torch.sigmoid(beta * (r - z0)))",
        "KTO undesirable term with the desirable sign",
        f"{VARIANTS} -k kto_loss",
    ),
    Mutation(
        "variants.py",
        "losses = -F.logsigmoid(chosen_rewards - rejected_rewards - gamma)",
        "losses = -F.logsigmoid(chosen_rewards - rejected_rewards + gamma)",
        "SimPO margin γ added instead of subtracted",
        f"{VARIANTS} -k simpo_loss",
    ),
    Mutation(
        "variants.py",
        (
            "log_odds = (chosen_mean - torch.log(-torch.expm1(chosen_mean))) - (\n"
            "        rejected_mean - torch.log(-torch.expm1(rejected_mean))\n    )"
        ),
        (
            "log_odds = (policy_chosen_logps - torch.log(-torch.expm1(policy_chosen_logps))) - (\n"
            "        policy_rejected_logps - torch.log(-torch.expm1(policy_rejected_logps))\n    )"
        ),
        "ORPO odds from summed log-probs, not the mean",
        f"{VARIANTS} -k orpo_loss",
    ),
    Mutation(
        "variants.py",
        "baseline = (grouped.sum(1, keepdim=True) - grouped) / (group_size - 1)",
        "baseline = grouped.mean(1, keepdim=True)",
        "RLOO baseline is the plain group mean, not leave-one-out",
        f"{VARIANTS} -k rloo_leave",
    ),
    Mutation(
        "variants.py",
        "advantages = remax_advantages(rewards, greedy_scores)",
        "advantages = rewards",
        "ReMax greedy baseline dropped in the loop",
        f"{VARIANTS} -k baseline_cancels",
    ),
    Mutation(
        "variants.py",
        "rewards = scores - beta * kl",
        "rewards = scores + beta * kl",
        "RLOO/ReMax KL added to the reward as a bonus",
        f"{VARIANTS} -k kl_is_subtracted",
    ),
    Mutation(
        "variants.py",
        "loss = -(advantages * masked_sum(logprobs, mask, dim=1)).mean()",
        "loss = (advantages * masked_sum(logprobs, mask, dim=1)).mean()",
        "REINFORCE loss with the wrong sign (descends the reward)",
        f"{VARIANTS} -k rloo_raises",
    ),
    Mutation(
        "variants.py",
        "    return masked_whiten(returns, mask, all_sum=distributed.all_sum) * mask",
        "    return torch.cat([masked_whiten(r, m) for r, m in zip(returns.split(2), mask.split(2))]) * mask",
        "REINFORCE++ advantages whitened per prompt, not over the whole batch",
        f"{VARIANTS} -k 'reinforce_pp_whitens or reinforce_pp_baseline_subtracts'",
    ),
    Mutation(
        "variants.py",
        "rewards = -beta * (logprobs - ref_logprobs) * mask",
        "rewards = beta * (logprobs - ref_logprobs) * mask",
        "REINFORCE++ KL added to the token rewards as a bonus",
        f"{VARIANTS} -k 'reinforce_pp_whitens or reinforce_pp_baseline_subtracts'",
    ),
    Mutation(
        "variants.py",
        "masked_whiten(returns, mask, all_sum=distributed.all_sum) * mask",
        "masked_whiten(returns, torch.ones_like(mask), all_sum=distributed.all_sum) * mask",
        "REINFORCE++ padding counted in the whitening",
        f"{VARIANTS} -k 'reinforce_pp_whitens or reinforce_pp_baseline_subtracts'",
    ),
    Mutation(
        "variants.py",
        "rewards = -beta * (logprobs - ref_logprobs) * mask",
        "rewards = -beta * (logprobs - ref_logprobs)",
        "REINFORCE++ KL of the padding in the reward to go",
        f"{VARIANTS} -k 'reinforce_pp_whitens or reinforce_pp_baseline_subtracts'",
    ),
    Mutation(
        "variants.py",
        "scores = (grouped - grouped.mean(1, keepdim=True)).reshape(-1)",
        "scores = grouped.reshape(-1)",
        "REINFORCE++-baseline without the prompt's mean score",
        f"{VARIANTS} -k reinforce_pp_baseline_subtracts",
    ),
    Mutation(
        "variants.py",
        (
            "                    scores,\n"
            "                    logprobs.detach(),\n"
            "                    ref_logprobs,\n"
            "                    mask,\n"
            "                    reward_beta,\n"
            '                    k if args.algo == "reinforce_pp_baseline" else None,\n'
        ),
        "                    scores, logprobs.detach(), ref_logprobs, mask, reward_beta, None\n",
        "REINFORCE++-baseline run as plain REINFORCE++ in the loop",
        f"{VARIANTS} -k token_mean",
    ),
    Mutation(
        "variants.py",
        "scores,\n                    logprobs.detach(),\n                    ref_logprobs,\n                    mask,",
        "scores,\n                    ref_logprobs,\n                    logprobs.detach(),\n                    mask,",
        "REINFORCE++ log π and log π_ref swapped in the loop",
        f"{VARIANTS} -k token_mean",
    ),
    Mutation(
        "variants.py",
        (
            "        # (B, T) k2, padding left out\n"
            "        loss = loss + beta * masked_mean(0.5 * (logprobs - ref_logprobs) ** 2, mask)\n"
        ),
        "        loss = loss + beta * masked_mean(logprobs - ref_logprobs, mask)  # (B, T) k2, padding left out\n",
        "REINFORCE++ KL loss with k1 instead of k2",
        f"{VARIANTS} -k reinforce_pp_loss_with_the_kl_in_the_loss",
    ),
    Mutation(
        "variants.py",
        'reward_beta = beta if kl_placement == "reward" else 0.0',
        "reward_beta = beta",
        "REINFORCE++ KL also put in the reward when --kl-placement loss",
        f"{VARIANTS} -k in_the_loop_gets",
    ),
    Mutation(
        "variants.py",
        (
            "        # (B, T) k2, padding left out\n"
            "        loss = loss + beta * masked_mean(0.5 * (logprobs - ref_logprobs) ** 2, mask)\n"
        ),
        "        loss = loss  # (B, T) k2, padding left out\n",
        "REINFORCE++ KL left out of the loss",
        f"{VARIANTS} -k 'reinforce_pp_loss_with_the_kl_in_the_loss or in_the_loop_gets'",
    ),
    Mutation(
        "variants.py",
        'kl_placement = args.kl_placement or ("loss" if args.algo == "reinforce_pp_baseline" else "reward")',
        'kl_placement = args.kl_placement or "reward"',
        "REINFORCE++-baseline defaults to the KL in the reward",
        f"{VARIANTS} -k in_the_loop_gets",
    ),
    Mutation(
        "variants.py",
        "loss = -masked_mean(advantages * logprobs, mask)",
        "loss = -masked_sum(advantages * logprobs, mask, dim=1).mean()",
        "REINFORCE++ loss a mean of sequence sums, not the token mean",
        f"{VARIANTS} -k token_mean",
    ),
    Mutation(
        "variants.py",
        "loss = -masked_mean(advantages * logprobs, mask)",
        "loss = masked_mean(advantages * logprobs, mask)",
        "REINFORCE++ loss with the wrong sign (descends the reward)",
        f"{VARIANTS} -k reinforce_pp_raises",
    ),
    # ---- precision, resume and the NaN guard -------------------------------------------------------------------
    Mutation(
        "common.py",
        "return max(0.0, (decay_steps - step) / max(1, decay_steps - warmup_steps))",
        "return max(0.0, (decay_steps - step - 1) / max(1, decay_steps - warmup_steps))",
        "lr decay one update early (0 at the last step)",
        f"{COMMON} -k lr_warms",
    ),
    Mutation(
        "grpo.py",
        (
            "    optimizer, scheduler = common.make_optimizer(\n"
            "        policy, args.lr, args.weight_decay, args.warmup_steps, args.steps if args.lr_decay else 0\n"
            "    )\n"
        ),
        "    optimizer, scheduler = common.make_optimizer(policy, args.lr, args.weight_decay, args.warmup_steps, 0)\n",
        "GRPO's --lr-decay ignored (a constant rate)",
        f"{GRPO} -k lr_decay",
    ),
    Mutation(
        "infra/models.py",
        'fast_bf16 = device.type == "cuda" or (cpu_has_bf16_matmul() and model not in common.TINY_MODELS)',
        'fast_bf16 = device.type == "cuda" or cpu_has_bf16_matmul()',
        "auto precision: bf16-mixed for the tiny models on a bf16 CPU",
        f"{COMMON} -k auto_precision",
    ),
    Mutation(
        "infra/models.py",
        'fast_bf16 = device.type == "cuda" or (cpu_has_bf16_matmul() and model not in common.TINY_MODELS)',
        'fast_bf16 = device.type == "cuda" or model not in common.TINY_MODELS',
        "auto precision: bf16-mixed on a CPU that emulates bf16",
        f"{COMMON} -k auto_precision",
    ),
    Mutation(
        "infra/models.py",
        "if reference is not None and policy.bf16_mixed and not args.run.fsdp:",
        "if False:",
        "a bf16-mixed reference keeps float32 weights that autocast casts at every forward",
        f"{COMMON} -k bf16_mixed_reference",
    ),
    Mutation(
        "infra/models.py",
        "if reference is not None and policy.bf16_mixed and not args.run.fsdp:",
        "if reference is not None and policy.bf16_mixed:",
        "a sharded reference with layers of two dtypes (FSDP shards one dtype a layer)",
        f"{COMMON} -k bf16_mixed_reference",
    ),
    Mutation(
        "infra/launches.py",
        "            module.to(torch.bfloat16)",
        "            frozen.to(torch.bfloat16)",
        "the reference's norms and embeddings in bfloat16 too: its log-probs change",
        f"{COMMON} -k bf16_mixed_reference",
    ),
    Mutation(
        "infra/launches.py",
        "\n            and module.weight is not tied\n",
        "\n",
        "an output layer tied to the embeddings cast with the linears: the embeddings become bfloat16",
        f"{COMMON} -k bf16_mixed_reference",
    ),
    Mutation(
        "scripts/memory_plan.py",
        "            + autocast_copies_bytes(config, head, precision, checkpointing)\n",
        "",
        "memory plan: bf16-mixed without autocast's bf16 copies of the trained weights",
        "tests/test_memory_plan.py -k by_hand",
    ),
    Mutation(
        "scripts/memory_plan.py",
        "        layers = layers // config.num_hidden_layers\n",
        "        pass\n",
        "memory plan: checkpointing keeps every layer's autocast copies",
        "tests/test_memory_plan.py -k by_hand",
    ),
    Mutation(
        "scripts/memory_plan.py",
        'if name == "reference" and precision == "bf16-mixed" and ranks == 1:',
        'if name == "reference" and precision == "bf16-mixed":',
        "memory plan: a sharded bf16-mixed reference counted with bf16 linear maps (models.load_policy keeps float32)",
        "tests/test_memory_plan.py -k by_hand",
    ),
    Mutation(
        "scripts/memory_plan.py",
        "weight_bytes = weight_bytes - 2 * (layers + (0 if tied else output))",
        "weight_bytes = weight_bytes - 2 * layers",
        "memory plan: an untied output layer of a bf16-mixed reference counted in float32",
        "tests/test_memory_plan.py -k by_hand",
    ),
    Mutation(
        "infra/shapes.py",
        "config.vocab_size >= vocab_size,",
        "True,",
        "a config file whose vocabulary is smaller than the tokenizer's builds a model that indexes past it",
        f"{GRPO} -k config_file_that",
    ),
    Mutation(
        "infra/models.py",
        'model.bf16_mixed = precision == "bf16-mixed"',
        "model.bf16_mixed = False",
        "bf16-mixed without autocast (float32 compute under the bf16 name)",
        f"{COMMON} -k bf16_mixed_computes",
    ),
    Mutation(
        "infra/models.py",
        'dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32',
        'dtype = torch.bfloat16 if precision != "fp32" else torch.float32',
        "bf16-mixed with bfloat16 weights (no float32 master copy)",
        f"{COMMON} -k small_update",
    ),
    Mutation(
        "infra/runs.py",
        '            distributed.set_rng_states(self.resumed["rng"], generator)\n',
        "",
        "GRPO resume without restoring the sampling generator",
        f"{GRPO} -k resume",
    ),
    Mutation(
        "infra/runs.py",
        "                fsdp.load_state(obj, self.resumed[name], self.models)\n",
        '                if name == "optimizer":\n                    continue\n'
        "                fsdp.load_state(obj, self.resumed[name], self.models)\n",
        "GRPO resume with a fresh AdamW",
        f"{GRPO} -k resume",
    ),
    Mutation(
        "dpo.py",
        '        train_ref = resumed["train_ref"]',
        "        train_ref = None",
        "DPO resume scoring the reference with the trained policy",
        f"{DPO} -k resume",
    ),
    Mutation(
        "ppo.py",
        'kl_coef = resumed["kl_coef"] if resumed else args.kl_coef',
        "kl_coef = args.kl_coef",
        "PPO resume restarting the adaptive KL coefficient",
        f"{PPO} -k resume",
    ),
    Mutation(
        "grpo.py",
        '                run.check_finite(grad_norm, step, "gradient norm")\n',
        "",
        "NaN guard on the loss only, not the gradient norm",
        f"{REL} -k nan_gradient",
    ),
    Mutation(
        "task/tasks.py",
        "\n    finished = [True] * len(texts) if finished is None else finished",
        "\n    finished = [True] * len(texts)",
        "truncated preference samples given an EOS",
        f"{TASKS} -k truncated",
    ),
    # ---- evaluation: pass@k and the strict verifier -----------------------------------------------------------
    Mutation(
        "task/tasks.py",
        "texts[i * k : (i + 1) * k]",
        "texts[i :: len(batch)]",
        "pass@k scoring samples of other problems (interleaved rows)",
        f"{TASKS} -k pass_at_k_groups",
    ),
    Mutation(
        "task/tasks.py",
        "range(n - c + 1, n + 1))",
        "range(n - c, n + 1))",
        "pass@k estimator's product off by one",
        f"{TASKS} -k chens_unbiased",
    ),
    Mutation(
        "task/tasks.py",
        "unearned += reward * (1.0 - verify_strict(text, p.answer))",
        "unearned += 1.0 - verify_strict(text, p.answer)",
        "unearned counting wrong answers too",
        f"{TASKS} -k unearned",
    ),
    Mutation(
        "task/tasks.py",
        "        matches = _STATED_RESULT.findall(completion)",
        "        matches = _NUMBER.findall(completion)",
        "strict verifier paying any last number",
        f"{TASKS} -k strict",
    ),
    Mutation(
        "task/tasks.py",
        "        completion = tagged",
        "        completion = completion",
        "last-number verifier reading past the <answer> tag",
        f"{TASKS} -k answer_tag",
    ),
    Mutation(
        "task/tasks.py",
        "        matches = [_TAGGED_NUMBER.fullmatch(tagged).group(1)]",
        "        matches = _STATED_RESULT.findall(tagged)",
        "strict verifier: <answer>24</answer> not read as a stated result",
        f"{TASKS} -k answer_tag",
    ),
    Mutation(
        "task/tasks.py",
        "    tagged = tagged_answer(completion)\n    if tagged is None:",
        "    tagged = None\n    if tagged is None:",
        "strict verifier reading the reasoning, not the <answer> tag",
        f"{TASKS} -k answer_tag",
    ),
    Mutation(
        "task/tasks.py",
        "    return tagged[-1]",
        "    return tagged[0]",
        "verifiers reading the first <answer> tag, not the last",
        f"{TASKS} -k answer_tag",
    ),
    Mutation(
        "task/rewards.py",
        "    return float(bool(reasoning.strip()) and bool(stated.strip()))",
        "    return 1.0",
        "format reward paying tags that hold only spaces",
        f"{TASKS} -k format_reward",
    ),
    Mutation(
        "grpo.py",
        '"INT", "32")] = 32\n    """micro-batch in sequences',
        '"INT", "32")] = None\n    """micro-batch in sequences',
        "GRPO's default update holds the whole batch of 128 at once",
        f"{GRPO} -k micro_batches_of_32",
    ),
    Mutation(
        "grpo.py",
        "    reward_fn = reward_fn or tasks.VERIFIERS[args.verifier]",
        "    reward_fn = reward_fn or tasks.verify",
        "--verifier ignored in training",
        f"{GRPO} -k verifier_option",
    ),
    # ---- ppo_overoptimisation.py: mitigations of reward over-optimisation ----------------------------------------
    Mutation(
        "ppo_overoptimisation.py",
        "        return scores.mean(0) - std_coef * scores.std(0, unbiased=False)",
        "        return scores.mean(0) - std_coef * scores.std(0)",
        "ensemble mean − k·std with the sample std",
        "tests/test_ppo_overoptimisation.py -k ensemble",
    ),
    Mutation(
        "ppo_overoptimisation.py",
        "    if len(scores) > 1 and mean is not None:",
        "    if False:",
        "ensemble members combined on their raw, offset scores",
        "tests/test_ppo_overoptimisation.py -k ensemble_standardises",
    ),
    Mutation(
        "ppo_overoptimisation.py",
        "last_step=stopped_at,",
        "last_step=args.steps,",
        "--kl-budget stop checkpointed as if every step had trained",
        "tests/test_ppo_overoptimisation.py -k kl_budget",
    ),
    Mutation(
        "ppo_overoptimisation.py",
        "shaped = ((shaped - start_score) / max(start_score_std, 1e-6)).clamp(",
        "shaped = shaped.clamp(",
        "reward clip on the raw score, not standardised",
        "tests/test_ppo_overoptimisation.py -k reward_clip",
    ),
    Mutation(
        "ppo_overoptimisation.py",
        "return shaped + verifier_weight * verified - length_penalty * lengths",
        "return shaped + verifier_weight * verified + length_penalty * lengths",
        "length penalty as a bonus",
        "tests/test_ppo_overoptimisation.py -k composite",
    ),
    Mutation(
        "ppo_overoptimisation.py",
        "        if args.kl_budget is not None and kl_per_completion > args.kl_budget:",
        "        if args.kl_budget is not None and kl_per_completion > args.kl_budget and step > 2:",
        "KL budget checked one update late",
        "tests/test_ppo_overoptimisation.py -k kl_budget",
    ),
    Mutation(
        "ppo_overoptimisation.py",
        "distributed.set_rng_state(rng_before_sampling, generator)",
        "pass",
        "--kl-budget stop checkpoints the sampler's RNG past the batch (a resume draws another)",
        "tests/test_ppo_overoptimisation.py -k kl_budget",
    ),
    Mutation(
        "ppo_overoptimisation.py",
        'ensemble_norm.update({k: torch.tensor(v, device=device) for k, v in before["ensemble_norm"].items()})',
        "pass",
        "a resumed ensemble not standardised by the starting policy's means and stds",
        "tests/test_ppo_overoptimisation.py -k resume",
    ),
    Mutation(
        "ppo_overoptimisation.py",
        "penalised = shaped - args.missing_eos_penalty * (~finished).float()",
        "penalised = shaped + args.missing_eos_penalty * (~finished).float()",
        "the variant's copied loop: missing-EOS penalty added (no longer ppo.py's loop)",
        "tests/test_ppo_overoptimisation.py -k no_mitigation",
    ),
    # ---- scripts/judge.py ------------------------------------------------------------------------------------------
    Mutation(
        "scripts/judge.py",
        "right_second = p_chosen_second < 0.5",
        "right_second = p_chosen_second > 0.5",
        "judge: a verdict in the swapped order read as if unswapped",
        f"{JUDGE} -k by_hand",
    ),
    Mutation(
        "scripts/judge.py",
        "first = torch.cat([p_chosen_first > 0.5, p_chosen_second > 0.5]).float()",
        "first = torch.cat([p_chosen_first > 0.5, p_chosen_second < 0.5]).float()",
        "judge: position bias counted as accuracy",
        f"{JUDGE} -k by_hand",
    ),
    Mutation(
        "scripts/judge.py",
        "if score < 0.5 or (score == 0.5 and coin.random() < 0.5):",
        "if score < 0.5:",
        "judge: a tie keeps the verifier's order (the label leaks)",
        f"{JUDGE} -k labels",
    ),
    Mutation(
        "scripts/judge.py",
        "p_chosen_second = first_is_better(judge, tokenizer, questions, rejected, chosen)",
        "p_chosen_second = first_is_better(judge, tokenizer, questions, chosen, rejected)",
        "judge: both orders show the correct answer first",
        f"{JUDGE} -k script",
    ),
    Mutation(
        "scripts/judge.py",
        'letters = [tokenizer(space + letter, add_special_tokens=False).input_ids[-1] for letter in "AB"]',
        'letters = [tokenizer(space + letter, add_special_tokens=False).input_ids[-1] for letter in "BA"]',
        "judge: the letters' probabilities swapped",
        f"{JUDGE} -k verdict",
    ),
    Mutation(
        "scripts/judge.py",
        "probabilities.append(torch.softmax(logits[:, -1, letters].float(), -1)[:, 0])",
        "probabilities.append(torch.softmax(logits[:, 0, letters].float(), -1)[:, 0])",
        "judge: the verdict read at the first position, a padding token's",
        f"{JUDGE} -k verdict",
    ),
    # ---- scripts/compare.py ----------------------------------------------------------------------------------------
    Mutation(
        "scripts/compare.py",
        'members = ENSEMBLE_SIZE if "--ensemble-agg" in command else 1',
        "members = 1",
        "compare: an ensemble row trains one reward model (its min is that model's score)",
        "tests/test_compare.py -k reward_models_first",
    ),
    Mutation(
        "scripts/compare.py",
        '*[str(rm_run / "model") for rm_run in rm_runs[1:]]',
        '*[str(rm_run / "model") for rm_run in rm_runs]',
        "compare: the ensemble given the first reward model twice",
        "tests/test_compare.py -k given_its_members",
    ),
    Mutation(
        "scripts/compare.py",
        "pairs_of = None if rm_seed == seed else seed",
        "pairs_of = None",
        "compare: each ensemble member samples its own pairs (Coste et al. train theirs on the same data)",
        "tests/test_compare.py -k given_its_members",
    ),
    Mutation(
        "scripts/compare.py",
        'return Path(line.rsplit(" from ", 1)[1]) / "train.jsonl"',
        'return Path(line.rsplit(" from ", 1)[1]) / "heldout.jsonl"',
        "compare: an ensemble member trained on the first's held-out pairs",
        "tests/test_compare.py -k pairs_the_first_sampled",
    ),
    Mutation(
        "scripts/compare.py",
        'GRPO = ["grpo.py", "--prompts-per-step", "4"]',
        'GRPO = ["grpo.py"]',
        "compare.py's GRPO rows at grpo.py's default 16 prompts, counted as 32 completions a step",
        "tests/test_compare.py -k completions_per_step",
    ),
    Mutation(
        "scripts/compare.py",
        "kl += common.masked_sum(logprobs - ref_logprobs, completion_mask).item()",
        "kl += common.masked_sum(ref_logprobs - logprobs, completion_mask).item()",
        "comparison KL with the log-ratio reversed",
        "tests/test_compare.py -k sampled_kl",
    ),
    Mutation(
        "scripts/compare.py",
        'return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"',
        'return f"{statistics.mean(values):.{digits}f} ± {statistics.pstdev(values):.{digits}f}"',
        "comparison spread as the population std over seeds",
        "tests/test_compare.py -k mean_std",
    ),
    Mutation(
        "scripts/compare.py",
        '        while i + 1 < len(options) and not options[i + 1].startswith("--"):\n',
        '        if i + 1 < len(options) and not options[i + 1].startswith("--"):\n',
        "comparison reads one value per option (--rewards correct format)",
        "tests/test_compare.py -k command_settings",
    ),
    Mutation(
        "scripts/compare.py",
        'first = {r["seed"]: r for r in reversed(rows)}',
        'first = {r["seed"]: r for r in rows}',
        "comparison's starting model read from each seed's last run (another prompt's)",
        "tests/test_compare.py -k table_rows",
    ),
    Mutation(
        "scripts/compare.py",
        '    prompt_style = run_args.get("prompt_style", "question")',
        '    prompt_style = "question"',
        "compare.py's pass@k and KL of an R1 run measured on plain question prompts",
        "tests/test_compare.py -k end_to_end",
    ),
    Mutation(
        "scripts/compare.py",
        "    _, problems = tasks.with_prompt_style(prompt_style, iter([]), tasks.heldout_problems(eval_size))",
        "    problems = tasks.heldout_problems(eval_size)",
        "compare.py's sampled measures ignore the prompt style",
        "tests/test_compare.py -k ask_the_questions",
    ),
    Mutation(
        "scripts/compare.py",
        '            pass_cell += f" (from {mean_std(start_passes)})"\n',
        '            pass_cell += ""\n',
        "compare.py's R1 row without its own start's pass@k",
        "tests/test_compare.py -k table_rows",
    ),
    # ---- scripts/prm_vs_orm.py: majority vote and the ORM's pairs ---------------------------------------------------
    Mutation(
        "scripts/prm_vs_orm.py",
        "votes.most_common(1)[0][0]",
        "votes.most_common()[-1][0]",
        "majority vote picks the least frequent final number",
        "tests/test_compare.py -k majority",
    ),
    Mutation(
        "scripts/prm_vs_orm.py",
        '"chosen": right[i % len(right)], "rejected": wrong[i % len(wrong)]',
        '"chosen": wrong[i % len(wrong)], "rejected": right[i % len(right)]',
        "ORM pairs with the wrong solution chosen",
        "tests/test_compare.py -k orm_pairs",
    ),
    Mutation(
        "scripts/prm_vs_orm.py",
        "count = min(per_problem, max(len(right), len(wrong)))",
        "count = max(len(right), len(wrong))",
        "ORM pairs not limited per problem",
        "tests/test_compare.py -k orm_pairs",
    ),
    # ---- scripts/memory_plan.py: the memory plan ---------------------------------------------------------------------
    Mutation(
        "scripts/memory_plan.py",
        '"gradients_gb": trainable * width / ranks / 2**30',
        '"gradients_gb": trainable * width / 2**30',
        "memory plan (--fsdp): gradients not split over the ranks",
        f"{MEMORY} -k fsdp",
    ),
    Mutation(
        "scripts/memory_plan.py",
        '"optimizer_gb": 2 * trainable * width / ranks / 2**30',
        '"optimizer_gb": 2 * trainable * 4 / ranks / 2**30',
        "memory plan: AdamW moments always float32 (bf16-true keeps them in bfloat16)",
        f"{MEMORY} -k memory_plan_matches",
    ),
    Mutation(
        "scripts/memory_plan.py",
        "    return total + adapters, adapters + score",
        "    return total + adapters, adapters",
        "memory plan: a LoRA reward model's score head not trained",
        f"{MEMORY} -k lora_trainable",
    ),
    Mutation(
        "scripts/memory_plan.py",
        "    kept = (layers * 2 * tokens * h * scale + per_layer) if checkpointing else layers * per_layer",
        "    kept = (layers * 2 * tokens * h * scale) if checkpointing else layers * per_layer",
        "memory plan: checkpointing without the one recomputed layer",
        f"{MEMORY} -k activation_bytes",
    ),
    Mutation(
        "scripts/memory_plan.py",
        "    kept = (layers * 2 * tokens * h * scale + per_layer) if checkpointing else layers * per_layer",
        "    kept = (layers * 2 * tokens * h * scale + per_layer) if checkpointing else per_layer",
        "memory plan: activations of one layer, not all",
        f"{MEMORY} -k allocators_live_bytes",
    ),
    # ---- the KL-regularised optimum on a bandit: each algorithm must reach its closed form ------------------
    Mutation(
        "ppo.py",
        "rewards = -kl_coef * kl * mask",
        "rewards = -kl_coef * kl.clamp(min=0) * mask",
        "PPO's k1 penalty clipped at 0 (a plausible 'KL is never negative' fix)",
        f"{BANDIT} -k ppo",
    ),
    Mutation(
        "dpo.py",
        (
            "    losses = -(1 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(\n"
            "        -beta * logits\n"
        ),
        (
            "    losses = -(1 - label_smoothing) * beta *"
            " F.logsigmoid(logits) - label_smoothing * beta * F.logsigmoid(\n"
            "        -logits\n"
        ),
        "DPO with β outside the log-sigmoid",
        f"{BANDIT} -k dpo",
    ),
    Mutation(
        "grpo.py",
        "        return 0.5 * log_ratio**2",
        "        return torch.exp(log_ratio) - log_ratio - 1.0",
        "k2 computed as k3 (the forward KL's gradient)",
        f"{BANDIT} -k k2",
    ),
    Mutation(
        "grpo.py",
        "        centered = centered / (grouped.std(dim=1, unbiased=False, keepdim=True) + eps)",
        "        centered = centered / (rewards.std(unbiased=False) + eps)",
        "std of the whole batch instead of each group's",
        f"{BANDIT} -k fixed_point",
    ),
    # Gradients are freed right after each optimizer step; without it they pile up across steps.
    Mutation(
        "grpo.py",
        "                optimizer.zero_grad(set_to_none=True)  #",
        "                pass  #",
        "gradients accumulate across steps (never zeroed)",
        f"{GRPO} -k resume_continues_exactly",
    ),
    Mutation(
        "dpo.py",
        "        optimizer.zero_grad(set_to_none=True)  #",
        "        pass  #",
        "gradients accumulate across steps (never zeroed)",
        f"{DPO} -k resume_continues_exactly",
    ),
    Mutation(
        "sft.py",
        "        optimizer.zero_grad(set_to_none=True)\n",
        "        pass\n",
        "gradients accumulate across steps (never zeroed)",
        f"{SFT} -k resume_continues_exactly",
    ),
    Mutation(
        "reward_model.py",
        "        optimizer.zero_grad(set_to_none=True)  #",
        "        pass  #",
        "gradients accumulate across steps (never zeroed)",
        f"{RM} -k resume_continues_exactly",
    ),
    Mutation(
        "variants.py",
        "        optimizer.zero_grad(set_to_none=True)  #",
        "        pass  #",
        "gradients accumulate across steps (never zeroed)",
        f"{VARIANTS} -k resume_continues_exactly",
    ),
    Mutation(
        "ppo.py",
        (
            "                # now, not at the next backward: idle through sampling\n"
            "                policy_optimizer.zero_grad(set_to_none=True)\n"
        ),
        "                pass  # now, not at the next backward: idle through sampling\n",
        "policy gradients accumulate across minibatches (never zeroed)",
        f"{PPO} -k resume_continues_exactly",
    ),
    Mutation(
        "common.py",
        "    if kernels_on(model):  # kernels.cpu_bf16_decoding",
        "    if True:  # kernels.cpu_bf16_decoding",
        "sampling's kernel used whatever --kernels says",
        "tests/test_kernels.py -k plain_path",
    ),
    Mutation(
        "infra/models.py",
        '    return kernels == "on" or (kernels == "auto" and device.type == "cpu")',
        '    return kernels != "off"',
        "--kernels auto on for CUDA too",
        "tests/test_kernels.py -k auto_is_on",
    ),
    # ---- no evaluated problem in training; a skipped batch still counts -----------------------------------
    Mutation(
        "task/tasks.py",
        "    return heldout_problems(max(eval_size, DEFAULT_EVAL_SIZE), make=make)",
        "    return heldout_problems(make=make)",
        "offline data excludes only the default 200 held-out problems",
        "tests/test_heldout.py",
    ),
    Mutation(
        "sft.py",
        "tasks.training_exclusion(eval_size)",
        "tasks.heldout_problems()",
        "SFT demonstrations exclude only the default 200 held-out problems",
        "tests/test_heldout.py -k sft",
    ),
    Mutation(
        "grpo.py",
        "        scheduler.step()\n",
        "        scheduler.step() if update else None\n",
        "a batch skipped by dynamic sampling does not count for the warm-up",
        f"{GRPO} -k skipped_batch",
    ),
    Mutation(
        "grpo.py",
        "        run.evaluate(step, evaluate)\n",
        "        run.evaluate(step, evaluate) if update else None\n",
        "a skipped batch skips that step's evaluation",
        f"{GRPO} -k skipped_batch",
    ),
    # ---- loading, logging and sampling guards ---------------------------------------------------------------
    Mutation(
        "infra/models.py",
        "    switch_off_dropout(model)\n",
        "",
        "dropout left on in loaded models (GPT-2's config has 0.1)",
        f"{COMMON} -k dropout",
    ),
    Mutation(
        "infra/models.py",
        'if isinstance(value, float) and ("dropout" in name or "pdrop" in name):',
        "if False:",
        "dropout off only in nn.Dropout modules (Llama's attention reads a float)",
        f"{COMMON} -k dropout",
    ),
    Mutation(
        "infra/kernels.py",
        "e.mul_(z.clamp_(min=torch.finfo(z.dtype).min))",
        "e.mul_(z)",
        "kernel entropy NaN where a logit is -inf (0 · -inf)",
        f"{COMMON} -k minus_infinity",
    ),
    Mutation(
        "infra/kernels.py",
        "            log_p.clamp_(min=-1e4)\n",
        "            log_p.clamp_(min=torch.finfo(log_p.dtype).min)\n",
        "kernel entropy gradient overflows to NaN at a -inf logit",
        "tests/test_kernels.py -k minus_infinity",
    ),
    Mutation(
        "task/tasks.py",
        "else 16 if tiny else DEFAULT_EVAL_SIZE",
        "else DEFAULT_EVAL_SIZE",
        "a tiny model's smoke run evaluates 200 problems",
        f"{REL} -k scaled_to_the_model",
    ),
    Mutation(
        "infra/runs.py",
        "evals_left = 1 + (",
        "evals_left = 0 + (",
        "the expected duration leaves out the final evaluation",
        f"{REL} -k expected_duration",
    ),
    Mutation(
        "reward_model.py",
        "best = [max(rows, key=",
        "best = [min(rows, key=",
        "best-of-n picks each prompt's lowest-scored sample",
        f"{RM} -k agreement_by_hand",
    ),
    Mutation(
        "reward_model.py",
        "[labels[rows].max() for rows",
        "[labels[rows].mean() for rows",
        "the oracle is a random sample, not any right one",
        f"{RM} -k agreement_by_hand",
    ),
    Mutation(
        "scripts/rm_agreement.py",
        "args.temperature,\n            args.seed,\n            desc=",
        "args.temperature,\n            args.seed + len(rows),\n            desc=",
        "each policy sampled with its own seed",
        "tests/test_compare.py -k rm_agreement",
    ),
    Mutation(
        "scripts/policy_pairs.py",
        'pairs = earlier + data["train"] + data["heldout"]',
        'pairs = data["train"] + data["heldout"] + earlier',
        "the earlier rounds written after the policy's pairs",
        "tests/test_compare.py -k policy_pairs",
    ),
    Mutation(
        "infra/runs.py",
        "            step_s = time.time() - self.loop_start\n            self.loop_start = time.time()\n",
        "            step_s = time.time() - self.loop_start\n",
        "step 2's pace measured from the loop's start (warm-up in it)",
        f"{REL} -k counts_pass_at_k",
    ),
    Mutation(
        "infra/runs.py",
        (
            "        # the expected duration, after\n"
            "        if self.main and step - self.first_step in (0, 1) and step < self.args.steps:\n"
        ),
        (
            "        if self.main and step == self.first_step and"
            " step < self.args.steps:  # the expected duration, after\n"
        ),
        "the expected duration printed after the first step only",
        f"{REL} -k expected_duration",
    ),
    Mutation(
        "infra/runs.py",
        "+ (self.eval_seconds - pass_k_s) * evals_left + pass_k_s",
        "+ self.eval_seconds * evals_left",
        "the expected duration counts pass@k in every evaluation",
        f"{REL} -k counts_pass_at_k",
    ),
    Mutation(
        "task/tasks.py",
        '        result["pass_k_seconds"] = time.perf_counter() - started\n',
        "",
        "pass@k's seconds not recorded (counted in every evaluation)",
        f"{TASKS} -k times_pass_at_k",
    ),
    Mutation(
        "task/tasks.py",
        (
            "        # runs.Run's expected duration counts pass@k only in the last evaluation\n"
            "        started = time.perf_counter()\n"
        ),
        "        started = 0.0  # runs.Run's expected duration counts pass@k only in the last evaluation\n",
        "pass@k timed from the epoch, not from its start",
        f"{TASKS} -k times_pass_at_k",
    ),
    Mutation(
        "infra/metrics.py",
        (
            '                json.dumps({k: float(f"{v:.6g}") if'
            " isinstance(v, float) else v for k, v in row.items()})\n"
            '                + "\\n"\n'
        ),
        '                json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()}) + "\\n"\n',
        "metrics rounded to 6 decimals (an lr of 2e-7 logged as 0)",
        f"{COMMON} -k significant",
    ),
    Mutation(
        "infra/runs.py",
        "        tempfile.TemporaryDirectory(dir=existing).cleanup()\n",
        "        pass\n",
        "--output-dir trusted to os.access (root under /proc)",
        f"{REL} -k proc",
    ),
    Mutation(
        "infra/runs.py",
        '        bar.close()\n    print(f"error: {message}"',
        '        pass\n    print(f"error: {message}"',
        "progress bar left open, redrawn below the error line",
        f"{REL} -k nan_stop",
    ),
    Mutation(
        "infra/runs.py",
        "    except (torch.OutOfMemoryError, MemoryError) as e:\n        _one_line_error(_out_of_memory(e, args))",
        "    except MemoryError as e:\n        _one_line_error(_out_of_memory(e, args))",
        "out of memory on CUDA ends in a traceback",
        f"{REL} -k out_of_memory",
    ),
    Mutation(
        "infra/runs.py",
        '        if "can\'t allocate memory" not in str(e):',
        "        if True:",
        "the CPU allocator's out of memory ends in a traceback",
        f"{REL} -k out_of_memory",
    ),
    Mutation(
        "infra/runs.py",
        "            raise\n        _one_line_error(_out_of_memory(e, args))",
        "            pass\n        _one_line_error(_out_of_memory(e, args))",
        "any RuntimeError hidden behind an out-of-memory line",
        f"{REL} -k out_of_memory",
    ),
    Mutation(
        "infra/runs.py",
        'resumable = ("gradient_checkpointing", *getattr(args, "resumable_with", ()))',
        'resumable = ("gradient_checkpointing", "batch_size")',
        "out of memory: every script's --batch-size offered to --resume, where only grpo.py's keeps the run",
        f"{REL} -k out_of_memory_line",
    ),
    Mutation(
        "infra/runs.py",
        'changed = [_lower(name) for name in ("batch_size", "max_new_tokens") if hasattr(args, name)]',
        'changed = [_lower(name) for name in ("batch_size", "max_new_tokens")]',
        "out of memory: options named to a script that has none of them",
        f"{REL} -k out_of_memory_line",
    ),
    Mutation(
        "infra/kernels.py",
        (
            "    return (\n"
            "        type(module).forward is torch.nn.Linear.forward\n"
            '        and "forward" not in vars(module)\n'
            "        and (autocast_on or module.weight.dtype == torch.bfloat16)\n"
            "    )\n"
        ),
        '    return type(module).forward is torch.nn.Linear.forward and "forward" not in vars(module)\n',
        "a float32 LoRA adapter packed into bf16 under bf16-true",
        "tests/test_kernels.py -k packs_weights",
    ),
    Mutation(
        "infra/kernels.py",
        (
            "    return (\n"
            "        type(module).forward is torch.nn.Linear.forward\n"
            '        and "forward" not in vars(module)\n'
            "        and (autocast_on or module.weight.dtype == torch.bfloat16)\n"
            "    )\n"
        ),
        "    return isinstance(module, torch.nn.Linear) and (autocast_on or module.weight.dtype == torch.bfloat16)\n",
        "a Linear subclass or an installed forward packed over",
        "tests/test_kernels.py -k forward_of_their_own",
    ),
    Mutation(
        "infra/models.py",
        "            torch.manual_seed(0)\n            model = make_tiny_model",
        "            torch.manual_seed(seed)\n            model = make_tiny_model",
        "the tiny base depends on --seed (a LoRA reward model reloads onto another base)",
        "tests/test_lora.py -k own_base",
    ),
    Mutation(
        "scripts/memory_plan.py",
        "    logits = 2 * logit_tokens * config.vocab_size * 2 * scale\n",
        "    logits = 3 * logit_tokens * config.vocab_size * 4\n",
        "memory plan: three float32 logits tensors (the code before token_logprobs)",
        f"{MEMORY} -k logits_term",
    ),
    Mutation(
        "scripts/memory_plan.py",
        '            rows.append(("reward model", model_config(args.reward_model, vocab_size), "score", False))\n',
        "            pass\n",
        "memory plan (grpo) leaves the reward model out",
        f"{MEMORY} -k counts_a_reward_model",
    ),
    Mutation(
        "scripts/memory_plan.py",
        '    rows = [policy] + [reference] * (args.algo not in ("simpo", "orpo") and not lora)\n',
        '    rows = [policy] + [reference] * (args.algo in ("ipo", "kto", "rloo", "remax") and not lora)\n',
        "memory plan (variants): REINFORCE++ planned without its reference model",
        f"{MEMORY} -k variants_plan_holds",
    ),
    Mutation(
        "scripts/memory_plan.py",
        'per_prompt = 2 if offline else (1 if args.algo == "remax" else args.group_size)',
        'per_prompt = 2 if offline else (args.group_size if args.algo == "rloo" else 1)',
        "memory plan (variants): REINFORCE++ planned on one sample per prompt instead of k",
        f"{MEMORY} -k variants_plan_holds",
    ),
    Mutation(
        "scripts/memory_plan.py",
        '"reward_model", "variants", "prm")',
        '"reward_model", "variants")',
        "memory plan: prm cannot be planned",
        f"{MEMORY} -k prm_plan_holds",
    ),
    Mutation(
        "scripts/memory_plan.py",
        "        logits += 3 * rows * per_sequence * 4\n",
        "",
        "memory plan: the plain log-prob path's float32 piece left out",
        f"{MEMORY} -k 'by_hand or logits_term'",
    ),
    # ---- prm.py: steps, Math-Shepherd labels, the loss, where the score is read, aggregates, dense rewards ----------
    Mutation(
        "task/stepwise.py",
        "if start <= last - 1 < end]",
        "if start <= last < end]",
        "PRM: a step's end read one character late (the newline's token)",
        f"{PRM} -k ragged",
    ),
    Mutation(
        "task/stepwise.py",
        r'r"^[^\S\n]*(\S(?:[^\n]*\S)?)"',
        r'r"^([^\n]*)"',
        "PRM: blank lines and edge whitespace cut as steps",
        f"{PRM} -k ragged",
    ),
    Mutation(
        "prm.py",
        '    return (rollouts_correct > 0).float() if kind == "hard" else rollouts_correct.float() / num_rollouts\n',
        (
            "    return (\n"
            "        (rollouts_correct == num_rollouts).float()\n"
            '        if kind == "hard"\n'
            "        else rollouts_correct.float() / num_rollouts\n"
            "    )\n"
        ),
        "PRM: hard label needs every rollout right (all, not any)",
        f"{PRM} -k fixed_rollouts",
    ),
    Mutation(
        "prm.py",
        "else rollouts_correct.float() / num_rollouts",
        "else (rollouts_correct > 0).float()",
        "PRM: soft label is the hard one",
        f"{PRM} -k fixed_rollouts",
    ),
    Mutation(
        "prm.py",
        (
            '        (row, row["completion"][:end] + "\\n")\n'
            "        for row in rows\n"
            '        for _, end in stepwise.split_steps(row["completion"])[:-1]\n'
        ),
        (
            '        (row, row["completion"][:end] + "\\n") for row in'
            ' rows for _, end in stepwise.split_steps(row["completion"])[1:]\n'
        ),
        "PRM: rollouts from the next step's prefix (labels from the wrong step)",
        f"{PRM} -k fixed_rollouts",
    ),
    Mutation(
        "prm.py",
        'row["rollouts_correct"].append(num_rollouts * row["correct"])',
        'row["rollouts_correct"].append(num_rollouts)',
        "PRM: the last step labelled good whatever the solution's answer",
        f"{PRM} -k fixed_rollouts",
    ),
    Mutation(
        "prm.py",
        "return common.masked_mean(losses, step_mask)",
        "return losses.mean()",
        "PRM: BCE averaged over padding steps too",
        f"{PRM} -k loss_by_hand",
    ),
    Mutation(
        "task/stepwise.py",
        "token_logits[:, prompt_ids.shape[1] :]",
        "token_logits[:, prompt_ids.shape[1] - 1 :]",
        "PRM: step score read one token early",
        f"{PRM} -k whatever_the_padding",
    ),
    Mutation(
        "task/stepwise.py",
        (
            "            .base_model(\n"
            "                input_ids=input_ids,\n"
            "                attention_mask=attention_mask,\n"
            "                position_ids=common.position_ids(attention_mask),\n"
            "            )\n"
        ),
        "            .base_model(input_ids=input_ids, attention_mask=attention_mask)\n",
        "PRM: positions counted from the left padding",
        f"{PRM} -k whatever_the_padding",
    ),
    Mutation(
        "task/stepwise.py",
        "return torch.where(step_mask.bool(), token_scores.gather(1, step_ends), 0.0)",
        "return token_scores.gather(1, step_ends)",
        "PRM: padded step slots read token 0's score",
        f"{PRM} -k step_ends_by_hand",
    ),
    Mutation(
        "prm.py",
        'score = filled.amin(1) if how == "min"',
        'score = filled.mean(1) if how == "min"',
        "PRM: mean instead of min over a solution's steps",
        f"{PRM} -k aggregation",
    ),
    Mutation(
        "prm.py",
        "filled = step_probs.masked_fill(step_mask == 0, 1.0)",
        "filled = step_probs",
        "PRM: padding steps enter the min and the product",
        f"{PRM} -k aggregation",
    ),
    Mutation(
        "prm.py",
        "best = scores.view(-1, n).argmax(1)",
        "best = scores.view(-1, n).argmin(1)",
        "PRM: best-of-N picks the lowest score",
        f"{PRM} -k aggregation",
    ),
    Mutation(
        "prm.py",
        "    if step_probs.shape[1] == 0:",
        "    if False:",
        "PRM: a batch with no step at all raises in min (amin over an empty axis)",
        f"{PRM} -k aggregation",
    ),
    Mutation(
        "task/stepwise.py",
        "        ends.append(holding[-1])",
        "        ends.append(holding[0])",
        "PRM: a step ending in a multi-byte character scored at its first byte token",
        f"{PRM} -k cutting",
    ),
    Mutation(
        "task/stepwise.py",
        "rewards.scatter_add(1, step_ends, step_scores * step_mask)",
        "rewards.scatter(1, step_ends, step_scores * step_mask)",
        "PRM: dense reward by scatter (padding overwrites a step ending at token 0)",
        f"{PRM} -k dense",
    ),
    Mutation(
        "task/tasks.py",
        "train_problems(seed, training_exclusion(eval_size, make=chain), make=chain)",
        "train_problems(seed, training_exclusion(eval_size), make=chain)",
        "multi-step chains trained on their held-out set (the sums' excluded instead)",
        f"{TASKS} -k multistep",
    ),
    Mutation(
        "common.py",
        "    token = torch.searchsorted(cdf, u, right=True)",
        "    token = torch.searchsorted(cdf, u)",
        "sampling draws token 0 at u = 0 even where it has no mass",
        f"{COMMON} -k zero_mass",
    ),
    Mutation(
        "common.py",
        "                use_cache=True,\n                **{CACHE: cache},\n            ).logits",
        "                use_cache=True,\n                removed_keyword=cache,\n            ).logits",
        "shared-prompt cache passed by a name transformers no longer reads (silently ignored)",
        f"{COMMON} -k 'one_token_at_a_time or one_token_prompts'",
    ),
    Mutation(
        "common.py",
        'CACHE = "cache" if',
        'CACHE = "past_key_values" if',
        "the cache passed by the name transformers deprecated",
        f"{COMMON} -k installed_transformers",
    ),
    # ---- infra/decoding.py: the compiled decode step, equal to the plain sampler ---------------------------------
    Mutation(
        "infra/decoding.py",
        "token, logprob = common.token_from_uniform(logits, temperature, top_p, u)",
        "token, logprob = common.token_from_uniform(logits, 1.0, top_p, u)",
        "compiled decoding: the step drops the temperature",
        f"{DECODING} -k plain_sampler",
    ),
    Mutation(
        "infra/decoding.py",
        "token, logprob = common.token_from_uniform(logits, temperature, top_p, u)",
        "token, logprob = common.token_from_uniform(logits, temperature, 1.0, u)",
        "compiled decoding: the step drops the nucleus",
        f"{DECODING} -k plain_sampler",
    ),
    Mutation(
        "infra/decoding.py",
        "            layer.cumulative_length.fill_(keys.shape[2])",
        "            pass",
        "compiled decoding: new keys written over the prompt's (the static cache's length left at 0)",
        f"{DECODING} -k plain_sampler",
    ),
    Mutation(
        "infra/decoding.py",
        "position = prompt_lengths + t  #",
        "position = prompt_lengths + t + 1  #",
        "compiled decoding: each new token one position late",
        f"{DECODING} -k plain_sampler",
    ),
    Mutation(
        "infra/decoding.py",
        "        token = torch.where(finished, pad, token)",
        "        token = token",
        "compiled decoding: a finished row goes on drawing tokens",
        f"{DECODING} -k end_early",
    ),
    Mutation(
        "infra/decoding.py",
        "            for _ in range(steps):",
        "            for _ in range(steps + 1):",
        "compiled decoding: the generator left one draw ahead of the plain sampler's",
        f"{DECODING} -k end_early",
    ),
    Mutation(
        "infra/decoding.py",
        "        return tokens[:, :steps], logprobs[:, :steps]",
        "        return tokens, logprobs",
        "compiled decoding: the steps after the last EOS, up to the next check, kept",
        f"{DECODING} -k end_early",
    ),
    Mutation(
        "infra/models.py",
        '    if args.run.decode == "compiled":',
        "    if False:",
        "--decode compiled never reaches the policy",
        f"{DECODING} -k grpo_with",
    ),
    Mutation(
        "common.py",
        '    if hasattr(model, "decoder"):',
        "    if False:",
        "the plain sampler never hands over to the compiled decoder",
        f"{DECODING} -k grpo_with",
    ),
    Mutation(
        "infra/fsdp.py",
        '            args.run.decode == "plain",',
        "            True,",
        "--decode compiled with --fsdp let through",
        f"{DECODING} -k fsdp",
    ),
    # ---- torchrun: the loss exact over the ranks, the logged numbers reduced, each rank's random states ----------
    Mutation(
        "grpo.py",
        (
            "            batch_tokens = distributed.all_sum(mask.sum())  # every rank's\n"
            "            batch_rows = distributed.all_sum(B)\n"
        ),
        "            batch_tokens = mask.sum()  # every rank's\n            batch_rows = B\n",
        "GRPO loss divided by each rank's own tokens and sequences",
        f"{DIST} -k grpo_two_ranks",
    ),
    Mutation(
        "infra/stepmetrics.py",
        '"entropy": distributed.all_sum(self.entropy)}',
        '"entropy": self.entropy}',
        "GRPO entropy, a rank's part of the token mean, not summed over the ranks",
        f"{DIST} -k grpo_two_ranks",
    ),
    Mutation(
        "grpo.py",
        (
            "        # each rank's mean over an equal share: their mean is the batch's\n"
            "        stats = distributed.mean_over_ranks(stats)\n"
        ),
        "        pass  # each rank's mean over an equal share: their mean is the batch's\n",
        "GRPO logs rank 0's numbers, not the batch's",
        f"{DIST} -k grpo_two_ranks",
    ),
    Mutation(
        "grpo.py",
        (
            "                # Σ over the ranks: each one's loss is its part of the batch's\n"
            "                distributed.all_reduce_grads(policy)\n"
        ),
        "                pass  # Σ over the ranks: each one's loss is its part of the batch's\n",
        "GRPO gradients not summed over the ranks",
        f"{DIST} -k grpo_two_ranks",
    ),
    Mutation(
        "dpo.py",
        (
            "        # this rank's part of the batch's mean; × 1.0 alone\n"
            "        loss = losses.mean() * distributed.share_of(len(pairs))\n"
        ),
        "        loss = losses.mean()  # this rank's part of the batch's mean; × 1.0 alone\n",
        "DPO loss a mean over each rank's pairs, then summed",
        f"{DIST} -k dpo_two_ranks",
    ),
    Mutation(
        "sft.py",
        "share = distributed.share_of(mask.sum())",
        "share = 1.0 / distributed.world_size()",
        "SFT the average of per-rank token means (DDP's averaging), not the batch's token mean",
        f"{DIST} -k sft_two_ranks",
    ),
    Mutation(
        "infra/fsdp.py",
        "            module.set_gradient_divide_factor(1.0)",
        "            pass",
        "--fsdp: gradients averaged over the ranks, not summed",
        f"{DIST} -k grpo_sharded",
    ),
    Mutation(
        "infra/fsdp.py",
        "            module.set_force_sum_reduction_for_comms(True)",
        "            pass",
        "--fsdp with LoRA: the reduce-scatter left at FSDP's default op",
        f"{DIST} -k lora",
    ),
    Mutation(
        "infra/fsdp.py",
        'for unit in (inner.base_model, inner.score) if hasattr(inner, "score")',
        'for unit in (model.base_model, model.score) if hasattr(model, "score")',
        "--fsdp with LoRA: a critic's backbone taken as peft's wrapper, not the transformer",
        f"{DIST} -k lora",
    ),
    Mutation(
        "infra/fsdp.py",
        (
            "        require(\n"
            '            eval_size % ranks == 0, f"--fsdp: --eval-size'
            ' {eval_size} must divide over {ranks} torchrun ranks"\n'
            "        )\n"
        ),
        '        require(True, f"--fsdp: --eval-size {eval_size} must divide over {ranks} torchrun ranks")\n',
        "--fsdp: a held-out set that does not divide over the ranks let through (their forwards would hang)",
        f"{DIST} -k fsdp_set_up",
    ),
    Mutation(
        "infra/fsdp.py",
        (
            "            under_torchrun,\n"
            '            "--fsdp shards the model over torchrun\'s ranks: torchrun --nproc_per_node N script.py ...",\n'
        ),
        (
            "            True, \"--fsdp shards the model over torchrun's"
            ' ranks: torchrun --nproc_per_node N script.py ..."\n'
        ),
        "--fsdp in a plain run let through (no process group to shard over)",
        f"{DIST} -k fsdp_set_up",
    ),
    Mutation(
        "infra/distributed.py",
        'return "LOCAL_RANK" in os.environ',
        "return world_size() > 1",
        "torchrun --nproc_per_node 1: the one rank never joins a group, so --fsdp cannot shard",
        f"{DIST} -k one_rank_is_let_through",
    ),
    Mutation(
        "infra/runs.py",
        ">= (5, 23),",
        ">= (5, 0),",
        "a transformers without activation_checkpointing_enable let through (the first step fails)",
        f"{REL} -k transformers_older",
    ),
    Mutation(
        "infra/distributed.py",
        'if world_size() == 1 or getattr(model, "sharded", False):',
        "if world_size() == 1:",
        "--fsdp: the reduce-scattered gradients all-reduced once more",
        f"{DIST} -k grpo_sharded",
    ),
    Mutation(
        "infra/fsdp.py",
        (
            "    # not before\n"
            "    if isinstance(obj, torch.optim.Optimizer) and is_sharded(model := owner(obj, models)) and obj.state:\n"
        ),
        "    if isinstance(obj, torch.optim.Optimizer) and False:\n",
        "--fsdp: each rank's AdamW shard saved as rank 0's, resumed on every rank",
        f"{DIST} -k 'resumes and grpo-fsdp'",
    ),
    Mutation(
        "infra/fsdp.py",
        "    return next(\n",
        "    return next(iter(models.values())) or next(\n",
        "--fsdp: the critic's AdamW gathered with the policy's shards",
        f"{DIST} -k 'resumes and ppo'",
    ),
    Mutation(
        "ppo.py",
        (
            "                # the two models share no parameters\n"
            "                ((policy_loss + args.vf_coef * vf_loss) * share).backward()\n"
        ),
        "                (policy_loss + args.vf_coef * vf_loss).backward()  # the two models share no parameters\n",
        "PPO losses token means over each rank's rows, then summed",
        f"{DIST} -k ppo_two_ranks",
    ),
    Mutation(
        "ppo.py",
        "advantages = masked_whiten(advantages, mask, all_sum=distributed.all_sum) * mask",
        "advantages = masked_whiten(advantages, mask) * mask",
        "PPO advantages whitened over each rank's tokens, not the batch's",
        f"{DIST} -k ppo_two_ranks",
    ),
    Mutation(
        "ppo.py",
        (
            "        # the whole batch's\n"
            '        kl_per_completion = distributed.mean_over_ranks({"kl": kl.sum(1).mean().item()})["kl"]\n'
        ),
        "        kl_per_completion = kl.sum(1).mean().item()  # the whole batch's\n",
        "PPO's adaptive KL steered by each rank's own KL",
        f"{DIST} -k ppo_two_ranks",
    ),
    Mutation(
        "ppo.py",
        "                distributed.all_reduce_grads(critic)\n",
        "",
        "PPO critic gradients not summed over the ranks",
        f"{DIST} -k ppo_two_ranks",
    ),
    Mutation(
        "ppo.py",
        "    return masked_mean(kl, mask, all_sum=distributed.all_sum).item()",
        "    return masked_mean(kl, mask).item()",
        "PPO-Penalty: each rank adapts β on its own tokens' KL, and the ranks train on different β",
        f"{DIST} -k penalty_two_ranks",
    ),
    Mutation(
        "infra/stepmetrics.py",
        "        scale = share * distributed.world_size()\n",
        "        scale = 1.0\n",
        "PPO logs the mean of each rank's token means, not the minibatch's",
        f"{DIST} -k ppo_two_ranks",
    ),
    Mutation(
        "ppo.py",
        "explained_variance(old_values, returns, mask, all_sum=distributed.all_sum)",
        "explained_variance(old_values, returns, mask)",
        "PPO explained variance of each rank's tokens, averaged",
        f"{DIST} -k ppo_two_ranks",
    ),
    Mutation(
        "variants.py",
        "(loss * share).backward()",
        "loss.backward()",
        "variants: each rank's loss a mean over its own share, then summed",
        f"{DIST} -k variants_two_ranks",
    ),
    Mutation(
        "variants.py",
        "return masked_whiten(returns, mask, all_sum=distributed.all_sum) * mask",
        "return masked_whiten(returns, mask) * mask",
        "REINFORCE++ advantages whitened over each rank's tokens, not the batch's",
        f"{DIST} -k variants_two_ranks",
    ),
    Mutation(
        "variants.py",
        "        distributed.all_reduce_grads(policy)  # Σ over the ranks",
        "",
        "variants: gradients not summed over the ranks",
        f"{DIST} -k variants_two_ranks",
    ),
    Mutation(
        "prm.py",
        "        (loss * share).backward()",
        "        loss.backward()",
        "PRM loss a mean over each rank's steps, then summed",
        f"{DIST} -k prm_two_ranks",
    ),
    Mutation(
        "prm.py",
        "    distributed.barrier()\n",
        "",
        "PRM: the other ranks read the labels before rank 0 has written them",
        f"{DIST} -k prm_two_ranks",
    ),
    Mutation(
        "infra/distributed.py",
        "set_rng_state(states if world_size() == 1 else states[rank()], generator)",
        "set_rng_state(states if world_size() == 1 else states[0], generator)",
        "every rank resumed with rank 0's random states",
        f"{DIST} -k resumes",
    ),
    Mutation(
        "task/tasks.py",
        "columns.append(verified if learned is None else learned)",
        "columns.append(verified)",
        "GRPO --reward-model: the verifier's 0/1 trains, not the reward model's scores",
        f"{GRPO} -k a_learned_reward_scores",
    ),
    Mutation(
        "task/tasks.py",
        "unearned = [verify(t, a) * (1.0 - verify_strict(t, a))",
        "unearned = [verify(t, a) * verify_strict(t, a)",
        "reward/unearned counts the results stated as one, not the ones refused",
        f"{GRPO} -k verifier_option_picks",
    ),
    # ---- grpo_prm.py: DeepSeekMath's process supervision (task/stepwise.py) ---------------------------------------
    Mutation(
        "task/stepwise.py",
        "grouped = step_rewards.reshape(-1, group_size * step_rewards.shape[1])",
        "grouped = step_rewards.reshape(-1, step_rewards.shape[1])",
        "process supervision: step rewards normalised over each completion, not over the group",
        f"{GRPO_PRM} -k process_advantages",
    ),
    Mutation(
        "task/stepwise.py",
        "return dense.flip(1).cumsum(1).flip(1)",
        "return dense.cumsum(1)",
        "process supervision: a token credited with the steps before it, not the ones ending at or after it",
        f"{GRPO_PRM} -k process_advantages",
    ),
    Mutation(
        "task/stepwise.py",
        "centered = centered / (common.masked_mean(centered**2, grouped_mask, dim=1)[:, None].sqrt() + eps)",
        "centered = centered / (grouped.std(dim=1, keepdim=True) + eps)",
        "process supervision: the std over padding step slots too",
        f"{GRPO_PRM} -k process_advantages",
    ),
    Mutation(
        "task/stepwise.py",
        "start = offsets[-1][1] if offsets else 0",
        "start = offsets[-1][0] if offsets else 0",
        "process supervision: each token's characters misplaced, steps end on the wrong tokens",
        f"{GRPO_PRM} -k completion_steps",
    ),
    Mutation(
        "task/stepwise.py",
        "tokenizer.decode([token], skip_special_tokens=True)",
        "tokenizer.decode([token])",
        "process supervision: the EOS token's text counted as part of the last step",
        f"{GRPO_PRM} -k completion_steps",
    ),
    Mutation(
        "grpo_prm.py",
        "advantages = advantages[keep, :width]",
        "advantages = grpo.group_advantages(rewards, G, args.scale_by_std)[keep]",
        "--prm scores the steps but trains on the outcome advantages",
        f"{GRPO_PRM} -k prm_gives_advantages",
    ),
    Mutation(
        "task/stepwise.py",
        "normalised = torch.where(highest <= lowest, 0.0, centered).reshape(step_rewards.shape)",
        "normalised = centered.reshape(step_rewards.shape)",
        "process supervision: a group of equal step scores given the float rounding of their mean as advantages",
        f"{GRPO_PRM} -k equal_step_scores",
    ),
    Mutation(
        "grpo_prm.py",
        "prm, tokenizer, prompts, completion_ids, mask, G, args.scale_by_std",
        "prm, tokenizer, prompts, completion_ids, mask, G",
        "--prm: --no-scale-by-std ignored (the process advantages always divided by the std)",
        f"{GRPO_PRM} -k no_scale_by_std_reaches",
    ),
    Mutation(
        "grpo_prm.py",
        "no_signal = (advantages.view(len(problems), -1) == 0).all(1)",
        "no_signal = (grpo.group_advantages(rewards, G).view(len(problems), -1) == 0).all(1)",
        "--prm --dynamic-sampling: groups dropped on tied outcome rewards although their process advantages differ",
        f"{GRPO_PRM} -k keeps_the_groups_whose_step_scores",
    ),
    Mutation(
        "grpo_prm.py",
        'outcome == (None, ("correct",), None, 0, Args.overlong_penalty),',
        'True or outcome == (None, ("correct",), None, 0, Args.overlong_penalty),',
        "--prm with --reward-model, --rewards, --reward-weights or --overlong-buffer accepted and silently ignored",
        f"{GRPO_PRM} -k bad_arguments",
    ),
    Mutation(
        "grpo_prm.py",
        "args.prm is not None,",
        "True,",
        "grpo_prm.py without --prm not refused (it fails loading no PRM)",
        f"{GRPO_PRM} -k bad_arguments",
    ),
    # ---- the forgetting measure, --dataset as a Hugging Face dataset, KTO's imbalance, the pairs' lengths ----------
    Mutation(
        "task/tasks.py",
        "logits = model(ids[None]).logits[0, :-1].float()",
        "logits = model(ids[None]).logits[0, 1:].float()",
        "general text NLL: each token scored by its own logits, not the previous token's",
        f"{TASKS} -k general_text_nll",
    ),
    Mutation(
        "task/tasks.py",
        'k in ("accuracy", "unearned", "general_nll")',
        'k in ("accuracy", "unearned")',
        "the forgetting measure left out of eval.json's before and after",
        f"{TASKS} -k before_and_after",
    ),
    Mutation(
        "infra/hub.py",
        'number = number.strip().replace(",", "")',
        "number = number.strip()",
        "GSM8K: an answer written 1,000 kept with its comma (the verifier's numbers have none)",
        "tests/test_hub.py -k gsm8k_fields",
    ),
    Mutation(
        "infra/hub.py",
        'loaded = loaded["train"]',
        "loaded = loaded[list(loaded)[-1]]",
        "a dataset's last split (test) read instead of train",
        "tests/test_hub.py -k train_split",
    ),
    Mutation(
        "variants.py",
        "counted[0 : 2 * math.ceil(args.desirable_fraction * len(pairs)) : 2] = True",
        "counted[0::2] = True",
        "KTO --desirable-fraction ignored: every desirable sample counts",
        f"{VARIANTS} -k kto_reference_point_pairs",
    ),
    Mutation(
        "variants.py",
        '"lengths/chosen": lengths[0::2].float().mean().item(),',
        '"lengths/chosen": lengths[1::2].float().mean().item(),',
        "variants: the rejected lengths logged as the chosen ones",
        f"{VARIANTS} -k kto_reference_point_pairs",
    ),
    Mutation(
        "dpo.py",
        '"lengths/chosen": lengths[:, 0].float().mean().item(),',
        '"lengths/chosen": lengths[:, 1].float().mean().item(),',
        "DPO: the rejected lengths logged as the chosen ones",
        f"{DPO} -k lengths_are_logged",
    ),
    # ---- scripts/sensitivity.py: a logged metric, the forgetting column, a shared run --------------------------------
    Mutation(
        "scripts/sensitivity.py",
        "        result[column(key, how)] = logged(run_dir, key, how)",
        "        result[key] = logged(run_dir, key, how)",
        "a study's logged metric stored under its own name (PPO's training kl replaces the KL to the start)",
        "tests/test_compare.py -k named_like",
    ),
    Mutation(
        "scripts/sensitivity.py",
        '"mean": values,',
        '"mean": values[-1:],',
        "sensitivity: a metric's mean over the steps reported as its last value",
        "tests/test_compare.py -k sensitivity_reads",
    ),
    Mutation(
        "scripts/sensitivity.py",
        "quarter = max(1, len(values) // 4)",
        "quarter = len(values) // 4 + 1",
        "sensitivity: a quarter of the steps one step too long (a trend diluted by the middle of the run)",
        "tests/test_compare.py -k sensitivity_reads",
    ),
    Mutation(
        "scripts/sensitivity.py",
        'r["general_nll_after"] - r["general_nll_before"] for r in runs',
        'r["general_nll_before"] - r["general_nll_after"] for r in runs',
        "sensitivity: the general-text NLL change reported with its sign flipped (forgetting would read as gain)",
        "tests/test_compare.py -k sensitivity_table",
    ),
    Mutation(
        "scripts/sensitivity.py",
        "if row_command(other, row) == command",
        "if row_command(other, row)[1:] == command[1:]",
        "sensitivity: a shared run found by its command alone, so a run at another budget is read back as this one",
        "tests/test_compare.py -k run_once",
    ),
    Mutation(
        "scripts/sensitivity.py",
        '        cell = f"{cell} ({len(defined)} of {len(values)} seeds)"',
        "        pass",
        "sensitivity: a claim column averaged over the seeds where it is defined, printed as if over all seeds",
        "tests/test_compare.py -k claim_column",
    ),
    Mutation(
        "scripts/distill_compare.py",
        '            str(run_dir / "model"),\n            args.teacher,',
        '            args.teacher,\n            str(run_dir / "model"),',
        "the student's KL to the teacher measured the wrong way round, on the teacher's samples",
        "tests/test_distill_compare.py -k tiny_model",
    ),
    Mutation(
        "scripts/distill_compare.py",
        "    while rows - max(1, min(64, rows // 10)) < samples:",
        "    while rows - max(1, min(64, rows // 9)) < samples:",
        "the teacher's samples off by sft.py's held-out tenth: the off-policy student trains on another count",
        "tests/test_distill_compare.py -k rows_to_draw",
    ),
    Mutation(
        "scripts/ppo_budget.py",
        "explained is not None and explained > 0 and",
        "explained is not None and",
        "PPO counted as learning while its critic explains nothing",
        "tests/test_ppo_budget.py -k critic_explains",
    ),
    Mutation(
        "scripts/ppo_budget.py",
        "            found = budget\n            break",
        "            found = found or budget",
        "the budget search runs past the first budget where PPO learns",
        "tests/test_ppo_budget.py -k stops",
    ),
    Mutation(
        "task/tools.py",
        'r"\\s*([0-9]+|[-+*x×])"',
        'r"\\s*(\\d+|[-+*x×])"',
        "calculator: any Unicode digit read as a number (int() reads Arabic-Indic digits)",
        "tests/test_grpo_tools.py -k calculator",
    ),
    Mutation(
        "task/tools.py",
        "            if term > MAX_TERM:",
        "            if False:",
        "calculator: the product unbounded (str() raises past 4,300 digits)",
        "tests/test_grpo_tools.py -k calculator",
    ),
    Mutation(
        "grpo_tools.py",
        '    require(distributed.world_size() == 1, "grpo_tools.py does not run under torchrun yet: run it alone")',
        "    pass",
        "tool use: torchrun accepted by a loop that sums no gradient over the ranks",
        "tests/test_options.py -k grpo_tools",
    ),
    Mutation(
        "grpo_tools.py",
        '    "dynamic_sampling",\n',
        "",
        "tool use: --dynamic-sampling accepted and never read",
        "tests/test_options.py -k grpo_tools",
    ),
    Mutation(
        "grpo_prm.py",
        'outcome == (None, ("correct",), None, 0, Args.overlong_penalty)',
        'outcome[:4] == (None, ("correct",), None, 0)',
        "GRPO with a PRM: --overlong-penalty accepted and never read",
        "tests/test_options.py -k grpo_prm",
    ),
    Mutation(
        "ppo_overoptimisation.py",
        'args.policy_loss == "clip" and args.kl_old_target == Args.kl_old_target',
        'args.policy_loss == "clip"',
        "over-optimisation study: --kl-old-target accepted by a loop that only clips",
        "tests/test_options.py -k ppo_overoptimisation",
    ),
    Mutation(
        "infra/runs.py",
        '        compiled_decoding or args.run.decode == "plain",',
        "        True,",
        "--decode compiled accepted by a script whose policy never samples through it",
        "tests/test_options.py -k sft",
    ),
    Mutation(
        "infra/stepmetrics.py",
        '"entropy": distributed.all_sum(self.entropy)}',
        '"entropy": distributed.all_sum(self.entropy) / self.iterations}',
        "GRPO's logged entropy divided by μ though only the first iteration adds it",
        "tests/test_common.py -k micro_batch_sums",
    ),
    Mutation(
        "scripts/prm_vs_orm.py",
        '    return compare.run_once([*command, "--output-dir", str(folder)], folder, out / f"{name}.log")',
        '    done = sorted(folder.glob("*/eval.json"))\n    if done:\n        return done[-1].parent\n'
        '    return compare.run_once([*command, "--output-dir", str(folder)], folder, out / f"{name}.log")',
        "a study stage read back by its folder's name alone, whatever options made it",
        "tests/test_compare.py -k study_stage",
    ),
    Mutation(
        "scripts/iterative_dpo.sh",
        "print(parser.parse_known_args(sys.argv[1:])[0].seed)",
        'print(sys.argv[sys.argv.index("--seed") + 1] if "--seed" in sys.argv else 0)',
        "iterative DPO: --seed=S read as seed 0",
        "tests/test_dpo.py -k iterative",
    ),
    Mutation(
        "grpo_prm.py",
        "                    run.check_finite(loss, step)\n",
        "",
        "a variant's phase named as copied from its reference drifts from it (the NaN guard dropped)",
        "tests/test_layout.py -k copies",
    ),
]


# ---------------------------------------------------------------------------------------------
# Copying the repository, applying a mutation, running pytest
# ---------------------------------------------------------------------------------------------
def repo_files() -> list[Path]:
    """Tracked and untracked (not ignored) .py and .sh files, everything under tests/, and pytest.ini; never runs/ or
    caches."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: the same selection by walking
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()]
    keep = []
    for name in sorted(set(names)):
        parts = Path(name).parts
        if parts[0] in ("runs", ".git") or "__pycache__" in parts or any(p.startswith(".") for p in parts):
            continue
        # .sh: dev/gpu_check.sh; data/: the forgetting measure's text
        wanted = name.endswith((".py", ".sh")) or name == "pytest.ini" or parts[0] in ("tests", "data")
        if wanted and (REPO / name).is_file():
            keep.append(Path(name))
    return keep


def snapshot(dest: Path) -> int:
    """Copy the repository once: every mutation starts from this snapshot, so edits made to the working
    tree while the check runs cannot mix into it."""
    names = repo_files()
    for name in names:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest / name)
    return len(names)


def stale_reason(root: Path, m: Mutation):
    """None if the original snippet occurs exactly once in the file under `root`, else why not."""
    path = root / m.file
    if not path.is_file():
        return f"{m.file} does not exist"
    count = path.read_text(encoding="utf-8").count(m.original)
    if count != 1:
        return f"snippet found {count} times in {m.file}" if count else f"snippet not found in {m.file}"
    return None


RUNNING: set = set()  # the pytest processes started and not yet finished, ended on Ctrl-C
STOPPING = threading.Event()  # set on Ctrl-C: no new pytest starts
START_LOCK = threading.Lock()  # a pytest starts entirely before, or entirely after, a Ctrl-C ends them all


def run_pytest(root: Path, target: str, timeout: float):
    """(return code or None on time-out, seconds, output) of `pytest -x -q <target>` run inside `root`."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "not embedded",
        f"--basetemp={root / '.pytest_tmp'}",
        *shlex.split(target),
    ]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.time()
    with START_LOCK:
        if STOPPING.is_set():
            return None, 0.0, "interrupted"
        # its own process group, so a time-out also ends the scripts it starts
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        RUNNING.add(proc)
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, time.time() - start, output
    except subprocess.TimeoutExpired:
        stop(proc)
        output, _ = proc.communicate()
        return None, time.time() - start, output
    except BaseException:  # Ctrl-C: the run is in its own session, so it must be ended here
        stop(proc)
        raise
    finally:
        RUNNING.discard(proc)


def stop(proc: subprocess.Popen) -> None:
    """End one pytest run we started, with the processes it started (its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def first_failure(output: str) -> str:
    """The first test named in pytest's short summary (FAILED or ERROR), without the file."""
    match = re.search(r"^(?:FAILED|ERROR) \S+::(\S+)", output, re.MULTILINE)
    return match.group(1) if match else ""


def split_target(target: str):
    """'tests/test_x.py -k EXPR' -> ('tests/test_x.py', 'EXPR'); 'tests/test_x.py' -> ('tests/test_x.py', None)."""
    words = shlex.split(target)
    if len(words) == 1:
        return words[0], None
    if len(words) == 3 and words[1] == "-k":
        return words[0], words[2]
    raise ValueError(f"a target is a test file, optionally followed by -k EXPR: {target!r}")


def baseline_targets(targets: list[str]) -> dict[str, str]:
    """One pytest target per test file that selects every test the given targets select."""
    expressions: dict[str, list] = {}
    for target in targets:
        test_file, expression = split_target(target)
        expressions.setdefault(test_file, []).append(expression)
    combined = {}
    for test_file, exprs in sorted(expressions.items()):
        if None in exprs:  # one target runs the whole file
            combined[test_file] = test_file
        else:
            combined[test_file] = (
                f"{test_file} -k {shlex.quote(' or '.join(f'({e})' for e in sorted(set(exprs))))}"
            )
    return combined


def check_mutation(base: Path, work: Path, index: int, m: Mutation, timeout: float) -> dict:
    """Copy the snapshot, apply the one replacement, run the target: KILLED, SURVIVED or ERROR."""
    root = work / f"m{index:02d}"
    shutil.copytree(base, root, ignore=shutil.ignore_patterns("__pycache__", ".pytest_tmp"))
    try:
        path = root / m.file
        path.write_text(path.read_text(encoding="utf-8").replace(m.original, m.mutated, 1), encoding="utf-8")
        rc, seconds, output = run_pytest(root, m.target, timeout)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if rc == 1:
        return {"status": "KILLED", "seconds": seconds, "detail": first_failure(output)}
    if rc == 0:
        return {"status": "SURVIVED", "seconds": seconds, "detail": ""}
    why = f"time-out after {timeout:.0f}s" if rc is None else f"pytest exit status {rc}"
    return {"status": "ERROR", "seconds": seconds, "detail": why, "output": output}


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------
def line(index: int, total: int, status: str, m: Mutation, seconds, detail: str = "") -> str:
    secs = f"{seconds:6.1f}s" if seconds is not None else "      -"
    tail = f"  [{detail}]" if detail else ""
    return f"[{index:2d}/{total}] {status:<8} {m.file:<16} {m.description:<78} {secs}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SUBSTRING",
        help="run only mutations whose 'file: description' contains SUBSTRING (case-insensitive; repeatable)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="mutations run at once (default 1)")
    parser.add_argument(
        "--list",
        action="store_true",
        help="print the mutations and whether each snippet is found, run nothing",
    )
    args = parser.parse_args()

    numbered = list(enumerate(MUTATIONS, 1))
    if args.only:
        wanted = [s.lower() for s in args.only]
        numbered = [
            (i, m) for i, m in numbered if any(w in f"{m.file}: {m.description}".lower() for w in wanted)
        ]
        if not numbered:
            print(f"no mutation matches {args.only}")
            return 0
    total = len(MUTATIONS)

    for m in MUTATIONS:
        split_target(m.target)  # a malformed target fails here, before any work
    repeated = [m for i, m in enumerate(MUTATIONS) if m in MUTATIONS[:i]]
    if repeated:
        print(f"listed twice: {repeated[0].file}: {repeated[0].description}")
        return 1

    if args.list:
        for i, m in numbered:
            reason = stale_reason(REPO, m)
            print(line(i, total, "STALE" if reason else "ok", m, None, reason or ""))
            print(f"{'':8}target: {m.target}")
        stale = sum(stale_reason(REPO, m) is not None for _, m in numbered)
        print(f"{len(numbered)} mutations listed, {stale} stale")
        return 0

    with tempfile.TemporaryDirectory(prefix="mutation-check-") as tmp:
        work = Path(tmp)
        base = work / "base"
        copied = snapshot(base)
        print(f"snapshot of {REPO} in {base}: {copied} files")

        results = {}
        for i, m in numbered:
            reason = stale_reason(base, m)
            if reason:
                results[i] = {"status": "STALE", "seconds": None, "detail": reason}
        runnable = [(i, m) for i, m in numbered if i not in results]

        # Every target must pass on the unmutated snapshot, else a kill would mean nothing. The targets
        # of one test file are run together (one pytest start-up per file, not per target).
        baseline = {}  # test file -> seconds
        by_file = baseline_targets([m.target for _, m in runnable])
        print(f"baseline: the targets of {len(by_file)} test files on the unmutated copy")
        for test_file, target in by_file.items():
            rc, seconds, output = run_pytest(base, target, timeout=1200)
            baseline[test_file] = seconds
            print(f"  {'pass' if rc == 0 else 'FAIL':<4} {seconds:6.1f}s  pytest {target}", flush=True)
            if rc != 0:
                why = "time-out" if rc is None else ("no test matched" if rc == 5 else f"exit status {rc}")
                print(
                    f"\nthe targets fail without any mutation ({why}); fix the tests or the targets first:\n"
                )
                print("\n".join(output.splitlines()[-30:]))
                return 1

        print(f"\n{len(runnable)} mutations to run ({len(results)} stale), {args.jobs} at a time")
        lock = threading.Lock()
        for i, m in numbered:
            if i in results:
                print(line(i, total, "STALE", m, None, results[i]["detail"]), flush=True)

        def one(item):
            i, m = item
            # its whole file's baseline, twice: a slow machine is not a hang
            timeout = max(180.0, 2 * baseline[split_target(m.target)[0]])
            result = check_mutation(base, work, i, m, timeout)
            if STOPPING.is_set():  # ended by Ctrl-C: neither killed nor survived
                return
            with lock:
                results[i] = result
                print(line(i, total, result["status"], m, result["seconds"], result["detail"]), flush=True)
                if result["status"] == "ERROR":
                    print("\n".join("        " + s for s in result["output"].splitlines()[-15:]), flush=True)

        pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs))
        try:
            list(pool.map(one, runnable))
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            with START_LOCK:
                STOPPING.set()
                for proc in list(RUNNING):
                    stop(proc)
            print("\ninterrupted: the summary covers the mutations finished so far", flush=True)
        finally:
            pool.shutdown()

    counts = {
        s: sum(r["status"] == s for r in results.values()) for s in ("KILLED", "SURVIVED", "STALE", "ERROR")
    }
    applied = len(results) - counts["STALE"]
    percent = 100.0 * counts["KILLED"] / applied if applied else 0.0
    print(
        f"\nkilled {counts['KILLED']} of {applied} mutations ({percent:.0f}%)"
        f"; {counts['SURVIVED']} survived, {counts['ERROR']} errors, {counts['STALE']} stale (not counted)"
    )
    for status in ("SURVIVED", "ERROR", "STALE"):
        rows = [(i, MUTATIONS[i - 1]) for i in sorted(results) if results[i]["status"] == status]
        if rows:
            print(f"{status.lower()}:")
            for i, m in rows:
                print(f"  [{i}] {m.file}: {m.description}  (pytest {m.target})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
