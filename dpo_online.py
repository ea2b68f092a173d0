"""Online DPO: the DPO loss on pairs the current policy samples at each step, labelled by the verifier. Copied from
dpo.py unchanged: no phase (its loop samples the pairs that dpo.py reads from a file).

Offline DPO (dpo.py) fits a fixed set of pairs sampled once from the starting model; as the policy
moves away from that model, those pairs say less about what it now writes. Online DPO samples two
completions per prompt from the current policy at every step, lets a judge say which is better, and
takes one DPO step on the fresh pairs. Here the judge is the task's verifier.

Objective (Guo et al. 2024, "Direct Language Model Alignment from Online AI Feedback",
arXiv:2402.04792; TRL's OnlineDPOTrainer with a judge), minimised at step t:
    L(θ) = -E_(x; y_w, y_l ~ π_θt(·|x)) [ log σ( β log π_θ(y_w|x)/π_ref(y_w|x) - β log π_θ(y_l|x)/π_ref(y_l|x) ) ]
that is DPO's eq. 7 (Rafailov et al. 2023) on pairs drawn from π_θt, the policy as it is at step t.
The loss, the concatenated forward and the metrics are dpo.py's, imported; the loop is this file's.

How the loop differs from dpo.py's, and why:
- Each step draws --batch-size problems (the stream grpo.py uses, or --dataset with prompt and
  answer) and samples two completions of each at --temperature. The one the verifier passes is
  chosen, whichever was sampled first; a pair with equal labels (both right, both wrong) states no
  preference and is dropped (pairs/kept, pairs/dropped). A step that keeps no pair makes no update
  and no learning-rate step, but is logged, evaluated and saved like any other.
- The reference is the starting model, held as a frozen copy (with LoRA: the policy with its adapter
  off): the pairs are new at each step, so their reference log-probs cannot be computed ahead.
- The loss reads each pair as text, tokenised again apart from its prompt, at temperature 1, as
  offline DPO reads a dataset's pairs; a sample cut off at --max-new-tokens stays without EOS.
- No held-out pairs: each evaluation is the held-out task accuracy alone.
- The sampler's mismatch (common.mismatch_metrics) is not logged: no forward of this loop reads the
  sampled tokens at the sampling temperature, and measuring it would take a forward of its own.
- One process: no torchrun.

Run:
    python dpo_online.py                              # SmolLM2-135M-Instruct, 8 problems (16 samples) a step
    python dpo_online.py --model tiny --steps 3       # a smoke run: the random model's samples are all wrong
    python dpo_online.py --help

Shapes: P problems, at most P pairs; B = 2P samples, two per problem; T completion tokens.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Annotated, Optional

import torch

import common
from infra import models
from infra import runs
from task import tasks
from dpo import concatenated_logps, dpo_loss, pair_metrics
from common import require


@dataclass
class Args:
    """Online DPO on the arithmetic task: pairs sampled from the policy each step, labelled by the verifier."""

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
    eval_every: int = 0
    """evaluate and save a checkpoint every this many steps (0 = only before and after)"""
    eval_size: Annotated[Optional[int], runs.none_means("200; 16 for the tiny random models", "INT")] = None
    """held-out problems for greedy accuracy (verifier reward)"""
    pass_k: Annotated[Optional[int], runs.none_means("8; 0 (off) for the tiny random models", "INT")] = None
    """pass@k at the first and last evaluation: k samples a held-out problem at temperature 1 (0 = off)"""
    # ---- algorithm: DPO on the policy's own pairs ------------------------------------------------
    steps: int = 60
    """steps, each on --batch-size fresh problems"""
    batch_size: int = 8
    """problems per step; their two samples make a pair where the verifier tells them apart"""
    beta: float = 0.1
    """β: inverse temperature of the implicit reward β log π/π_ref (larger stays closer to the reference)"""
    label_smoothing: float = 0.0
    """ε of conservative DPO: the probability that a pair's label is wrong (0 = plain DPO)"""
    # ---- generation: the two samples per problem -------------------------------------------------
    temperature: float = 0.7
    """sampling temperature of the pairs (evaluation is greedy)"""
    max_new_tokens: int = 32
    """completion length limit when sampling pairs and in evaluation"""
    # ---- optimisation: the optimizer, memory and saving ------------------------------------------
    lr: float = 5e-6
    """AdamW learning rate"""
    warmup_steps: int = 5
    """linear learning-rate warm-up steps"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass to save memory"""
    run: Annotated[runs.RunOptions, runs.FlatFlags] = runs.option_group(runs.RunOptions)
    lora: Annotated[common.LoraOptions, runs.FlatFlags] = runs.option_group(common.LoraOptions)


def sample_pairs(
    policy,
    tokenizer,
    problems: list[tasks.Problem],
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
) -> tuple[list[dict], int]:
    """Two samples per problem from the policy, the one the verifier passes chosen: (pairs, how many problems
    were dropped because both samples got the same label)."""
    device = next(policy.parameters()).device
    eos = tokenizer.eos_token_id
    policy.eval()
    prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in problems], device)
    # (2P, T): rows 2i and 2i + 1 are problem i's two samples; the sampler's log-probs are not needed
    completion_ids, _ = common.sample_with_logprobs(
        policy,
        prompt_ids,
        prompt_mask,
        2,
        max_new_tokens,
        eos,
        tokenizer.pad_token_id,
        temperature,
        1.0,
        generator,
    )
    mask = common.completion_mask(completion_ids, eos)
    texts = tasks.decode_completions(tokenizer, completion_ids, mask)
    finished = (completion_ids == eos).any(1).tolist()  # a sample cut off at max_new_tokens gets no EOS later
    pairs = []
    for i, problem in enumerate(problems):
        first = tasks.verify(texts[2 * i], problem.answer)
        second = tasks.verify(texts[2 * i + 1], problem.answer)
        if first == second:  # both right or both wrong: no preference
            continue
        chosen, rejected = (2 * i, 2 * i + 1) if first > second else (2 * i + 1, 2 * i)
        pairs.append(
            {
                "prompt": problem.prompt,
                "chosen": texts[chosen],
                "rejected": texts[rejected],
                "chosen_finished": finished[chosen],
                "rejected_finished": finished[rejected],
            }
        )
    return pairs, len(problems) - len(pairs)


def check_args(args: Args) -> None:
    runs.check_options(args, at_least_one=("steps", "batch_size", "max_new_tokens", "eval_size"))
    require(args.beta > 0, "--beta must be > 0")
    require(
        0 <= args.label_smoothing < 0.5,
        "--label-smoothing must be in [0, 0.5): it is the probability that a label is wrong",
    )
    require(args.temperature > 0, "--temperature must be > 0 (it samples the pairs)")


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    """Train with online DPO; returns the final metrics (also written to the run folder's eval.json)."""
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    models.set_seed(args.seed)
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    # problems, not pairs: the pairs are sampled from the policy at each step
    train_stream, heldout_problems = tasks.load_problems(
        args.dataset, args.seed, args.eval_size, args.batch_size
    )
    # The reference: the starting model, also when resuming, as a frozen copy; with LoRA, the policy with its
    # adapter off. The pairs are new at each step, so there is nothing to score ahead.
    policy, ref_model = models.load_policy(args, tokenizer, device, precision, kernels_on, resumed, True)
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout_problems), args.max_new_tokens)
    optimizer, scheduler = common.make_optimizer(policy, args.lr, args.weight_decay, args.warmup_steps)
    run = runs.Run(args, "dpo-online", tokenizer, device, resumed)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    run.checkpointed(policy, generator, optimizer=optimizer, scheduler=scheduler)
    # a resumed run's data position: P problems a step
    for _ in range((run.first_step - 1) * args.batch_size):
        next(train_stream)
    evaluate = functools.partial(
        tasks.evaluate_policy, policy, tokenizer, heldout_problems, args.max_new_tokens, args.seed
    )

    run.begin(evaluate)
    for step in range(run.first_step, args.steps + 1):
        # ---- 1. two samples per problem from the policy, labelled by the verifier -----------------
        t0 = time.time()
        pairs, dropped = sample_pairs(
            policy,
            tokenizer,
            [next(train_stream) for _ in range(args.batch_size)],
            args.max_new_tokens,
            args.temperature,
            generator,
        )
        # all labels equal: no update and no scheduler step; logged, evaluated, saved as usual
        if not pairs:
            run.log(step, {"pairs/kept": 0, "pairs/dropped": dropped, "time/step": time.time() - t0})
            run.evaluate(step, evaluate)
            run.save_if_due(step)
            continue

        # ---- 2. log π_ref of the pairs, from the frozen starting model ------------------------------
        with torch.no_grad(), common.reference(policy, ref_model) as ref:
            ref_chosen, ref_rejected, _, _ = concatenated_logps(ref, tokenizer, pairs, None)

        # ---- 3. log π_θ of chosen and rejected in one batch, then the DPO loss ------------------
        policy.train()
        policy_chosen, policy_rejected, lengths, tokens = concatenated_logps(policy, tokenizer, pairs, None)
        losses, chosen_rewards, rejected_rewards = dpo_loss(
            policy_chosen, policy_rejected, ref_chosen, ref_rejected, args.beta, args.label_smoothing
        )
        loss = losses.mean()
        run.check_finite(loss, step)

        # ---- 4. update -------------------------------------------------------------------------
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
        run.check_finite(grad_norm, step, "gradient norm")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # now, not at the next backward: idle through the next forward
        lr = scheduler.get_last_lr()[0]  # the rate this step used
        scheduler.step()

        # ---- 5. log ----------------------------------------------------------------------------------
        step_time = time.time() - t0
        stats = pair_metrics(losses, chosen_rewards, rejected_rewards, policy_chosen, policy_rejected)
        stats.update(
            {
                "grad_norm": grad_norm.item(),
                "lr": lr,
                "time/step": step_time,
                "tokens_per_second": tokens / step_time,  # prompt + completion tokens of the kept pairs
                # y_w systematically shorter or longer than y_l: a length bias the loss can learn instead
                "lengths/chosen": lengths[:, 0].float().mean().item(),
                "lengths/rejected": lengths[:, 1].float().mean().item(),
                "pairs/kept": len(pairs),
                "pairs/dropped": dropped,
            }
        )
        run.log(
            step,
            stats,
            {
                "loss": f"{stats['loss']:.4f}",
                "margin": f"{stats['rewards/margins']:.3f}",
                "kept": f"{len(pairs)}/{args.batch_size}",
            },
        )

        # ---- 6. evaluate and checkpoint ----------------------------------------------------------
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(
        evaluate,
        tasks.before_and_after,
        lambda before, after: f"held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}",
    )


if __name__ == "__main__":
    runs.cli(main, Args)
