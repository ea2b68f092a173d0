"""DPO: Direct Preference Optimization on (prompt, chosen, rejected) pairs, in one file.

The KL-regularised RLHF objective max E[r(x, y)] - β KL[π_θ || π_ref] has the closed-form optimum
π*(y|x) ∝ π_ref(y|x) exp(r(x, y)/β). Solved for r, the reward is β log π*(y|x)/π_ref(y|x) up to a
term in x alone, which cancels in a Bradley-Terry comparison of two completions of the same prompt.
So the policy can be fit to preference pairs directly, with a classification loss and no reward
model or sampling: the language model is secretly the reward model.

Objective (Rafailov et al. 2023, arXiv:2305.18290, eq. 7), minimised:
    L_DPO(π_θ; π_ref) = -E_(x, y_w, y_l) [ log σ( β log π_θ(y_w|x)/π_ref(y_w|x) - β log π_θ(y_l|x)/π_ref(y_l|x) ) ]
    implicit reward  r̂(x, y) = β log π_θ(y|x)/π_ref(y|x)         (§4, reported as rewards/chosen, rewards/rejected)
With label smoothing ε (conservative DPO, Mitchell 2023, "A note on DPO with noisy preferences"), the
label is trusted with probability 1 - ε:  L = -(1-ε) log σ(β h) - ε log σ(-β h).

Conventions a reader could get wrong (each pinned by a test):
- log π(y|x) is the *sum* of the completion's token log-probs (EOS included), never the mean.
- β multiplies the log-ratios inside the sigmoid; it is not a KL coefficient added to a loss.
- The reference is the starting model, frozen. Its log-probs are computed once up front by
  default, before the first update, so only one model is ever in memory; with
  `--no-precompute-ref-logprobs` a frozen copy scores each batch on the fly (same numbers).
- Chosen and rejected go through the model together: each prompt is encoded once and its
  key/value cache shared by its two completions (common.completion_logprobs); the test
  suite checks this equals two separate forwards.

Data. By default, pairs are the reference model's own samples on the arithmetic task, labelled by
the verifier: each prompt is sampled `--samples-per-prompt` times and a correct completion is
paired with an incorrect one (tasks.preference_data; built once, cached as JSONL, an eighth of
the prompts held out). `--dataset pairs.jsonl` with TRL's fields prompt, chosen, rejected trains on
your own pairs (a tenth held out). Completions get EOS appended (sampled ones only where the model
emitted it: a truncated sample stays truncated) and are tokenised apart from the
prompt, so a pair's two rows share exactly the same prompt tokens.

Where this file departs from the paper, and why:
- No SFT stage on the chosen completions first: the embedded model is already instruction-tuned
  and the pairs are its own samples, which is the on-distribution case the paper recommends.
- The learning rate warms up linearly and then stays constant; the paper uses RMSprop at 1e-6.

Run:
    python dpo.py                       # SmolLM2-135M-Instruct (embedded), its own samples as pairs
    python dpo.py --model tiny --dataset tests/data/pairs.jsonl --steps 3
    python dpo.py --help

Shapes: P pairs, B = 2P sequences (chosen and rejected interleaved), S prompt tokens, T completion tokens.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Annotated, Optional

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import common
import tasks
from common import InputError


@dataclass
class Experiment:
    """what to train and how it is evaluated"""

    model: str = "smollm2"
    """smollm2 (embedded SmolLM2-135M-Instruct), tiny (random, for smoke runs), or a hub id / local checkpoint"""
    dataset: Annotated[Optional[str], common.none_means("pairs sampled from the model and labelled by the verifier", "FILE")] = None
    """JSONL file with fields prompt, chosen, rejected"""
    seed: int = 0
    """seed for data, pair order and initialisation"""
    eval_every: int = 0
    """evaluate and save a checkpoint every this many steps (0 = only before and after)"""
    eval_size: int = 200
    """number of held-out arithmetic problems for greedy accuracy"""
    pass_k: int = 8
    """pass@k at the first and last evaluation: k completions per held-out problem at temperature 1, scored by the verifier (0 = off)"""


@dataclass
class Algorithm:
    """DPO and conservative DPO"""

    steps: int = 60
    """optimizer steps; the training pairs are reshuffled each time they run out"""
    batch_size: int = 8
    """preference pairs per optimizer step"""
    beta: float = 0.1
    """β: inverse temperature of the implicit reward β log π/π_ref (larger stays closer to the reference)"""
    label_smoothing: float = 0.0
    """ε of conservative DPO: the probability that a pair's label is wrong (0 = plain DPO)"""
    precompute_ref_logprobs: bool = True
    """score every pair with the reference once before training and keep only the policy in memory"""


@dataclass
class PreferenceData:
    """the pairs sampled from the model when --dataset is not given"""

    num_prompts: int = 512
    """distinct arithmetic prompts to sample; an eighth are held out"""
    samples_per_prompt: int = 8
    """completions sampled per prompt; a correct and an incorrect one make a pair"""
    temperature: float = 0.7
    """sampling temperature for building the pairs (evaluation is greedy)"""
    max_new_tokens: int = 32
    """completion length limit when sampling pairs and in evaluation"""
    max_completion_tokens: int = 256
    """completions of --dataset pairs longer than this are cut (they then end without EOS)"""


@dataclass
class Optimisation:
    """the optimizer, memory and saving"""

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
    save_model: bool = True
    """save the final model (and one at each evaluation) in the run folder"""


@dataclass
class Args(common.Lora, Optimisation, PreferenceData, Algorithm, common.Run, Experiment):
    """DPO on preference pairs; held-out accuracy on the arithmetic task with the verifier.

    One flat set of options, `Args(beta=0.2)`; the base classes only group them in --help, and their
    fields come in the order Experiment, Run, Algorithm, PreferenceData, Optimisation, Lora (a dataclass takes its last base's fields first)."""


# ---------------------------------------------------------------------------------------------
# The math
# ---------------------------------------------------------------------------------------------
def dpo_loss(
    policy_chosen_logps: torch.Tensor,  # (P,) log π_θ(y_w|x), summed over completion tokens
    policy_rejected_logps: torch.Tensor,  # (P,) log π_θ(y_l|x)
    ref_chosen_logps: torch.Tensor,  # (P,) log π_ref(y_w|x)
    ref_rejected_logps: torch.Tensor,  # (P,) log π_ref(y_l|x)
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair DPO loss (Rafailov et al. 2023, eq. 7) and the implicit rewards (§4).

    h = log π_θ(y_w)/π_ref(y_w) - log π_θ(y_l)/π_ref(y_l)
    loss = -(1-ε) log σ(β h) - ε log σ(-β h)      (ε = label_smoothing, cDPO; ε = 0 is DPO)
    Returns (losses (P,), chosen_rewards (P,), rejected_rewards (P,)) with rewards β log π_θ/π_ref,
    detached: they are for logging. Take losses.mean() to train.
    """
    chosen_logratios = policy_chosen_logps - ref_chosen_logps  # (P,)
    rejected_logratios = policy_rejected_logps - ref_rejected_logps  # (P,)
    logits = chosen_logratios - rejected_logratios  # (P,) h
    losses = -(1 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(-beta * logits)
    return losses, beta * chosen_logratios.detach(), beta * rejected_logratios.detach()


# ---------------------------------------------------------------------------------------------
# Data and the concatenated forward
# ---------------------------------------------------------------------------------------------
def concatenated_logps(model, tokenizer, pairs: list[dict], max_completion_tokens: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed log-probs of chosen and rejected completions, both in one batch: (P,), (P,), tokens processed.

    Rows are [chosen_0, rejected_0, chosen_1, ...]; each prompt is encoded once and shared by its two
    completions (common.completion_logprobs), which is the same function as two separate forwards.
    """
    prompts = [p["prompt"] for p in pairs]
    texts, finished = tasks.pair_completions(pairs)  # chosen_0, rejected_0, chosen_1, ...
    logps, lengths = tasks.sequence_logps(model, tokenizer, prompts, texts, max_completion_tokens, finished)  # (2P,) sums, never means
    prompt_tokens = sum(len(tokenizer(tasks.format_prompt(tokenizer, p), add_special_tokens=False).input_ids) for p in prompts)
    tokens = int(2 * prompt_tokens + lengths.sum())
    logps = logps.view(len(pairs), 2)  # (P, 2)
    return logps[:, 0], logps[:, 1], tokens


@torch.no_grad()
def score_pairs(model, tokenizer, pairs: list[dict], batch_size: int, max_completion_tokens: int, desc: str) -> torch.Tensor:
    """Summed log-probs of every pair under `model`, (N, 2) [chosen, rejected], batch by batch with a progress bar."""
    model.eval()
    out = []
    for start in tqdm(range(0, len(pairs), batch_size), desc=desc, dynamic_ncols=True, leave=False):
        chosen, rejected, _ = concatenated_logps(model, tokenizer, pairs[start : start + batch_size], max_completion_tokens)
        out.append(torch.stack([chosen, rejected], dim=1))
    return torch.cat(out)


def pair_metrics(losses, chosen_rewards, rejected_rewards, chosen_logps, rejected_logps, prefix: str = "") -> dict:
    """TRL's DPO metric names, as floats averaged over the pairs."""
    return {
        f"{prefix}loss": losses.mean().item(),
        f"{prefix}rewards/chosen": chosen_rewards.mean().item(),
        f"{prefix}rewards/rejected": rejected_rewards.mean().item(),
        f"{prefix}rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
        f"{prefix}rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
        f"{prefix}logps/chosen": chosen_logps.detach().mean().item(),
        f"{prefix}logps/rejected": rejected_logps.detach().mean().item(),
    }


def check_args(args: Args) -> None:
    common.check_run_args(args)
    if args.pass_k < 0:
        raise InputError(f"--pass-k must be 0 (off) or a number of samples per problem, not {args.pass_k}")
    for name in ("steps", "batch_size", "num_prompts", "max_new_tokens", "eval_size", "max_completion_tokens"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1")
    if args.samples_per_prompt < 2:
        raise InputError("--samples-per-prompt must be at least 2 (a pair needs a correct and an incorrect sample)")
    if args.beta <= 0:
        raise InputError("--beta must be > 0")
    if not 0 <= args.label_smoothing < 0.5:
        raise InputError("--label-smoothing must be in [0, 0.5): it is the probability that a label is wrong")
    if args.temperature <= 0:
        raise InputError("--temperature must be > 0 (it samples the preference data)")


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    """Train with DPO; returns the final metrics (also written to the run folder's eval.json)."""
    check_args(args)
    common.set_seed(args.seed)
    device = common.resolve_device(args.device)
    precision = common.resolve_precision(args.precision, device)
    kernels = common.resolve_kernels(args.kernels, device)  # kernels.py's faster versions: on for a CPU, off for CUDA
    resumed = common.load_trainer_state(args.resume, args.steps) if args.resume else None
    tokenizer = common.load_tokenizer(args.model, args.prompt_format)
    if args.memory_plan:  # from the config alone, before any preference data is sampled; chosen and rejected in one forward
        config, S = common.model_config(args.model, len(tokenizer)), tasks.longest_prompt(tokenizer, tasks.heldout_problems(args.eval_size))
        T, B = args.max_completion_tokens if args.dataset else min(args.max_completion_tokens, args.max_new_tokens + 1), 2 * args.batch_size
        models = [("policy", config, "lm", True)] + [("reference", config, "lm", False)] * (not args.precompute_ref_logprobs and not args.lora_r)
        return common.memory_plan(models, precision, args, args.gradient_checkpointing, B, B * (S + T), B * T, kernels)
    train_pairs, heldout_pairs, _ = tasks.load_preference_pairs(
        args.dataset, args.model, tokenizer, args.seed, args.num_prompts, args.samples_per_prompt, args.max_new_tokens,
        args.temperature, device, precision, args.eval_size)
    heldout_problems = tasks.heldout_problems(args.eval_size)
    policy = common.load_model(args.model, len(tokenizer), device, precision, args.seed, use_kernels=kernels)
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout_problems), args.max_new_tokens)
    batches = tasks.epoch_batches(len(train_pairs), args.batch_size, args.steps, args.seed)  # a longer run only appends batches
    run_dir = common.make_run_dir(args.output_dir, "dpo", args.model, args.seed, args)
    log = common.MetricsLog(run_dir / "metrics.jsonl", resumed["step"] if resumed else 0, args.report_to, args)
    save_every = args.save_every or args.eval_every
    print(f"run folder: {run_dir}")

    # ---- 1. the reference: log π_ref once for every pair, or a frozen copy -----------------------
    # Before any update the policy *is* the reference, so precomputing needs no second model. A resumed
    # run reads them from its checkpoint: its policy is no longer the reference.
    ref_model, train_ref = None, None
    if resumed:
        heldout_ref, train_ref = resumed["heldout_ref"].to(device), resumed["train_ref"]
        train_ref = train_ref.to(device) if train_ref is not None else None
    else:
        heldout_ref = score_pairs(policy, tokenizer, heldout_pairs, args.batch_size, args.max_completion_tokens, "reference log-probs (held-out)")
        if args.precompute_ref_logprobs:
            train_ref = score_pairs(policy, tokenizer, train_pairs, args.batch_size, args.max_completion_tokens, "reference log-probs (train)")
    if not args.precompute_ref_logprobs and not args.lora_r:
        ref_model = common.frozen_copy(policy)  # the starting model, also when resuming; with LoRA: the policy, adapter off
    if resumed:
        policy = common.load_model(f"{args.resume}/model", len(tokenizer), device, precision, args.seed, keep_adapter=True, use_kernels=kernels)
    elif args.lora_r:
        policy = common.add_lora(policy, args.model, args)

    if args.gradient_checkpointing:
        policy.activation_checkpointing_enable()
    optimizer, scheduler = common.make_optimizer(policy, args.lr, args.weight_decay, args.warmup_steps)

    def evaluate(step: int, pass_k: int = 0) -> dict:
        """Held-out greedy task accuracy (the number every algorithm reports) and held-out pair metrics."""
        policy.eval()
        result = tasks.evaluate_accuracy(policy, tokenizer, heldout_problems, args.max_new_tokens)
        if pass_k:
            result[f"pass@{pass_k}"] = tasks.evaluate_pass_at_k(policy, tokenizer, heldout_problems, pass_k, args.max_new_tokens, args.seed)
            tqdm.write(f"step {step}: held-out pass@{pass_k} {result[f'pass@{pass_k}']:.3f} ({pass_k} samples per problem at temperature 1)")
        with torch.no_grad():
            chosen, rejected = score_pairs(policy, tokenizer, heldout_pairs, args.batch_size, args.max_completion_tokens, "held-out pairs").unbind(1)
        losses, chosen_rewards, rejected_rewards = dpo_loss(chosen, rejected, heldout_ref[:, 0], heldout_ref[:, 1], args.beta, args.label_smoothing)
        result["pairs"] = pair_metrics(losses, chosen_rewards, rejected_rewards, chosen, rejected, prefix="eval/")
        tqdm.write(f"step {step}: held-out accuracy {result['accuracy']:.3f} ({len(heldout_problems)} problems); "
                   f"held-out pairs: loss {result['pairs']['eval/loss']:.4f}, reward accuracy {result['pairs']['eval/rewards/accuracies']:.3f}")
        return result

    def checkpoint(step: int) -> None:
        """Everything an exact --resume needs; the data position is the step (batches[step:] come next)."""
        state = {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": common.rng_state(),
                 "evals": evals, "before": before, "heldout_ref": heldout_ref, "train_ref": train_ref}
        common.save_checkpoint(policy, tokenizer, run_dir / "model", state)

    if resumed:
        optimizer.load_state_dict(resumed["optimizer"])
        scheduler.load_state_dict(resumed["scheduler"])
        common.set_rng_state(resumed["rng"])
        before, evals, last_good, start = resumed["before"], resumed["evals"], resumed["step"], resumed["step"] + 1
    else:
        before = evaluate(0, args.pass_k)
        evals, last_good, start = [log.write_eval({"step": 0, "accuracy": before["accuracy"], **before["pairs"]})], None, 1
    bar = common.progress(args.steps, "dpo", initial=start - 1)
    for step, batch in enumerate(batches[start - 1 :], start):
        t0 = time.time()
        pairs = [train_pairs[i] for i in batch]

        # ---- 2. log π_ref of this batch: precomputed, or from the frozen copy ---------------------
        if train_ref is not None:
            ref_chosen, ref_rejected = train_ref[batch].unbind(1)  # (P,), (P,)
        else:
            with torch.no_grad(), common.reference(policy, ref_model) as ref:
                ref_chosen, ref_rejected, _ = concatenated_logps(ref, tokenizer, pairs, args.max_completion_tokens)

        # ---- 3. log π_θ of chosen and rejected in one batch, then the DPO loss ------------------
        policy.train()
        policy_chosen, policy_rejected, tokens = concatenated_logps(policy, tokenizer, pairs, args.max_completion_tokens)
        losses, chosen_rewards, rejected_rewards = dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, args.beta, args.label_smoothing)
        loss = losses.mean()
        common.check_finite(loss, step, last_good, run_dir)

        # ---- 4. update -------------------------------------------------------------------------
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
        common.check_finite(grad_norm, step, last_good, run_dir, "gradient norm")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # now, not at the next backward: the model's size in float32, idle through the next forward
        lr = scheduler.get_last_lr()[0]  # the rate this step used
        scheduler.step()

        # ---- 5. log ----------------------------------------------------------------------------------
        step_time = time.time() - t0
        stats = pair_metrics(losses, chosen_rewards, rejected_rewards, policy_chosen, policy_rejected)
        stats.update({
            "grad_norm": grad_norm.item(),
            "lr": lr,
            "time/step": step_time,
            "tokens_per_second": tokens / step_time,  # prompt + completion tokens of the 2P sequences
            "memory/peak_gb": common.peak_memory_gb(device),
        })
        log.write(step, stats)
        bar.update(1)
        bar.set_postfix(loss=f"{stats['loss']:.4f}", margin=f"{stats['rewards/margins']:.3f}", acc=f"{stats['rewards/accuracies']:.2f}")

        # ---- 6. evaluate and checkpoint ----------------------------------------------------------
        if args.eval_every and step % args.eval_every == 0 and step < args.steps:
            result = evaluate(step)
            evals.append(log.write_eval({"step": step, "accuracy": result["accuracy"], **result["pairs"]}))
            common.plot_curves(run_dir, evals)
        if args.save_model and save_every and step % save_every == 0 and step < args.steps:
            checkpoint(step)
            last_good = step
    bar.close()

    after = evaluate(args.steps, args.pass_k)
    evals.append(log.write_eval({"step": args.steps, "accuracy": after["accuracy"], **after["pairs"]}))
    result = {
        **tasks.before_and_after(before, after),
        "evals": evals,
        "steps": args.steps,
        "pairs_train": len(train_pairs),
        "pairs_heldout": len(heldout_pairs),
        "pairs_used": args.steps * args.batch_size,
        "wall_time_s": round(time.time() - log.start, 1),
        "memory/peak_gb": common.peak_memory_gb(device),
        "samples_before": before["samples"],
        "samples_after": after["samples"],
        "run_dir": str(run_dir),
    }
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    common.plot_curves(run_dir, evals)
    if args.save_model:  # after eval.json: a failed save (a full disk) never loses the results
        checkpoint(args.steps)
        if args.lora_r and args.merge_lora:
            common.save_merged(policy, tokenizer, run_dir / "merged")
    log.close()
    common.print_summary(f"held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}", result)
    return result


if __name__ == "__main__":
    common.run_cli(main, common.parse_args(Args))
