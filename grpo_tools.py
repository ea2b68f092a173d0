"""GRPO with a tool across turns: the model may call a calculator, the environment appends its result, and the model
goes on until it answers. A variant of grpo.py: its loop, copied, with phases 1 and 2 changed (sampling across turns,
the reward on the model's own final words) and the evaluation using the tool; the loss is grpo.py's, and the options
of grpo.py this loop does not read are refused (NOT_READ). Copied from grpo.py unchanged: no phase (each reads the
transcripts' tokens, and the loop runs in one process; tests/test_layout.py checks what a variant says it copies).

A completion is a transcript of the model's tokens and the environment's:
    <calc>347 + 589 + 1024</calc>   <result>1960</result>    The answer is 1960.<eos>
    └─ the model's (sampled) ─────┘ └─ the environment's ─┘ └─ the model's ──────────┘
The environment's tokens are context, not policy: they are excluded from the loss, the KL, the entropy and the token
counts that normalise the loss (`policy_mask` is the mask every one of them reads), and the sampler's log-probs and
the trainer's agree on exactly the model's tokens. The trainer scores the whole transcript in one forward; the
sampler drew the model's tokens turn by turn, each turn from the prompt and the transcript so far.

A turn ends at the model's EOS, at its budget (--max-new-tokens model tokens in all), or at the token that closes a
call (`</calc>`, kept whole); after at most --max-calls calls the next call gets no result and the transcript ends.
The reward is the verifier's on the model's text after the last result: the environment's number is not an answer.

Run:
    python scripts/tool_demonstrations.py --out tools.jsonl        # the task's own worked uses of the tool
    python sft.py --dataset tools.jsonl --steps 100                # the cold start: prints its run folder
    python grpo_tools.py --model runs/sft-tools-0-<time>/model
    python grpo_tools.py --model tiny --steps 3
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

import common
import grpo
from infra import distributed
from infra import models
from infra import runs
from infra import stepmetrics
from task import tasks, tools
from common import require


@dataclass
class Args(grpo.Args):
    """GRPO on sums of three 3- and 4-digit numbers with a calculator the model may call."""

    max_new_tokens: int = 48
    """the model's own tokens in a transcript, every turn together (the environment's are not counted)"""
    max_calls: int = 2
    """calculator calls answered in one transcript; a call past them ends it (0: the calculator is off)"""
    pass_k: int = 0
    """0 only: pass@k is not measured with the tool"""


# grpo.py's options that shape its problems, its reward or its batch, which this loop does not read
NOT_READ = (
    "dataset",
    "prompt_style",
    "reward_model",
    "rewards",
    "reward_weights",
    "dynamic_sampling",
    "mask_truncated_completions",
    "overlong_buffer",
    "overlong_penalty",
    "pass_k",
)


def check_args(args: Args) -> None:
    grpo.check_args(args)
    require(args.max_calls >= 0, f"--max-calls must be 0 (the calculator off) or more, not {args.max_calls}")
    require(distributed.world_size() == 1, "grpo_tools.py does not run under torchrun yet: run it alone")
    changed = [
        f"--{name.replace('_', '-')}" for name in NOT_READ if getattr(args, name) != getattr(Args(), name)
    ]
    require(not changed, f"the tool task has its own problems, reward and batch: drop {' '.join(changed)}")


# ---------------------------------------------------------------------------------------------
# Sampling across turns
# ---------------------------------------------------------------------------------------------
@dataclass
class Transcript:
    """One completion across turns: its tokens, which of them the model wrote, their sampler log-probs."""

    tokens: list
    policy: list  # 1 on the model's tokens, 0 on the environment's
    logprobs: list  # the sampler's, 0.0 on the environment's tokens
    calls: int = 0
    errors: int = 0  # calls the calculator could not read
    finished: bool = False
    last_turn: str = ""  # the model's text since the last result: what the verifier reads


def cut_at_call(tokenizer, tokens: list[int]) -> int:
    """How many of a turn's tokens to keep: up to and with the token that closes the first `</calc>`, else all."""
    text = ""
    for i, token in enumerate(tokens):
        text = text + tokenizer.decode([token])
        if tools.CALL_END in text:
            return i + 1
    return len(tokens)


def sample_with_tool(
    policy, tokenizer, prompt_ids, prompt_mask, group_size: int, args, generator, temperature: float
) -> list[Transcript]:
    """G transcripts of each prompt (P·G, in prompt order), each sampled turn by turn with the tool's results in
    between: a turn samples every unfinished row from its prompt and transcript so far (left-padded)."""
    eos = tokenizer.eos_token_id
    prompts = [row[mask.bool()].tolist() for row, mask in zip(prompt_ids, prompt_mask)]
    prompts = [p for p in prompts for _ in range(group_size)]
    transcripts = [Transcript([], [], []) for _ in prompts]
    while True:
        active = [i for i, t in enumerate(transcripts) if not t.finished]
        if not active:
            return transcripts
        budgets = [args.max_new_tokens - sum(transcripts[i].policy) for i in active]
        contexts = [prompts[i] + transcripts[i].tokens for i in active]
        width = max(len(c) for c in contexts)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(c)) + c for c in contexts])
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        device = prompt_ids.device
        sampled, logprobs = common.sample_with_logprobs(
            policy,
            ids.to(device),
            mask.to(device),
            1,
            max(budgets),
            eos,
            tokenizer.pad_token_id,
            temperature,
            args.top_p,
            generator,
        )
        turn_mask = common.completion_mask(sampled, eos)  # (rows, T), EOS included
        for row, i in enumerate(active):
            transcript = transcripts[i]
            tokens = sampled[row][turn_mask[row].bool()].tolist()[: budgets[row]]
            keep = cut_at_call(tokenizer, tokens)
            called = keep < len(tokens) or (keep > 0 and tools.CALL_END in tokenizer.decode(tokens[:keep]))
            transcript.tokens += tokens[:keep]
            transcript.policy += [1] * keep
            transcript.logprobs += logprobs[row, :keep].tolist()
            transcript.last_turn = tokenizer.decode(tokens[:keep], skip_special_tokens=True)
            out_of_budget = sum(transcript.policy) >= args.max_new_tokens
            if not called or eos in tokens[:keep] or transcript.calls == args.max_calls or out_of_budget:
                transcript.finished = True
                continue
            result = tools.tool_result(transcript.last_turn)
            environment = tokenizer(result, add_special_tokens=False).input_ids
            transcript.tokens += environment
            transcript.policy += [0] * len(environment)
            transcript.logprobs += [0.0] * len(environment)
            transcript.calls += 1
            transcript.errors += "error" in result


def transcript_tensors(transcripts: list[Transcript], pad: int, device) -> tuple[torch.Tensor, ...]:
    """completion_ids, policy_mask (1 on the model's tokens) and the sampler's log-probs, (B, T) each, right-padded."""
    width = max(1, max(len(t.tokens) for t in transcripts))
    ids = torch.full((len(transcripts), width), pad, dtype=torch.long)
    policy_mask = torch.zeros(len(transcripts), width, dtype=torch.long)
    logprobs = torch.zeros(len(transcripts), width)
    for row, t in enumerate(transcripts):
        ids[row, : len(t.tokens)] = torch.tensor(t.tokens, dtype=torch.long)
        policy_mask[row, : len(t.policy)] = torch.tensor(t.policy, dtype=torch.long)
        logprobs[row, : len(t.logprobs)] = torch.tensor(t.logprobs)
    return ids.to(device), policy_mask.to(device), logprobs.to(device)


def tool_stats(transcripts: list[Transcript]) -> dict:
    """The share of transcripts that call the tool, calls per transcript, and the share of calls well-formed."""
    calls = sum(t.calls for t in transcripts)
    return {
        "tool/use": sum(t.calls > 0 for t in transcripts) / len(transcripts),
        "tool/calls": calls / len(transcripts),
        "tool/well_formed": 1 - sum(t.errors for t in transcripts) / calls if calls else float("nan"),
    }


@torch.no_grad()
def evaluate_with_tool(policy, tokenizer, heldout, args, step: int, pass_k: int = 0) -> dict:
    """Greedy held-out accuracy with the tool (the verifier on the model's final words), and how it used the tool."""
    policy.eval()
    transcripts = []
    for start in range(0, len(heldout), 64):
        batch = heldout[start : start + 64]
        ids, mask = tasks.tokenize_prompts(
            tokenizer, [p.prompt for p in batch], next(policy.parameters()).device
        )
        transcripts += sample_with_tool(policy, tokenizer, ids, mask, 1, args, None, 0.0)
    right = [tasks.verify(t.last_turn, p.answer) for t, p in zip(transcripts, heldout)]
    samples = [
        {
            "prompt": p.prompt,
            "answer": p.answer,
            "completion": tokenizer.decode(t.tokens, skip_special_tokens=True),
        }
        for p, t in list(zip(heldout, transcripts))[:8]
    ]
    result = {"accuracy": sum(right) / len(right), "samples": samples, **tool_stats(transcripts)}
    print(f"step {step}: held-out accuracy {result['accuracy']:.3f} with the tool ({len(heldout)} problems)")
    return result


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args, reward_fn: Optional[Callable[[str, str], float]] = None) -> dict:
    """Train with GRPO and the calculator; returns the final metrics (also in eval.json). reward_fn(text, answer)
    reads the model's text after the last result (default: --verifier's)."""
    args = tasks.evaluation_for_model(args)  # --eval-size, if unset, scaled to the model
    check_args(args)
    reward_fn = reward_fn or tasks.VERIFIERS[args.verifier]
    models.set_seed(args.seed)
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    heldout = tasks.heldout_problems(args.eval_size, make=tools.make_tool_problem)
    train_stream = tasks.train_problems(args.seed, heldout, make=tools.make_tool_problem)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    policy, ref_model = models.load_policy(
        args, tokenizer, device, precision, kernels_on, resumed, args.beta != 0
    )
    optimizer, scheduler = common.make_optimizer(
        policy, args.lr, args.weight_decay, args.warmup_steps, args.steps if args.lr_decay else 0
    )
    # each rank its own draws
    generator = torch.Generator(device=device).manual_seed(args.seed + distributed.rank())
    G = args.group_size

    # the run folder, metrics.jsonl, checkpoints
    run = runs.Run(
        args,
        "grpo-tools",
        tokenizer,
        device,
        resumed,
        eval_row=lambda r: {k: r[k] for k in ("accuracy", "tool/use", "tool/calls", "tool/well_formed")},
    )
    run.checkpointed(policy, generator, optimizer=optimizer, scheduler=scheduler)
    # a resumed run's data position: P problems a step
    train_stream = itertools.islice(train_stream, (run.first_step - 1) * args.prompts_per_step, None)
    evaluate = functools.partial(evaluate_with_tool, policy, tokenizer, heldout, args)

    run.begin(evaluate)
    for step in range(run.first_step, args.steps + 1):
        # ---- 1. sample G transcripts per prompt, the calculator answering each call ---------------------
        t0 = time.time()
        problems = [next(train_stream) for _ in range(args.prompts_per_step)]
        prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in problems], device)
        policy.eval()
        transcripts = sample_with_tool(
            policy, tokenizer, prompt_ids, prompt_mask, G, args, generator, args.temperature
        )
        completion_ids, mask, sampler_logprobs = transcript_tensors(
            transcripts, tokenizer.pad_token_id, device
        )
        time_generate = time.time() - t0

        # ---- 2. the verifier on the model's final words ----------------------------------------------------
        answers = [p.answer for p in problems for _ in range(G)]
        rewards = torch.tensor(
            [reward_fn(t.last_turn, a) for t, a in zip(transcripts, answers)], device=device
        )
        runs.check_rewards(rewards[:, None], step)

        # ---- 3. group-relative advantages -------------------------------------------------------
        advantages = grpo.group_advantages(rewards, G, args.scale_by_std)  # (B,)
        grouped = rewards.view(-1, G)
        stats = {
            "reward": rewards.mean().item(),
            "frac_reward_zero_std": (grouped.amax(1) == grouped.amin(1)).float().mean().item(),
            "completion_length": mask.sum(1).float().mean().item(),  # the model's tokens only
            "transcript_length": sum(len(t.tokens) for t in transcripts) / len(transcripts),
            "time/generate": time_generate,
            **tool_stats(transcripts),
        }
        B = completion_ids.shape[0]
        t1 = time.time()

        # ---- 4. old and reference log-probs, once per batch -------------------------------------
        # the batch's rows: each prompt once, and its G transcripts; the environment's tokens are context only
        sequences = (prompt_ids, prompt_mask, completion_ids)
        micro = min(args.batch_size or B, B)
        slices = [slice(i, min(i + micro, B)) for i in range(0, B, micro)]
        batch_tokens = mask.sum()  # the model's tokens: the loss's normaliser
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
                weight = grpo.micro_batch_weight(args.loss_agg, mask[s], int(batch_tokens), B)
                (loss * weight).backward()
                # kl, clip_ratio: token means over the whole batch; the entropy logged: iteration 0's, the sampler's
                sums.add(m, mask[s], loss, weight, entropy)
                if iteration == 0:  # π_θold's log-probs, to hold against the sampler's
                    trainer_logprobs.append(old)
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
            run.check_finite(grad_norm, step, "gradient norm")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)  # now, not at the next backward: idle through sampling
        # the rate this step used
        stats["lr"] = scheduler.get_last_lr()[0]
        scheduler.step()
        time_train = time.time() - t1

        # ---- 6. log -------------------------------------------------------------------------------
        stats.update(sums.totals())
        # the sampler against the trainer, at the model's tokens only
        stats.update(common.mismatch_metrics(torch.cat(trainer_logprobs), sampler_logprobs, mask))
        stats["grad_norm"] = grad_norm.item()
        stats["time/train"] = time_train
        stats["time/step"] = time.time() - t0
        run.log(step, stats, ("reward", "tool/use", "kl"))

        # ---- 7. evaluate and checkpoint -----------------------------------------------------------
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(
        evaluate,
        lambda before, after: {
            **tasks.before_and_after(before, after),
            **{
                f"{k}_{when}": r[k]
                for k in ("tool/use", "tool/well_formed")
                for when, r in (("before", before), ("after", after))
            },
        },
    )


if __name__ == "__main__":
    runs.cli(main, Args)
