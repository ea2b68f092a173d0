"""On-policy distillation: the student samples, the teacher scores the student's own tokens, and the student moves
towards the teacher there, in one file.

Off-policy distillation (SFT on the teacher's samples) trains the student on states the teacher visits; at test
time the student meets its own, where its mistakes compound. On-policy distillation trains on the student's own
samples, with a per-token signal from the teacher at every token: the reward of RL, but dense.

    y ~ π_S(·|x)                                                     the student samples (no gradient through it)
    reverse-kl (default; Thinking Machines' on-policy distillation, 2025, and GKD with β = 1):
        A_t = log π_T(y_t | x, y_<t) - log π_S(y_t | x, y_<t)        minus the sampled token's reverse KL, detached
        L   = -Σ_t A_t log π_S(y_t | x, y_<t) / Σ_t 1                a policy gradient with a dense advantage
    jsd (GKD, Agarwal et al. 2024, arXiv:2306.13649, eq. 1, over the full vocabulary at every sampled position):
        L   = Σ_t JSD_β(π_T(·|x, y_<t) ‖ π_S(·|x, y_<t)) / Σ_t 1
        JSD_β(P ‖ Q) = β KL(P ‖ M) + (1 - β) KL(Q ‖ M),  M = β P + (1 - β) Q;  β = 0: KL(P ‖ Q), β = 1: KL(Q ‖ P)

Conventions a reader could get wrong (each pinned by a test):
- The KL is taken on the student's samples, never the teacher's: log π_S(y) - log π_T(y) estimates KL(π_S ‖ π_T)
  without bias only when y ~ π_S (on the teacher's samples it estimates -KL(π_T ‖ π_S)).
- Reverse KL, KL(π_S ‖ π_T), is mode-seeking: the student is pushed off what the teacher finds unlikely. Forward
  KL, KL(π_T ‖ π_S), is what SFT on the teacher's samples minimises (mode-covering).
- Both log-probs use the sampling temperature; the teacher's are computed on exactly the student's tokens.
- The advantage is per token and not summed over the future: each token answers for its own divergence.

The teacher is any checkpoint the scripts write (an SFT or a GRPO run) with the student's tokenizer; it is
frozen and only scores. Held-out accuracy uses the verifier, as every script.

Run:
    python sft.py                                                  # the teacher first: prints its run folder
    python distill.py --teacher runs/sft-smollm2-0-<time>/model    # the embedded model learns from it
    python distill.py --loss jsd --beta 0.5 --teacher ...
    python distill.py --model tiny --teacher <a tiny sft.py run>/model --steps 3

Shapes: P prompts a step, N samples per prompt, B = P·N rows, S prompt tokens, T completion tokens, V vocabulary.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Annotated, Literal, Optional

import torch

import common
from infra import models
from infra import runs
from task import tasks
from common import masked_mean, require


@dataclass
class Args:
    """On-policy distillation from a teacher checkpoint on the arithmetic task."""

    # ---- experiment: what to train and how it is evaluated -------------------------------------------------------
    model: str = "smollm2"
    """the student: smollm2 (embedded), tiny / tiny-gpt2 (random, smoke runs), a hub id or local checkpoint"""
    teacher: Annotated[Optional[str], runs.none_means("required", "DIR")] = None
    """the teacher: a checkpoint the scripts write (<run folder>/model), with the student's tokenizer"""
    dataset: Annotated[Optional[str], runs.none_means("the built-in arithmetic task", "FILE|DIR|HUB-ID")] = (
        None
    )
    """JSONL file with fields prompt, answer, or a Hugging Face dataset (the prompts; the answers only evaluate)"""
    seed: int = 0
    """seed for problems, sampling and initialisation"""
    eval_every: int = 10
    """evaluate held-out accuracy and save a checkpoint every this many steps (0 = only before and after)"""
    eval_size: Annotated[Optional[int], runs.none_means("200; 16 for the tiny random models", "INT")] = None
    """held-out problems for greedy accuracy (verifier reward)"""
    pass_k: Annotated[Optional[int], runs.none_means("8; 0 (off) for the tiny random models", "INT")] = None
    """pass@k at the first and last evaluation: k samples a held-out problem at temperature 1 (0 = off)"""
    # ---- algorithm: the divergence -------------------------------------------------------------------------------
    loss: Literal["reverse-kl", "jsd"] = "reverse-kl"
    """reverse-kl: the sampled token's reverse KL as a per-token advantage; jsd: GKD's generalized JSD over the
    full vocabulary at each sampled position"""
    beta: float = 0.5
    """β of --loss jsd: 0 is the forward KL(π_T ‖ π_S), 1 the reverse KL(π_S ‖ π_T)"""
    steps: int = 40
    """optimizer steps, each on freshly sampled completions"""
    prompts_per_step: int = 16
    """training prompts sampled each step (P)"""
    samples_per_prompt: int = 4
    """completions the student samples of each prompt (N); P·N = 64 a step, 2,560 in a default run"""
    # ---- generation: sampling the completions --------------------------------------------------------------------
    max_new_tokens: int = 32
    """completion length limit, in sampling and evaluation"""
    temperature: float = 1.0
    """sampling temperature, and the temperature of both models' log-probs"""
    # ---- optimisation: the optimizer, memory and saving ----------------------------------------------------------
    lr: float = 1e-5
    """AdamW learning rate"""
    warmup_steps: int = 0
    """linear learning-rate warm-up steps"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass to save memory"""
    run: Annotated[runs.RunOptions, runs.FlatFlags] = runs.option_group(runs.RunOptions)
    lora: Annotated[common.LoraOptions, runs.FlatFlags] = runs.option_group(common.LoraOptions)


def check_args(args: Args) -> None:
    runs.check_options(
        args, at_least_one=("steps", "prompts_per_step", "samples_per_prompt", "max_new_tokens", "eval_size")
    )
    require(
        args.teacher is not None,
        "--teacher DIR is required: train one with `python sft.py` (it prints its run folder; the checkpoint is "
        "<run folder>/model)",
    )
    require(0 <= args.beta <= 1, f"--beta must be in [0, 1], not {args.beta}")
    require(args.temperature > 0, "--temperature must be > 0 for sampling (evaluation is always greedy)")


# ---------------------------------------------------------------------------------------------
# The math: divergences between two distributions over the vocabulary, and the loss
# ---------------------------------------------------------------------------------------------
def forward_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(π_T ‖ π_S) = Σ_v π_T(v) (log π_T(v) - log π_S(v)), from log-probs (..., V) -> (...)"""
    return (teacher.exp() * (teacher - student)).sum(-1)


def reverse_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(π_S ‖ π_T) = Σ_v π_S(v) (log π_S(v) - log π_T(v)), from log-probs (..., V) -> (...)"""
    return (student.exp() * (student - teacher)).sum(-1)


def generalized_jsd(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """GKD's JSD_β(π_T ‖ π_S) = β KL(π_T ‖ M) + (1 - β) KL(π_S ‖ M), M = β π_T + (1 - β) π_S, from log-probs
    (..., V) -> (...). At β = 0 and 1 the mixture is one of the two and the formula is 0; its limits, divided by β
    and by 1 - β, are the forward and the reverse KL, which GKD (and TRL) take as the endpoints: so here."""
    if beta == 0.0:
        return forward_kl(student, teacher)
    if beta == 1.0:
        return reverse_kl(student, teacher)
    # log M, computed in log space: log(β e^{log π_T} + (1 - β) e^{log π_S})
    mixture = torch.logsumexp(torch.stack([teacher + math.log(beta), student + math.log(1 - beta)]), dim=0)
    return beta * forward_kl(mixture, teacher) + (1 - beta) * forward_kl(mixture, student)


def sampled_reverse_kl(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """log π_S(y_t) - log π_T(y_t) of the sampled tokens, (B, T) -> (B, T): the k1 estimate of KL(π_S ‖ π_T) at each
    position, unbiased when y_t ~ π_S (its mean over the student's samples is the reverse KL)."""
    return student_logprobs - teacher_logprobs


def reverse_kl_loss(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor):
    """-Σ_t A_t log π_S(y_t) / Σ_t 1 with A_t = -(log π_S(y_t) - log π_T(y_t)), detached: a policy gradient whose
    expected value is -∇ of each token's reverse KL. (B, T) each -> ()"""
    advantages = -sampled_reverse_kl(student_logprobs, teacher_logprobs).detach()  # (B, T)
    return masked_mean(-advantages * student_logprobs, mask)


def vocabulary_logprobs(model, prompt_ids, prompt_mask, completion_ids, temperature: float) -> torch.Tensor:
    """log softmax(logits / τ) over the whole vocabulary at each completion position, (B, S), (B, S), (B, T) ->
    (B, T, V) float32: the distribution each completion token was drawn from (prompts left-padded, one per row)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    S = prompt_ids.shape[1]
    with common.autocast(model):
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=common.position_ids(attention_mask),
        ).logits[:, S - 1 : -1]
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def load_teacher(path: str, tokenizer, device, precision: str, kernels_on: bool):
    """The frozen teacher; one with another tokenizer is refused (its log-probs would be of other tokens)."""
    teacher = models.load_model(path, len(tokenizer), device, precision, kernels_on=kernels_on)
    teacher.eval().requires_grad_(False)
    require(
        models.load_tokenizer(path).get_vocab() == tokenizer.get_vocab(),
        f"--teacher {path} has another tokenizer than the student: distil between models of one tokenizer",
    )
    return teacher


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    """Distil --teacher into the student on the student's own samples; returns the final metrics (also in
    eval.json)."""
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    models.set_seed(args.seed)
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    train_stream, heldout = tasks.load_problems(
        args.dataset, args.seed, args.eval_size, args.prompts_per_step
    )
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    student, _ = models.load_policy(args, tokenizer, device, precision, kernels_on, resumed, False)
    teacher = load_teacher(args.teacher, tokenizer, device, precision, kernels_on)
    common.check_fits(student, tasks.longest_prompt(tokenizer, heldout), args.max_new_tokens)
    optimizer, scheduler = common.make_optimizer(student, args.lr, warmup_steps=args.warmup_steps)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    N = args.samples_per_prompt

    run = runs.Run(args, "distill", tokenizer, device, resumed)  # the run folder, metrics.jsonl, checkpoints
    run.checkpointed(student, generator, optimizer=optimizer, scheduler=scheduler)
    # a resumed run's data position: P problems a step
    train_stream = itertools.islice(train_stream, (run.first_step - 1) * args.prompts_per_step, None)

    def evaluate(step: int, pass_k: int = 0) -> dict:
        return tasks.evaluate_policy(
            student, tokenizer, heldout, args.max_new_tokens, args.seed, step, pass_k
        )

    run.begin(evaluate)
    for step in range(run.first_step, args.steps + 1):
        # ---- 1. the student samples N completions of each prompt --------------------------------------------
        t0 = time.time()
        problems = [next(train_stream) for _ in range(args.prompts_per_step)]
        prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in problems], device)
        student.eval()
        completion_ids = common.sample_completions(
            student,
            prompt_ids,
            prompt_mask,
            N,
            args.max_new_tokens,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            args.temperature,
            1.0,
            generator,
        )
        mask = common.completion_mask(completion_ids, tokenizer.eos_token_id)  # (B, T), EOS included
        width = int(mask.sum(1).max())  # drop columns that are padding in every row
        completion_ids, mask = completion_ids[:, :width], mask[:, :width]
        prompt_ids = prompt_ids.repeat_interleave(N, 0)  # (B, S): a row each
        prompt_mask = prompt_mask.repeat_interleave(N, 0)
        time_generate = time.time() - t0

        # ---- 2. the teacher's log-probs of the student's tokens, and the student's ------------------------------
        t1 = time.time()
        student.train()
        sequences = (prompt_ids, prompt_mask, completion_ids)
        if args.loss == "jsd":
            with torch.no_grad():
                teacher_vocab = vocabulary_logprobs(teacher, *sequences, args.temperature)  # (B, T, V)
            student_vocab = vocabulary_logprobs(student, *sequences, args.temperature)
            per_token = generalized_jsd(student_vocab, teacher_vocab, args.beta)  # (B, T)
            loss = masked_mean(per_token, mask)
            student_logprobs = student_vocab.gather(-1, completion_ids[..., None]).squeeze(-1)
            teacher_logprobs = teacher_vocab.gather(-1, completion_ids[..., None]).squeeze(-1)
        else:
            ones = torch.ones(len(completion_ids), dtype=torch.long, device=device)
            with torch.no_grad():
                teacher_logprobs, _ = common.completion_logprobs(teacher, *sequences, ones, args.temperature)
            student_logprobs, _ = common.completion_logprobs(student, *sequences, ones, args.temperature)
            loss = reverse_kl_loss(student_logprobs, teacher_logprobs, mask)

        # ---- 3. the update ----------------------------------------------------------------------------------------
        run.check_finite(loss, step)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), args.max_grad_norm)
        run.check_finite(grad_norm, step, "gradient norm")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stats = {"lr": scheduler.get_last_lr()[0]}
        scheduler.step()

        # ---- 4. log, evaluate and checkpoint ----------------------------------------------------------------------
        texts = tasks.decode_completions(tokenizer, completion_ids, mask)
        answers = [p.answer for p in problems for _ in range(N)]
        kl = sampled_reverse_kl(student_logprobs.detach(), teacher_logprobs)  # (B, T)
        stats.update(
            {
                "loss": loss.item(),
                # KL(π_S ‖ π_T) per token and per completion, estimated on the student's own samples
                "kl/reverse_per_token": masked_mean(kl, mask).item(),
                "kl/reverse_per_completion": (kl * mask).sum(1).mean().item(),
                "reward": sum(tasks.verify(t, a) for t, a in zip(texts, answers)) / len(texts),
                "completion_length": mask.sum(1).float().mean().item(),
                "grad_norm": grad_norm.item(),
                "time/generate": time_generate,
                "time/train": time.time() - t1,
                "time/step": time.time() - t0,
            }
        )
        run.log(step, stats, ("loss", "kl/reverse_per_token", "reward"))
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    return run.finish(evaluate, tasks.before_and_after)


if __name__ == "__main__":
    runs.cli(main, Args)
