"""Reward model: a language model with a scalar head, trained on preference pairs with the Bradley-Terry loss.

Stage 2 of RLHF. Humans (here: the arithmetic verifier) compare two completions of the same prompt;
the Bradley-Terry model says the chosen one wins with probability σ(r(x, y_w) - r(x, y_l)), and the
reward model r is fit by maximising the likelihood of the observed choices. Only differences of r
are learned: adding a constant to every score changes nothing, which is why reward centering exists.
The trained model scores (prompt, completion) for ppo.py and initialises its critic.

Objective (Ouyang et al. 2022, InstructGPT, arXiv:2203.02155, eq. 1), minimised:
    loss(r) = -E_(x, y_w, y_l) [ log σ( r(x, y_w) - r(x, y_l) - m ) ] + c · E[ (r(x, y_w) + r(x, y_l))² ]
    m: an optional per-pair margin (Llama 2, Touvron et al. 2023, arXiv:2307.09288, eq. 2), from a
       `margin` field in --dataset; 0 otherwise.
    c: --center-rewards-coefficient, the auxiliary loss that keeps scores centred on zero
       (Eisenstein et al. 2023, arXiv:2312.09244; TRL's center_rewards_coefficient); off by default.

The score r(x, y) is the scalar head applied to the final hidden state at the *last real token* of
prompt + completion (its EOS if the model finished it, else its last token), found from the attention mask
(common.reward_scores), so the score does not depend on how the batch was padded. InstructGPT
compares all K(K-1)/2 pairs of K ranked completions in one batch; here each pair is one row pair.

Data: the same pairs as dpo.py (the reference model's own samples, a correct completion chosen
over an incorrect one, built once and cached; or --dataset with prompt, chosen, rejected).
Evaluation, before and after: pair accuracy on held-out pairs, and agreement with the verifier on
fresh samples of held-out prompts (AUC: how often a correct sample outscores an incorrect one; and
best-of-n accuracy: pick the top-scored of each prompt's n samples).

The checkpoint is an ordinary transformers sequence-classification model with one label:
    AutoModelForSequenceClassification.from_pretrained("runs/rm-.../model"), scored with common.reward_scores.

Run:
    python reward_model.py              # SmolLM2-135M-Instruct backbone (embedded), its own samples as pairs
    python reward_model.py --model tiny --dataset tests/data/pairs.jsonl --steps 3
    python reward_model.py --help

Shapes: P pairs, B = 2P sequences (chosen and rejected interleaved), L prompt + completion tokens.
"""

from __future__ import annotations

import math
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
    """Bradley-Terry reward model on preference pairs."""

    # ---- experiment: what to train and how it is evaluated -------------------------------------------------------
    model: str = "smollm2"
    """backbone: smollm2 (embedded SmolLM2-135M-Instruct), tiny (random, smoke runs), or a hub id / local checkpoint"""
    dataset: Annotated[
        Optional[str],
        runs.none_means("pairs sampled from the model and labelled by the verifier", "FILE|DIR|HUB-ID"),
    ] = None
    """JSONL file with fields prompt, chosen, rejected (and optionally a numeric margin), or a Hugging Face dataset
    (a save_to_disk folder or a Hub id)"""
    seed: int = 0
    """seed for data, pair order and the score head's initialisation"""
    eval_every: int = 0
    """evaluate on held-out pairs and save a checkpoint every this many steps (0 = only before and after)"""
    # ---- algorithm: the Bradley-Terry loss -----------------------------------------------------------------------
    steps: int = 60
    """optimizer steps; the training pairs are reshuffled each time they run out"""
    batch_size: int = 8
    """preference pairs per optimizer step"""
    center_rewards_coefficient: Annotated[Optional[float], runs.none_means("off", "FLOAT")] = None
    """weight c of the centering loss c·E[(r_w + r_l)²] (Eisenstein et al. 2023; 0.01 is typical)"""
    head_only: bool = False
    """train the score head alone on the frozen backbone (a linear probe of its last hidden state), not end to end"""
    # ---- preference data: the pairs sampled from the model when --dataset is not given ---------------------------
    num_prompts: int = 512
    """distinct arithmetic prompts to sample; an eighth are held out"""
    samples_per_prompt: int = 8
    """completions sampled per prompt; a correct and an incorrect one make a pair"""
    temperature: float = 0.7
    """sampling temperature for building the pairs"""
    max_new_tokens: int = 32
    """completion length limit when sampling pairs"""
    max_completion_tokens: int = 256
    """completions of --dataset pairs longer than this are cut (they then end without EOS)"""
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
# The math
# ---------------------------------------------------------------------------------------------
def bradley_terry_loss(
    chosen_scores: torch.Tensor,  # (P,) r(x, y_w)
    rejected_scores: torch.Tensor,  # (P,) r(x, y_l)
    margin: Optional[torch.Tensor] = None,  # (P,) or None
    center_coef: float = 0.0,
) -> torch.Tensor:
    """Mean over pairs of -log σ(r_w - r_l - m) (InstructGPT eq. 1; margin m: Llama 2 eq. 2),
    plus center_coef · mean((r_w + r_l)²) (reward centering). Returns a scalar."""
    diff = chosen_scores - rejected_scores  # (P,)
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_coef:
        loss = loss + center_coef * ((chosen_scores + rejected_scores) ** 2).mean()
    return loss


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """P(score of a random positive > score of a random negative), ties counted half. (N,), (N,) -> float

    1.0: the reward model ranks every correct sample above every incorrect one; 0.5: chance.
    NaN when there are no positives or no negatives.
    """
    pos, neg = scores[labels == 1], scores[labels == 0]
    if len(pos) == 0 or len(neg) == 0:
        return math.nan
    greater = (pos[:, None] > neg[None, :]).float() + 0.5 * (pos[:, None] == neg[None, :]).float()  # (N+, N-)
    return greater.mean().item()


# ---------------------------------------------------------------------------------------------
# Data and scoring
# ---------------------------------------------------------------------------------------------
def score_texts(
    model,
    tokenizer,
    prompts: list[str],
    completions: list[str],
    max_completion_tokens: int,
    finished: Optional[list[bool]] = None,
) -> torch.Tensor:
    """r(x, y) for each (prompt, completion): the chat-formatted prompt, left-padded, then the completion
    and EOS (where it finished), right-padded, as one row. (B,) float."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, prompts, device)  # (B, S)
    # (B, T)
    completion_ids, completion_mask = tasks.tokenize_completions(
        tokenizer, completions, device, max_completion_tokens, finished
    )
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, S+T)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    return common.reward_scores(model, input_ids, attention_mask)


def pair_scores(
    model, tokenizer, pairs: list[dict], max_completion_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of chosen and rejected, both in one batch of 2P rows [chosen_0, rejected_0, ...]: (P,), (P,)."""
    prompts = [p["prompt"] for p in pairs for _ in range(2)]
    completions, finished = preferences.pair_completions(pairs)
    # (P, 2)
    scores = score_texts(model, tokenizer, prompts, completions, max_completion_tokens, finished).view(
        len(pairs), 2
    )
    return scores[:, 0], scores[:, 1]


@torch.no_grad()
def evaluate(
    model, tokenizer, pairs: list[dict], samples: list[dict], max_completion_tokens: int, batch_size: int = 32
) -> dict:
    """Held-out pair accuracy and margin; agreement with the verifier on labelled samples (if any)."""
    model.eval()
    scored = [
        pair_scores(model, tokenizer, pairs[i : i + batch_size], max_completion_tokens)
        for i in tqdm(
            range(0, len(pairs), batch_size), desc="held-out pairs", dynamic_ncols=True, leave=False
        )
    ]
    chosen, rejected = torch.cat([c for c, _ in scored]), torch.cat([r for _, r in scored])  # (P,), (P,)
    agreed = agreement(model, tokenizer, samples, max_completion_tokens, batch_size) if samples else {}
    return {
        "eval/accuracy": (chosen > rejected).float().mean().item(),
        "eval/margin": (chosen - rejected).mean().item(),
        **agreed,
    }


@torch.no_grad()
def agreement(
    model, tokenizer, samples: list[dict], max_completion_tokens: int, batch_size: int = 32
) -> dict:
    """Agreement with the verifier on labelled samples, several a prompt (preferences.label_samples; any policy's in
    scripts/rm_agreement.py): AUC, best-of-n accuracy (top-scored of each prompt's), a random sample's, the oracle's."""
    model.eval()
    scores = torch.cat(
        [
            score_texts(
                model,
                tokenizer,
                [s["prompt"] for s in samples[i : i + batch_size]],
                [s["completion"] for s in samples[i : i + batch_size]],
                max_completion_tokens,
                [s.get("finished", True) for s in samples[i : i + batch_size]],
            )
            for i in tqdm(
                range(0, len(samples), batch_size), desc="held-out samples", dynamic_ncols=True, leave=False
            )
        ]
    )
    # by_prompt: row indices
    labels = torch.tensor([s["label"] for s in samples], dtype=torch.float)
    by_prompt = {}
    for i, s in enumerate(samples):
        by_prompt.setdefault(s["prompt"], []).append(i)
    best = [max(rows, key=lambda i: scores[i].item()) for rows in by_prompt.values()]
    return {
        "agreement/auc": auc(scores.cpu(), labels),
        "agreement/best_of_n_accuracy": labels[best].mean().item(),  # the top-scored sample of each prompt
        "agreement/sample_accuracy": labels.mean().item(),  # a random sample of each prompt
        "agreement/oracle_accuracy": torch.stack([labels[rows].max() for rows in by_prompt.values()])
        .mean()
        .item(),
    }


def check_args(args: Args) -> None:
    runs.check_options(
        args,
        at_least_one=("steps", "batch_size", "num_prompts", "max_new_tokens", "max_completion_tokens"),
        divided_over_ranks="batch_size",
        compiled_decoding=False,
    )
    require(
        args.samples_per_prompt >= 2,
        "--samples-per-prompt must be at least 2 (a pair needs a correct and an incorrect sample)",
    )
    require(args.temperature > 0, "--temperature must be > 0 (it samples the preference data)")
    require(
        args.center_rewards_coefficient is None or args.center_rewards_coefficient >= 0,
        "--center-rewards-coefficient must be >= 0",
    )


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    """Train a Bradley-Terry reward model; returns the final metrics (also written to eval.json)."""
    check_args(args)
    models.set_seed(args.seed)
    # --device, --precision and --kernels resolved for this machine (the kernels: on for a CPU, off for CUDA)
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    train_pairs, heldout_pairs, heldout_samples = preferences.load_preference_pairs(
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
    )
    for pair in train_pairs + heldout_pairs:  # TRL's optional per-pair margin
        margin = pair.get("margin", 0.0)
        require(
            isinstance(margin, (int, float)) and math.isfinite(margin),
            f"{args.dataset}: margin {margin!r} of prompt {pair['prompt']!r} is not a finite number",
        )
    model = models.load_model(
        f"{args.run.resume}/model" if resumed else args.model,
        len(tokenizer),
        device,
        precision,
        args.seed,
        head="score",
        keep_adapter=bool(resumed),
        kernels_on=kernels_on,
    )
    if args.lora.lora_r and not resumed:
        model = common.add_lora(model, args.model, args.lora)  # the score head stays fully trainable
    if args.head_only:  # a linear probe: the backbone (and any adapter) frozen, the score head alone trains
        model.requires_grad_(False)
        model.score.requires_grad_(True)
    model.config.pad_token_id = tokenizer.pad_token_id  # transformers' own forward needs it for batches
    if args.gradient_checkpointing:
        model.activation_checkpointing_enable()
    fsdp.shard(args.run.fsdp, model)  # --fsdp: 1/N of each model's weights on a rank
    optimizer, scheduler = common.make_optimizer(model, args.lr, args.weight_decay, args.warmup_steps)
    # a longer run appends
    batches = tasks.epoch_batches(len(train_pairs), args.batch_size, args.steps, args.seed)
    has_margin = any("margin" in p for p in train_pairs)
    run = runs.Run(
        args, "rm", tokenizer, device, resumed, eval_row=lambda result: result, accuracy_key="eval/accuracy"
    )
    # the data position is the step: batches[step:] come next
    run.checkpointed(model, optimizer=optimizer, scheduler=scheduler)

    def report(step: int, pass_k: int = 0) -> dict:
        result = evaluate(model, tokenizer, heldout_pairs, heldout_samples, args.max_completion_tokens)
        line = (
            f"step {step}: held-out pair accuracy {result['eval/accuracy']:.3f} ({len(heldout_pairs)} pairs)"
        )
        if "agreement/auc" in result:
            line += (
                f"; verifier agreement on {len(heldout_samples)} fresh samples: AUC {result['agreement/auc']:.3f}"
                f", best-of-n accuracy {result['agreement/best_of_n_accuracy']:.3f} "
                f"(random sample {result['agreement/sample_accuracy']:.3f})"
            )
        tqdm.write(line)
        return result

    run.begin(report)
    for step, batch in enumerate(batches[run.first_step - 1 :], run.first_step):
        t0 = time.time()
        pairs = [train_pairs[i] for i in distributed.share(batch)]  # under torchrun, P/N pairs on a rank

        # ---- 1. score chosen and rejected in one batch -----------------------------------------
        model.train()
        chosen, rejected = pair_scores(model, tokenizer, pairs, args.max_completion_tokens)  # (P,), (P,)
        margin = (
            torch.tensor([float(p.get("margin", 0.0)) for p in pairs], device=device) if has_margin else None
        )

        # ---- 2. Bradley-Terry loss and update ------------------------------------------------------
        loss = bradley_terry_loss(chosen, rejected, margin, args.center_rewards_coefficient or 0.0)
        run.check_finite(loss, step)
        # this rank's part of the batch's mean; × 1.0 alone
        (loss * distributed.share_of(len(pairs))).backward()
        distributed.all_reduce_grads(model)  # Σ over the ranks
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        run.check_finite(grad_norm, step, "gradient norm")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # now, not at the next backward: idle through the next forward
        lr = scheduler.get_last_lr()[0]  # the rate this step used
        scheduler.step()

        # ---- 3. log -----------------------------------------------------------------------------------
        step_time = time.time() - t0
        scores = distributed.concat(torch.cat([chosen, rejected]).detach())  # every rank's: min and max too
        stats = {
            "loss": loss.item(),
            "accuracy": (chosen > rejected).float().mean().item(),
            "margin": (chosen - rejected).mean().item(),
            "mean_reward": scores.mean().item(),
            "min_reward": scores.min().item(),
            "max_reward": scores.max().item(),
            "grad_norm": grad_norm.item(),
            "lr": lr,
            "time/step": step_time,
        }
        stats = distributed.mean_over_ranks(stats)  # equal shares, or the same number on every rank
        run.log(step, stats, {"loss": f"{stats['loss']:.4f}", "acc": f"{stats['accuracy']:.2f}"})

        # ---- 4. evaluate and checkpoint ----------------------------------------------------------
        run.evaluate(step, report)
        run.save_if_due(step)

    return run.finish(
        report,
        lambda before, after: {
            "pair_accuracy_before": before["eval/accuracy"],
            "pair_accuracy_after": after["eval/accuracy"],
            **{f"{k}_after": v for k, v in after.items() if k.startswith("agreement/")},
            "pairs_train": len(train_pairs),
            "pairs_heldout": len(heldout_pairs),
        },
        lambda before, after: (
            f"held-out pair accuracy {before['eval/accuracy']:.3f} -> {after['eval/accuracy']:.3f}"
        ),
    )


if __name__ == "__main__":
    runs.cli(main, Args)
