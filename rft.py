"""RFT: rejection-sampling fine-tuning, the baseline every RL result must beat, in one file.

Each round samples N completions for each of P training prompts from the current policy, keeps the
ones the verifier accepts, and fine-tunes on them with SFT's loss. Nothing else: no reward model, no
reference, no advantage. When this matches GRPO at the same number of sampled completions, the RL
machinery is not what made the gain.

The method has several names for small differences:
- STaR (Zelikman et al. 2022, arXiv:2203.14465): keep the rationales that reach the right answer,
  fine-tune, repeat (STaR restarts each round from the base model; here the policy carries on).
- RAFT (Dong et al. 2023, arXiv:2304.06767): sample, rank by reward, fine-tune on the best.
- ReST-EM / Expert Iteration (Singh et al. 2023, arXiv:2312.06585; Anthony et al. 2017): an EM view
  with a binary reward; the E-step samples and filters, the M-step is maximum likelihood.
- RFT (Yuan et al. 2023, arXiv:2308.01825) keeps distinct correct paths per problem, as here.

Objective of round r, minimised over the kept set D_r (the M-step):
    D_r = { (x, y) : y ~ π_θr(·|x), y ended with EOS, verifier(y, answer(x)) = 1 },  distinct, at most K per x
    L(θ) = - Σ_(x,y) Σ_t log π_θ(y_t | x, y_<t) / Σ_(x,y) |y|        (a token mean over each batch, as SFT)
Against GRPO: every kept sample pulls its likelihood up by the same amount; nothing pushes a wrong
answer down (no negative signal), and nothing centres the reward (no baseline), so a prompt the
policy already solves N times out of N teaches as much as one it solves once (K caps that).

Where this file departs from the papers, and why:
- A completion cut at --max-new-tokens is never kept, even if the verifier reads a right number
  in it: training on it would teach not to stop.
- The cap K keeps the first K distinct verified completions, in sampling order.
- The policy is not reset to the starting model each round (STaR, ReST-EM do): one optimizer and
  one learning-rate schedule run across the rounds, as RAFT.

Data. The training prompts come from the task's stream (never a held-out problem) or `--dataset` rows
with prompt and a numeric answer (a tenth held out). Each round's kept completions are also written
to the run folder's kept.jsonl (prompt, completion, round): `sft.py --dataset kept.jsonl` trains
another model on them, the rejection-sampling stage of DeepSeek-R1's recipe (scripts/r1_recipe.sh).

Run:
    python rft.py                         # SmolLM2-135M-Instruct (embedded): GRPO's default budget of samples
    python rft.py --model tiny --steps 4 --steps-per-round 2
    python rft.py --model runs/grpo-smollm2-0-<time>/model --steps 8   # rejection sampling from an RL policy

Shapes: P prompts a round, N samples per prompt, B kept rows per step, S prompt tokens, T completion tokens.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass
from typing import Annotated, Callable, Literal, Optional

import torch
from tqdm.auto import tqdm

import common
from infra import models
from infra import runs
from task import tasks
from common import masked_sum, require


@dataclass
class Args:
    """Rejection-sampling fine-tuning on the arithmetic task with the verifier."""

    # ---- experiment: what to train and how it is evaluated -------------------------------------------------------
    model: str = "smollm2"
    """smollm2 (embedded SmolLM2-135M-Instruct), tiny / tiny-gpt2 (random, smoke runs), a hub id or local checkpoint"""
    dataset: Annotated[Optional[str], runs.none_means("the built-in arithmetic task", "FILE|DIR|HUB-ID")] = (
        None
    )
    """JSONL file with fields prompt, answer (numeric), or a Hugging Face dataset: a save_to_disk folder or a Hub id
    (openai/gsm8k: its question and #### answer understood)"""
    seed: int = 0
    """seed for problems, sampling, batch order and initialisation"""
    eval_every: int = 0
    """evaluate held-out accuracy and save a checkpoint every this many steps (0 = only before and after)"""
    eval_size: Annotated[Optional[int], runs.none_means("200; 16 for the tiny random models", "INT")] = None
    """held-out problems for greedy accuracy (verifier reward)"""
    pass_k: Annotated[Optional[int], runs.none_means("8; 0 (off) for the tiny random models", "INT")] = None
    """pass@k at the first and last evaluation: k samples a held-out problem at temperature 1 (0 = off)"""
    verifier: Literal["last-number", "strict"] = "last-number"
    """which verifier keeps a completion: the last number, or strict (only a result stated as one)"""
    # ---- algorithm: the rounds of sampling, filtering and fine-tuning --------------------------------------------
    steps: int = 80
    """optimizer steps in all; a round samples at the start of every --steps-per-round of them (the last
    round may be cut short)"""
    steps_per_round: int = 8
    """optimizer steps on each round's kept set (reshuffled each time it runs out)"""
    prompts_per_round: int = 64
    """training prompts sampled each round (P); the default spends grpo.py's default 5120 samples"""
    samples_per_prompt: int = 8
    """completions sampled per prompt (N)"""
    max_per_prompt: int = 4
    """at most this many distinct verified completions kept per prompt (K)"""
    batch_size: int = 16
    """kept completions per optimizer step"""
    # ---- generation: sampling the completions --------------------------------------------------------------------
    max_new_tokens: int = 32
    """completion length limit, in sampling and evaluation"""
    temperature: float = 1.0
    """sampling temperature"""
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
# The math: the filter and the loss
# ---------------------------------------------------------------------------------------------
def select_verified(
    prompts: list[str],
    completions: list[str],
    verified: list[float],
    finished: list[bool],
    max_per_prompt: int,
) -> list[dict]:
    """The rejection step, (B,) each -> kept rows {prompt, completion}: a completion is kept when the verifier
    accepts it (1.0), it ended with EOS, and its prompt has fewer than `max_per_prompt` distinct ones kept
    already. Sampling order decides which K survive."""
    kept = []
    seen = set()
    per_prompt = {}
    for prompt, completion, reward, done in zip(prompts, completions, verified, finished):
        count = per_prompt.get(prompt, 0)
        if reward != 1.0 or not done or (prompt, completion) in seen or count == max_per_prompt:
            continue
        seen.add((prompt, completion))
        per_prompt[prompt] = count + 1
        kept.append({"prompt": prompt, "completion": completion})
    return kept


def rft_loss(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """L = -Σ_it m_it log π(y_it | x_i, y_i,<t) / Σ_it m_it, SFT's token mean over the batch. (B, T), (B, T) -> ()"""
    return -masked_sum(logprobs, mask) / mask.sum().clamp(min=1)


def kept_logprobs(model, tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(y_t | x, y_<t) of each kept completion's tokens and their mask (EOS included), (B, T) each. The
    prompt is the context, never a target; the completion is tokenised apart from it, as sft.py and dpo.py do."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [r["prompt"] for r in rows], device)
    completion_ids, mask = tasks.tokenize_completions(tokenizer, [r["completion"] for r in rows], device)
    repeats = torch.ones(len(rows), dtype=torch.long, device=device)
    logprobs, _ = common.completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, repeats)
    return logprobs, mask


def check_args(args: Args) -> None:
    runs.check_options(
        args,
        at_least_one=(
            "steps",
            "steps_per_round",
            "prompts_per_round",
            "samples_per_prompt",
            "max_per_prompt",
            "batch_size",
            "max_new_tokens",
            "eval_size",
        ),
        compiled_decoding=False,
    )
    require(args.temperature > 0, "--temperature must be > 0 for sampling (evaluation is always greedy)")


def write_kept(run_dir, rows: list[dict]) -> None:
    """Every round's kept rows so far, as kept.jsonl in the run folder, replaced whole (never half-written)."""
    path = os.path.join(run_dir, "kept.jsonl")
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args, reward_fn: Optional[Callable[[str, str], float]] = None) -> dict:
    """Train with rejection-sampling fine-tuning; returns the final metrics (also in eval.json). reward_fn(completion,
    answer) -> 0/1 decides what is kept (default: --verifier's); held-out accuracy is always the last-number one."""
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    reward_fn = reward_fn or tasks.VERIFIERS[args.verifier]
    models.set_seed(args.seed)
    device = models.resolve_device(args.run.device)
    precision = models.resolve_precision(args.run.precision, device, args.model)
    # the kernels' faster versions: on for a CPU, off for CUDA
    kernels_on = models.resolve_kernels(args.run.kernels, device)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    train_stream, heldout = tasks.load_problems(
        args.dataset, args.seed, args.eval_size, args.prompts_per_round
    )
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
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
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout), args.max_new_tokens)
    if args.gradient_checkpointing:
        policy.activation_checkpointing_enable()
    optimizer, scheduler = common.make_optimizer(policy, args.lr, args.weight_decay, args.warmup_steps)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    # every round's kept rows so far, each with its round: a checkpoint holds them, so a resumed round goes on
    all_kept = resumed["kept"] if resumed else []

    run = runs.Run(args, "rft", tokenizer, device, resumed)  # the run folder, metrics.jsonl, checkpoints
    run.checkpointed(
        policy, generator, optimizer=optimizer, scheduler=scheduler, extra=lambda: {"kept": all_kept}
    )
    # a resumed run's data position: P problems a round begun
    rounds_begun = -(-(run.first_step - 1) // args.steps_per_round)
    for _ in range(rounds_begun * args.prompts_per_round):
        next(train_stream)

    def evaluate(step: int, pass_k: int = 0) -> dict:
        return tasks.evaluate_policy(policy, tokenizer, heldout, args.max_new_tokens, args.seed, step, pass_k)

    def sample_round(round_index: int) -> tuple[list[dict], dict]:
        """Phases 1-2 of a round: sample N per prompt, keep the verified. Returns the kept rows and their stats."""
        # ---- 1. sample N completions per training prompt from the current policy ----------------------
        t0 = time.time()
        problems = [next(train_stream) for _ in range(args.prompts_per_round)]
        policy.eval()
        completions = []
        finished = []
        prompts_per_chunk = max(1, 256 // args.samples_per_prompt)  # 256 sampled rows at a time
        for start in range(0, len(problems), prompts_per_chunk):
            chunk = problems[start : start + prompts_per_chunk]
            prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in chunk], device)
            completion_ids = common.sample_completions(
                policy,
                prompt_ids,
                prompt_mask,
                args.samples_per_prompt,
                args.max_new_tokens,
                tokenizer.eos_token_id,
                tokenizer.pad_token_id,
                args.temperature,
                1.0,
                generator,
            )
            mask = common.completion_mask(completion_ids, tokenizer.eos_token_id)
            completions += tasks.decode_completions(tokenizer, completion_ids, mask)
            finished += (completion_ids == tokenizer.eos_token_id).any(1).tolist()
        time_generate = time.time() - t0

        # ---- 2. keep the completions the verifier accepts (distinct, ended, at most K per prompt) -------
        prompts = [p.prompt for p in problems for _ in range(args.samples_per_prompt)]
        answers = [p.answer for p in problems for _ in range(args.samples_per_prompt)]
        verified = [reward_fn(c, a) for c, a in zip(completions, answers)]
        kept = select_verified(prompts, completions, verified, finished, args.max_per_prompt)
        for row in kept:
            row["round"] = round_index
        stats = {
            "reward": sum(verified) / len(verified),
            "kept": len(kept),
            "kept/fraction": len(kept) / len(completions),
            "kept/prompts_with_any": len({r["prompt"] for r in kept}) / len(problems),
            "completion_truncated": 1 - sum(finished) / len(finished),
            "time/generate": time_generate,
        }
        tqdm.write(f"round {round_index}: kept {len(kept)} of {len(completions)} samples")
        return kept, stats

    run.begin(evaluate)
    for step in range(run.first_step, args.steps + 1):
        t0 = time.time()
        round_index = (step - 1) // args.steps_per_round + 1
        round_stats = {}
        if (step - 1) % args.steps_per_round == 0:  # a round begins: phases 1-2
            sampled_and_kept, round_stats = sample_round(round_index)
            all_kept.extend(sampled_and_kept)
            if run.main:
                write_kept(run.dir, all_kept)
        kept = [r for r in all_kept if r["round"] == round_index]  # a resumed round's too
        # this round's batches, fixed by the seed and the round
        batches = tasks.epoch_batches(
            len(kept), args.batch_size, args.steps_per_round, args.seed + round_index
        )
        stats = {"round": round_index, **round_stats}

        # ---- 3. the NLL of the kept completions, and the update (none if the round kept nothing) ----------
        t1 = time.time()
        if kept:
            policy.train()
            rows = [kept[i] for i in batches[(step - 1) % args.steps_per_round]]
            logprobs, mask = kept_logprobs(policy, tokenizer, rows)
            loss = rft_loss(logprobs, mask)
            run.check_finite(loss, step)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
            run.check_finite(grad_norm, step, "gradient norm")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            stats.update(
                {
                    "loss": loss.item(),
                    "logps/kept": masked_sum(logprobs, mask, dim=1).mean().item(),
                    "completion_length": mask.sum(1).float().mean().item(),
                    "grad_norm": grad_norm.item(),
                    "tokens_per_second/train": mask.sum().item() / (time.time() - t1),
                }
            )
        else:
            stats["skipped"] = 1
        stats["lr"] = scheduler.get_last_lr()[0]  # the rate this step used, or would have
        # torch warns when a skipped first round steps the schedule first; it is meant
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"
            )
            scheduler.step()

        # ---- 4. log, evaluate and checkpoint ----------------------------------------------------------------
        stats["time/step"] = time.time() - t0
        progress = {"round": round_index, "kept": len(kept)}
        if "loss" in stats:
            progress["loss"] = f"{stats['loss']:.4f}"
        run.log(step, stats, progress)
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(
        evaluate,
        lambda before, after: {**tasks.before_and_after(before, after), "kept_total": len(all_kept)},
        lambda before, after: (
            f"held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}; "
            f"{len(all_kept)} completions kept over {-(-args.steps // args.steps_per_round)} rounds"
        ),
    )


if __name__ == "__main__":
    runs.cli(main, Args)
