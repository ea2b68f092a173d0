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
- The reference is the starting model, frozen, its log-probs computed once before the first update
  (one model in memory); `--no-precompute-ref-logprobs` (same numbers) keeps a frozen copy to score
  each batch.
- Chosen and rejected go through the model together: each prompt is encoded once and its key/value
  cache shared by its two completions (common.completion_logprobs); the test suite checks this
  equals two separate forwards.

Data. By default, pairs are the reference model's own samples on the arithmetic task, labelled by
the verifier: each prompt is sampled `--samples-per-prompt` times and a correct completion is paired
with an incorrect one (preferences.preference_data; built once, cached as JSONL, an eighth of the
prompts held out). `--dataset pairs.jsonl` with TRL's fields prompt, chosen, rejected trains on your
own pairs (a tenth held out). Completions get EOS appended (sampled ones only where the model
emitted it: a truncated sample stays truncated) and are tokenised apart from the prompt, so a pair's
two rows share exactly the same prompt tokens.

Online DPO (Guo et al. 2024, pairs sampled from the policy each step) is another loop around the
same loss: dpo_online.py, which imports this file's loss and metrics.

Where this file departs from the paper, and why:
- No SFT stage on the chosen completions first: the embedded model is already instruction-tuned
  and the pairs are its own samples, which is the on-distribution case the paper recommends.
- The learning rate warms up linearly and then stays constant; the paper uses RMSprop at 1e-6.

Run:
    python dpo.py                       # SmolLM2-135M-Instruct (embedded), its own samples as pairs
    python dpo.py --model tiny --dataset tests/data/pairs.jsonl --steps 3
    torchrun --nproc_per_node 2 dpo.py    # 2 ranks, P/2 pairs each; --fsdp: each holds half the model
    python dpo.py --help

Shapes: P pairs, B = 2P sequences (chosen and rejected interleaved), S prompt tokens, T completion tokens.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Annotated, Optional

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import common
from infra import distributed
from infra import fsdp
from infra import models
from infra import runs
from task import preferences, tasks
from common import require


@dataclass
class Args:
    """DPO on preference pairs; held-out accuracy on the arithmetic task with the verifier."""

    # ---- experiment: what to train and how it is evaluated ---------------------------------------
    model: str = "smollm2"
    """smollm2 (embedded SmolLM2-135M-Instruct), tiny (random, for smoke runs), or a hub id / local
    checkpoint"""
    dataset: Annotated[
        Optional[str],
        runs.none_means("pairs sampled from the model and labelled by the verifier", "FILE|DIR|HUB-ID"),
    ] = None
    """JSONL file with fields prompt, chosen, rejected, or a Hugging Face dataset (a save_to_disk folder or a Hub id)"""
    seed: int = 0
    """seed for data, pair order and initialisation"""
    eval_every: int = 0
    """evaluate and save a checkpoint every this many steps (0 = only before and after)"""
    eval_size: Annotated[Optional[int], runs.none_means("200; 16 for the tiny random models", "INT")] = None
    """held-out problems for greedy accuracy (verifier reward)"""
    pass_k: Annotated[Optional[int], runs.none_means("8; 0 (off) for the tiny random models", "INT")] = None
    """pass@k at the first and last evaluation: k samples a held-out problem at temperature 1 (0 = off)"""
    # ---- algorithm: DPO and conservative DPO -----------------------------------------------------
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
    # ---- preference data: the pairs sampled from the model when --dataset is not given -----------
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
    losses = -(1 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(
        -beta * logits
    )
    return losses, beta * chosen_logratios.detach(), beta * rejected_logratios.detach()


# ---------------------------------------------------------------------------------------------
# Data and the concatenated forward
# ---------------------------------------------------------------------------------------------
def concatenated_logps(
    model, tokenizer, pairs: list[dict], max_completion_tokens: Optional[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Summed log-probs of chosen and rejected completions, both in one batch: (P,), (P,), their lengths in
    tokens (P, 2), tokens processed. Completions longer than max_completion_tokens are cut (None: none is).

    Rows are [chosen_0, rejected_0, chosen_1, ...]; each prompt is encoded once and shared by its two
    completions (common.completion_logprobs), which is the same function as two separate forwards.
    """
    prompts = [p["prompt"] for p in pairs]
    texts, finished = preferences.pair_completions(pairs)  # chosen_0, rejected_0, chosen_1, ...
    logps, lengths = preferences.sequence_logps(
        model, tokenizer, prompts, texts, max_completion_tokens, finished
    )
    prompt_tokens = sum(
        len(tokenizer(tasks.format_prompt(tokenizer, p), add_special_tokens=False).input_ids) for p in prompts
    )
    tokens = int(2 * prompt_tokens + lengths.sum())
    logps = logps.view(len(pairs), 2)  # (P, 2) sums, never means
    return logps[:, 0], logps[:, 1], lengths.view(len(pairs), 2), tokens


@torch.no_grad()
def score_pairs(model, tokenizer, pairs: list[dict], args: Args, desc: str) -> torch.Tensor:
    """Summed log-probs of every pair under `model`, (N, 2) [chosen, rejected], --batch-size pairs at a time
    with a progress bar."""
    model.eval()
    out = []
    for start in tqdm(range(0, len(pairs), args.batch_size), desc=desc, dynamic_ncols=True, leave=False):
        chosen, rejected, _, _ = concatenated_logps(
            model, tokenizer, pairs[start : start + args.batch_size], args.max_completion_tokens
        )
        out.append(torch.stack([chosen, rejected], dim=1))
    return torch.cat(out)


def pair_metrics(
    losses, chosen_rewards, rejected_rewards, chosen_logps, rejected_logps, prefix: str = ""
) -> dict:
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
    runs.check_options(
        args,
        at_least_one=(
            "steps",
            "batch_size",
            "num_prompts",
            "max_new_tokens",
            "eval_size",
            "max_completion_tokens",
        ),
        divided_over_ranks="batch_size",
        compiled_decoding=False,
    )
    require(
        args.samples_per_prompt >= 2,
        "--samples-per-prompt must be at least 2 (a pair needs a correct and an incorrect sample)",
    )
    require(args.beta > 0, "--beta must be > 0")
    require(
        0 <= args.label_smoothing < 0.5,
        "--label-smoothing must be in [0, 0.5): it is the probability that a label is wrong",
    )
    require(args.temperature > 0, "--temperature must be > 0 (it samples the preference data)")


def evaluate_heldout(
    policy,
    tokenizer,
    heldout_problems: list[tasks.Problem],
    heldout_pairs: list[dict],
    heldout_ref: torch.Tensor,  # (N, 2) log π_ref of the held-out pairs [chosen, rejected]
    args: Args,
    step: int,
    pass_k: int = 0,
) -> dict:
    """Held-out greedy task accuracy (the number every algorithm reports) and the held-out pairs' DPO metrics."""
    result = tasks.evaluate_policy(
        policy, tokenizer, heldout_problems, args.max_new_tokens, args.seed, step, pass_k
    )
    chosen, rejected = score_pairs(policy, tokenizer, heldout_pairs, args, "held-out pairs").unbind(1)
    losses, chosen_rewards, rejected_rewards = dpo_loss(
        chosen, rejected, heldout_ref[:, 0], heldout_ref[:, 1], args.beta, args.label_smoothing
    )
    result["pairs"] = pair_metrics(losses, chosen_rewards, rejected_rewards, chosen, rejected, prefix="eval/")
    tqdm.write(
        f"step {step}: held-out pairs: loss {result['pairs']['eval/loss']:.4f}, "
        f"reward accuracy {result['pairs']['eval/rewards/accuracies']:.3f}"
    )
    return result


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    """Train with DPO; returns the final metrics (also written to the run folder's eval.json)."""
    args = tasks.evaluation_for_model(args)  # --eval-size and --pass-k, if unset, scaled to the model
    check_args(args)
    models.set_seed(args.seed)
    device = models.resolve_device(args.run.device)
    precision = models.resolve_precision(args.run.precision, device, args.model)
    # the kernels' faster versions: on for a CPU, off for CUDA
    kernels_on = models.resolve_kernels(args.run.kernels, device)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    train_pairs, heldout_pairs, _ = preferences.load_preference_pairs(
        args.dataset,
        args.model,
        tokenizer,
        args.seed,
        args.num_prompts,
        args.samples_per_prompt,
        args.max_new_tokens,
        args.temperature,
        device,
        precision,
        args.eval_size,
    )
    heldout_problems = tasks.heldout_problems(args.eval_size)
    policy = models.load_model(
        args.model, len(tokenizer), device, precision, args.seed, kernels_on=kernels_on
    )
    common.check_fits(policy, tasks.longest_prompt(tokenizer, heldout_problems), args.max_new_tokens)
    batches = tasks.epoch_batches(len(train_pairs), args.batch_size, args.steps, args.seed)

    # ---- 1. the reference: before the first update the policy is the reference ----------------------
    # So log π_ref is the policy's own, scored now with no second model: the held-out pairs' (for the evaluation)
    # and, unless --no-precompute-ref-logprobs, the training pairs'. A resumed run's policy has trained since: its
    # checkpoint keeps what its start scored.
    if resumed:
        heldout_ref = resumed["heldout_ref"].to(device)
        train_ref = resumed["train_ref"]
        train_ref = train_ref.to(device) if train_ref is not None else None
    else:
        heldout_ref = score_pairs(policy, tokenizer, heldout_pairs, args, "reference log-probs (held-out)")
        train_ref = None
        if args.precompute_ref_logprobs:
            train_ref = score_pairs(policy, tokenizer, train_pairs, args, "reference log-probs (train)")
    # Scored batch by batch instead, the reference is a frozen copy of the policy as it starts (a resumed run's too:
    # its trained weights load below); with LoRA no copy: the policy with its adapter off is the starting model.
    ref_model = None
    if not args.precompute_ref_logprobs and not args.lora.lora_r:
        ref_model = common.frozen_copy(policy)
    # only then the policy that trains: a resumed run's weights, or the starting model with a new LoRA adapter
    if resumed:
        policy = models.load_model(
            f"{args.run.resume}/model",
            len(tokenizer),
            device,
            precision,
            args.seed,
            keep_adapter=True,
            kernels_on=kernels_on,
        )
    elif args.lora.lora_r:
        policy = common.add_lora(policy, args.model, args.lora)
    if args.gradient_checkpointing:
        policy.activation_checkpointing_enable()
    fsdp.shard(args.run.fsdp, policy, ref_model)  # --fsdp: 1/N of each model's weights on a rank
    optimizer, scheduler = common.make_optimizer(policy, args.lr, args.weight_decay, args.warmup_steps)
    run = runs.Run(
        args, "dpo", tokenizer, device, resumed, eval_row=lambda r: {"accuracy": r["accuracy"], **r["pairs"]}
    )
    # the data position is the step: batches[step:] come next
    run.checkpointed(
        policy,
        optimizer=optimizer,
        scheduler=scheduler,
        extra=lambda: {"heldout_ref": heldout_ref, "train_ref": train_ref},
    )
    evaluate = functools.partial(
        evaluate_heldout, policy, tokenizer, heldout_problems, heldout_pairs, heldout_ref, args
    )

    run.begin(evaluate)
    for step, batch in enumerate(batches[run.first_step - 1 :], run.first_step):
        t0 = time.time()
        batch = distributed.share(batch)  # under torchrun, P/N pairs on a rank
        pairs = [train_pairs[i] for i in batch]

        # ---- 2. log π_ref of this batch: precomputed, or from the frozen copy ---------------------
        if train_ref is not None:
            ref_chosen, ref_rejected = train_ref[batch].unbind(1)  # (P,), (P,)
        else:
            with torch.no_grad(), common.reference(policy, ref_model) as ref:
                ref_chosen, ref_rejected, _, _ = concatenated_logps(
                    ref, tokenizer, pairs, args.max_completion_tokens
                )

        # ---- 3. log π_θ of chosen and rejected in one batch, then the DPO loss ------------------
        policy.train()
        policy_chosen, policy_rejected, lengths, tokens = concatenated_logps(
            policy, tokenizer, pairs, args.max_completion_tokens
        )
        losses, chosen_rewards, rejected_rewards = dpo_loss(
            policy_chosen, policy_rejected, ref_chosen, ref_rejected, args.beta, args.label_smoothing
        )
        # this rank's part of the batch's mean; × 1.0 alone
        loss = losses.mean() * distributed.share_of(len(pairs))
        run.check_finite(loss, step)

        # ---- 4. update -------------------------------------------------------------------------
        loss.backward()
        distributed.all_reduce_grads(policy)  # Σ over the ranks
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
                "tokens_per_second": tokens / step_time,  # prompt + completion tokens of the 2P sequences
                # y_w systematically shorter or longer than y_l: a length bias the loss can learn instead
                "lengths/chosen": lengths[:, 0].float().mean().item(),
                "lengths/rejected": lengths[:, 1].float().mean().item(),
            }
        )
        # each rank's mean over an equal share: their mean is the batch's
        stats = distributed.mean_over_ranks(stats)
        run.log(
            step,
            stats,
            {
                "loss": f"{stats['loss']:.4f}",
                "margin": f"{stats['rewards/margins']:.3f}",
                "acc": f"{stats['rewards/accuracies']:.2f}",
            },
        )

        # ---- 6. evaluate and checkpoint ----------------------------------------------------------
        run.evaluate(step, evaluate)
        run.save_if_due(step)

    def results(before: dict, after: dict) -> dict:
        numbers = tasks.before_and_after(before, after)
        numbers["pairs_train"] = len(train_pairs)
        numbers["pairs_heldout"] = len(heldout_pairs)
        numbers["pairs_used"] = args.steps * args.batch_size
        return numbers

    return run.finish(
        evaluate,
        results,
        lambda before, after: f"held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}",
    )


if __name__ == "__main__":
    runs.cli(main, Args)
