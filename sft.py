"""SFT: supervised fine-tuning on demonstrations, stage 1 of RLHF, in one file.

Every later stage starts here: InstructGPT (Ouyang et al. 2022, arXiv:2203.02155, §3.5) fine-tunes
the pretrained model on human demonstrations first, and that SFT model is both the starting
policy and the frozen reference of the reward model, PPO, DPO and GRPO. A base model that has
never seen the task's answer format rarely produces a correct, short answer, so nearly every GRPO
group has zero reward variance and nothing is learned; a few hundred SFT steps fix that.

Objective, minimised: the negative log-likelihood of the completion tokens only (prompt tokens
are context, not targets; the EOS that ends the completion is a target: ending is learned too),
averaged over every completion token of the batch:
    L(θ) = - Σ_i Σ_t m_it log π_θ(y_it | x_i, y_i,<t) / Σ_i Σ_t m_it
This is TRL's SFTTrainer with completion-only loss: a token mean over the batch, so a long
completion weighs more than a short one (a per-sequence mean would weigh every example equally).

Data. By default, demonstrations generated from the task: the correct, short worked answer to each
of `--num-demonstrations` training problems (`47 + 38 = 85`, tasks.demonstration), never one of
the `--eval-size` held-out problems the accuracy is measured on (nor of the default 200, so the
demonstrations are the same at any --eval-size up to 200). `--dataset demos.jsonl` with TRL's
fields prompt, completion trains on your own. Either way a tenth (at most 64) is held out for
`eval/loss`. Prompts get the chat template (or the plain `Question: ...\\nAnswer:` with
`--prompt-format plain`); completions are tokenised apart from the prompt and end with EOS,
exactly as DPO's pairs are.

Run:
    python sft.py                        # SmolLM2-135M-Instruct (embedded), demonstrations of the task
    python sft.py --prompt-format plain  # as a base model without a chat template meets the task
    python sft.py --model tiny --steps 3
    python grpo.py --model runs/sft-smollm2-0-<time>/model   # then RL from the SFT model

Shapes: B demonstrations per step, S prompt tokens, T completion tokens, V vocabulary.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Annotated, Optional

import torch
from tqdm.auto import tqdm

import common
from infra import distributed
from infra import fsdp
from infra import models
from infra import runs
from task import tasks
from common import InputError, masked_mean, masked_sum


@dataclass
class Args:
    """Supervised fine-tuning on demonstrations (prompt, completion)."""

    # ---- experiment: what to train and how it is evaluated -------------------------------------------------------
    model: str = "smollm2"
    """smollm2 (embedded SmolLM2-135M-Instruct), tiny / tiny-gpt2 (random, smoke runs), a hub id or local checkpoint"""
    dataset: Annotated[
        Optional[str], runs.none_means("demonstrations of the arithmetic task", "FILE|DIR|HUB-ID")
    ] = None
    """JSONL file with fields prompt, completion, or a Hugging Face dataset: a save_to_disk folder or a Hub id
    (openai/gsm8k: its worked answer is the completion)"""
    seed: int = 0
    """seed for data, batch order and initialisation"""
    eval_every: int = 0
    """evaluate and save a checkpoint every this many steps (0 = only before and after)"""
    eval_size: Annotated[Optional[int], runs.none_means("200; 16 for the tiny random models", "INT")] = None
    """held-out problems for greedy accuracy (verifier reward)"""
    pass_k: Annotated[Optional[int], runs.none_means("8; 0 (off) for the tiny random models", "INT")] = None
    """pass@k at the first and last evaluation: k samples a held-out problem at temperature 1 (0 = off)"""
    # ---- algorithm: the demonstrations and the likelihood --------------------------------------------------------
    steps: int = 100
    """optimizer steps; the demonstrations are reshuffled each time they run out"""
    batch_size: int = 16
    """demonstrations per optimizer step"""
    num_demonstrations: int = 2000
    """distinct training problems turned into demonstrations (without --dataset)"""
    max_completion_tokens: int = 256
    """completions longer than this are cut (they then end without EOS)"""
    max_new_tokens: int = 32
    """completion length limit in the held-out evaluation (greedy)"""
    # ---- optimisation: the optimizer, memory and saving ----------------------------------------------------------
    lr: float = 1e-5
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


# ---------------------------------------------------------------------------------------------
# The math: the loss, and the forward that feeds it
# ---------------------------------------------------------------------------------------------
def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """L = -Σ_it m_it log π(y_it | x_i, y_i,<t) / Σ_it m_it: the mean NLL over every completion token of
    the batch (a token mean, as TRL; not a mean of per-sequence means). (B, T), (B, T) -> ()"""
    return -masked_sum(logprobs, mask) / mask.sum().clamp(min=1)


def completion_logprobs_and_hits(
    model, prompt_ids, prompt_mask, completion_ids
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(y_t | x, y_<t) of every completion token and whether it was the model's argmax, (B, T) and (B, T) bool.

    One forward over [left-padded prompt | right-padded completion]; logits are kept only where they
    predict a completion token (the last prompt position predicts y_1), so prompt tokens are never
    targets. Positions come from the attention mask: the amount of prompt padding changes nothing.
    """
    T = completion_ids.shape[1]
    # completion padding is masked in the loss
    full_mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)  # (B, S+T)
    with common.autocast(model):
        # (B, T+1, V) predicts y_1..y_T, then nothing
        logits = model(
            input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
            attention_mask=full_mask,
            position_ids=common.position_ids(full_mask),
            logits_to_keep=T + 1,
        ).logits
    logprobs = common.gather_logprobs(logits, completion_ids, common.kernels_on(model))
    return logprobs, logits[:, :-1].argmax(-1) == completion_ids


def batch_logprobs(model, tokenizer, rows: list[dict], max_completion_tokens: int):
    """Tokenise (prompt, completion) rows (prompt with its template; completion apart, + EOS) and score them."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [r["prompt"] for r in rows], device)
    completion_ids, mask = tasks.tokenize_completions(
        tokenizer, [r["completion"] for r in rows], device, max_completion_tokens
    )
    logprobs, hits = completion_logprobs_and_hits(model, prompt_ids, prompt_mask, completion_ids)
    return logprobs, hits, mask, int(prompt_mask.sum() + mask.sum())


def load_demonstrations(
    dataset: Optional[str], num_demonstrations: int, seed: int, eval_size: int
) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) of {prompt, completion}: the task's own demonstrations (distinct
    training problems, never one of the `eval_size` accuracy problems: tasks.training_exclusion) or
    the user's JSONL; shuffled by the seed, a tenth (at most 64) held out."""
    if dataset is None:
        rows = []
        seen = set()
        for p in tasks.train_problems(seed, tasks.training_exclusion(eval_size)):
            if p.prompt not in seen:
                seen.add(p.prompt)
                rows.append({"prompt": p.prompt, "completion": tasks.demonstration(p)})
            if len(rows) == num_demonstrations:
                break
    else:
        rows = tasks.read_rows(dataset, ("prompt", "completion"))
        random.Random(seed).shuffle(rows)
    n_heldout = max(1, min(64, len(rows) // 10))
    if len(rows) - n_heldout < 1:
        raise InputError(
            f"{dataset or '--num-demonstrations'}: {len(rows)} demonstrations; need at least 2 (one is held out)"
        )
    return rows[n_heldout:], rows[:n_heldout]


def check_args(args: Args) -> None:
    runs.check_options(
        args,
        at_least_one=(
            "steps",
            "batch_size",
            "num_demonstrations",
            "max_completion_tokens",
            "max_new_tokens",
            "eval_size",
        ),
        divided_over_ranks="batch_size",
        compiled_decoding=False,
    )


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    """Train with SFT; returns the final metrics (also written to the run folder's eval.json)."""
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    models.set_seed(args.seed)
    device = models.resolve_device(args.run.device)
    precision = models.resolve_precision(args.run.precision, device, args.model)
    # the kernels' faster versions: on for a CPU, off for CUDA
    kernels_on = models.resolve_kernels(args.run.kernels, device)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    train_rows, heldout_rows = load_demonstrations(
        args.dataset, args.num_demonstrations, args.seed, args.eval_size
    )
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    heldout_problems = tasks.heldout_problems(args.eval_size)
    policy = models.load_model(
        args.run.resume + "/model" if resumed else args.model,
        len(tokenizer),
        device,
        precision,
        args.seed,
        keep_adapter=bool(resumed),
        kernels_on=kernels_on,
    )
    if args.lora.lora_r and not resumed:
        policy = common.add_lora(policy, args.model, args.lora)
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout_problems), args.max_new_tokens)
    if args.gradient_checkpointing:
        policy.activation_checkpointing_enable()
    fsdp.shard(args.run.fsdp, policy)  # --fsdp: 1/N of each model's weights on a rank
    optimizer, scheduler = common.make_optimizer(policy, args.lr, args.weight_decay, args.warmup_steps)
    # a longer run appends
    batches = tasks.epoch_batches(len(train_rows), args.batch_size, args.steps, args.seed)
    # prompt + completion tokens seen so far, as TRL counts them
    num_tokens = resumed["num_tokens"] if resumed else 0
    run = runs.Run(
        args,
        "sft",
        tokenizer,
        device,
        resumed,
        eval_row=lambda r: {
            "accuracy": r["accuracy"],
            "eval/loss": r["eval/loss"],
            "eval/mean_token_accuracy": r["eval/mean_token_accuracy"],
        },
    )
    # the data position is the step: batches[step:] come next
    run.checkpointed(
        policy, optimizer=optimizer, scheduler=scheduler, extra=lambda: {"num_tokens": num_tokens}
    )

    @torch.no_grad()
    def evaluate(step: int, pass_k: int = 0) -> dict:
        """Held-out greedy task accuracy (the number every algorithm reports) and the held-out demonstrations' loss."""
        result = tasks.evaluate_policy(
            policy, tokenizer, heldout_problems, args.max_new_tokens, args.seed, step, pass_k
        )
        nll = hits = tokens = 0.0
        for start in range(0, len(heldout_rows), 32):
            rows = heldout_rows[start : start + 32]
            logprobs, hit, mask, _ = batch_logprobs(policy, tokenizer, rows, args.max_completion_tokens)
            nll = nll - masked_sum(logprobs, mask).item()
            hits = hits + masked_sum(hit.float(), mask).item()
            tokens += mask.sum().item()
        result.update({"eval/loss": nll / tokens, "eval/mean_token_accuracy": hits / tokens})
        tqdm.write(
            f"step {step}: held-out demonstrations: loss {result['eval/loss']:.4f}, "
            f"token accuracy {result['eval/mean_token_accuracy']:.3f}"
        )
        return result

    run.begin(evaluate)
    for step, batch in enumerate(batches[run.first_step - 1 :], run.first_step):
        t0 = time.time()

        # ---- 1. log π_θ of each demonstration's completion tokens -----------------------------------
        policy.train()
        rows = [train_rows[i] for i in distributed.share(batch)]  # under torchrun, B/N on a rank
        logprobs, hits, mask, tokens = batch_logprobs(policy, tokenizer, rows, args.max_completion_tokens)

        # ---- 2. the NLL of the completion tokens, and the update ----------------------------------
        share = distributed.share_of(mask.sum())  # this rank's part of the batch's tokens: 1.0 in one process
        # so that Σ over the ranks is the token mean over the whole batch
        loss = sft_loss(logprobs, mask) * share
        run.check_finite(loss, step)
        loss.backward()
        distributed.all_reduce_grads(policy)  # Σ over the ranks
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
        run.check_finite(grad_norm, step, "gradient norm")
        optimizer.step()
        # now, not at the next backward: the model's size in float32, idle through the next forward
        optimizer.zero_grad(set_to_none=True)
        lr = scheduler.get_last_lr()[0]  # the rate this step used
        scheduler.step()

        # ---- 3. log (TRL's names) --------------------------------------------------------------------
        # prompt + completion tokens seen so far, as TRL counts them
        num_tokens += distributed.all_sum(tokens)
        step_time = time.time() - t0
        stats = {
            "loss": distributed.all_sum(loss.item()),
            # argmax hit
            "mean_token_accuracy": distributed.all_sum(masked_mean(hits.float(), mask).item() * share),
            "num_tokens": num_tokens,
            "completion_length": mask.sum(1).float().mean().item(),
            "grad_norm": grad_norm.item(),
            "lr": lr,
            "time/step": step_time,
            "tokens_per_second": tokens / step_time,
        }
        stats = distributed.mean_over_ranks(stats)  # equal shares, or the same number on every rank
        run.log(step, stats, {"loss": f"{stats['loss']:.4f}", "acc": f"{stats['mean_token_accuracy']:.3f}"})

        # ---- 4. evaluate and checkpoint --------------------------------------------------------------
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(
        evaluate,
        lambda before, after: {
            **tasks.before_and_after(before, after),
            "eval_loss_before": before["eval/loss"],
            "eval_loss_after": after["eval/loss"],
            "demonstrations_train": len(train_rows),
            "demonstrations_heldout": len(heldout_rows),
        },
        lambda before, after: (
            f"held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}; "
            f"held-out demonstration loss {before['eval/loss']:.4f} -> {after['eval/loss']:.4f}"
        ),
    )


if __name__ == "__main__":
    runs.cli(main, Args)
