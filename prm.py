"""Process reward model (PRM): a language model with a scalar head that scores every step of a solution.

An outcome reward model (reward_model.py) scores a whole completion; a PRM scores each step, so it can say where a
solution went wrong. Its labels need no human (Math-Shepherd): from the prefix that ends at step i the policy rolls
out k completions, and step i is good when they reach the right answer. The trained PRM reranks N sampled solutions
(best-of-N) and gives a dense, per-step reward for RL (stepwise.dense_step_rewards, grpo_prm.py).

Labels (Wang et al. 2023, Math-Shepherd, arXiv:2312.08935, hard and soft estimation), for step s_i of a solution to
q with answer a*, from the answers a_1..a_k of k rollouts from the prefix (q, s_1..s_i):
    --label hard:  y_i = 1 if any a_j = a*, else 0        --label soft:  y_i = (1/k) Σ_j 1[a_j = a*]
The last step needs no rollout: its label is whether the solution's own answer is right (k of k, or 0 of k).
Loss, minimised: binary cross-entropy of the head's logit z_i at the last token of step i (soft labels as targets),
    loss = mean over the batch's steps of  -[ y_i log σ(z_i) + (1 - y_i) log(1 - σ(z_i)) ]
(Math-Shepherd sums over a solution's steps; the mean only rescales the learning rate). A solution's score:
    --aggregate min:  min_i σ(z_i) (Math-Shepherd)    --aggregate product:  Π_i σ(z_i) (Lightman et al. 2023,
    Let's Verify Step by Step, arXiv:2305.20050: the probability that every step is right)

A solution's steps are its lines with more than whitespace (split_steps), as the task's worked answers state them
("23 + 45 = 68\n68 - 17 = 51", tasks.worked_demonstration) for its multi-step chains (tasks.multistep_problems, their
own held-out set). A policy writing one line gives one step, an outcome model; an SFT policy on the worked answers
(--policy) writes steps. Evaluated before and after on the held-out problems' solutions: step-label accuracy
(σ(z) > 0.5 against y > 0.5), and best-of-N accuracy beside a random solution's and the oracle's (any of N right).

Run: python prm.py (SmolLM2-135M-Instruct, embedded); python prm.py --policy runs/sft-.../model (an SFT policy's
solutions); python prm.py --model tiny --steps 3 (a smoke run, seconds); torchrun --nproc_per_node 2 prm.py (B/2
solutions a rank, the loss divided by the whole batch's steps; rank 0 labels the solutions).

Shapes: B solutions, S prompt tokens, T completion tokens, K steps (the most in the batch).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from tqdm.auto import tqdm

import common
from infra import distributed
from infra import fsdp
from infra import models
from infra import runs
from task import stepwise, tasks
from common import require


@dataclass
class Args:
    """Process reward model on step labels from the policy's own rollouts (Math-Shepherd)."""

    # ---- experiment: what to train and how it is evaluated -------------------------------------------------------
    model: str = "smollm2"
    """backbone: smollm2 (embedded SmolLM2-135M-Instruct), tiny (random, smoke runs), or a hub id / local checkpoint"""
    policy: Annotated[Optional[str], runs.none_means("the --model itself", "MODEL")] = None
    """the language model that samples the solutions and rolls out from their steps (same tokenizer as --model)"""
    seed: int = 0
    """seed for the problems, the samples, the batch order and the score head's initialisation"""
    eval_size: int = 32
    """held-out multi-step problems; their solutions give step accuracy and best-of-N accuracy"""
    eval_every: int = 0
    """evaluate and save a checkpoint every this many steps (0 = only before and after)"""
    # ---- algorithm: the labels, the loss, the aggregate ----------------------------------------------------------
    steps: int = 60
    """optimizer steps; the training solutions are reshuffled each time they run out"""
    batch_size: int = 8
    """solutions per optimizer step (every step of each is scored)"""
    label: Literal["hard", "soft"] = "hard"
    """hard: a step is good if any rollout reaches the answer; soft: the fraction that do"""
    aggregate: Literal["min", "product"] = "min"
    """a solution's score for best-of-N: its worst step's probability, or the product of them all"""
    # ---- labels: the solutions and the rollouts sampled from the policy ------------------------------------------
    num_problems: int = 256
    """distinct training problems (never a held-out one)"""
    num_solutions: int = 4
    """solutions sampled per problem (N of best-of-N on the held-out problems)"""
    num_rollouts: int = 4
    """completions rolled out from each step's prefix (k)"""
    temperature: float = 0.7
    """sampling temperature for the solutions and the rollouts"""
    max_new_tokens: int = 64
    """length limit of a solution and of a rollout"""
    # ---- optimisation: the optimizer, memory and saving ----------------------------------------------------------
    lr: float = 1e-5
    """AdamW learning rate"""
    warmup_steps: int = 5
    """linear learning-rate warm-up steps"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm"""
    run: Annotated[runs.RunOptions, runs.FlatFlags] = runs.option_group(runs.RunOptions)
    lora: Annotated[common.LoraOptions, runs.FlatFlags] = runs.option_group(common.LoraOptions)


# ---------------------------------------------------------------------------------------------
# The math: steps (a solution's lines) and the token that ends each, labels, the loss, aggregates, dense rewards
# ---------------------------------------------------------------------------------------------
def step_labels(rollouts_correct: torch.Tensor, num_rollouts: int, kind: str) -> torch.Tensor:
    """Math-Shepherd's labels from the number of each step's k rollouts that reach the answer. (K,) -> (K,) float
    hard: 1 if any did, else 0; soft: the fraction that did."""
    return (rollouts_correct > 0).float() if kind == "hard" else rollouts_correct.float() / num_rollouts


def prm_loss(step_logits: torch.Tensor, labels: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy -[y log σ(z) + (1-y) log(1-σ(z))] of each step's logit z (B, K) against its label
    y in [0, 1] (B, K), averaged over the real steps of the batch (step_mask (B, K)). Returns a scalar."""
    losses = F.binary_cross_entropy_with_logits(step_logits, labels, reduction="none")  # (B, K)
    return common.masked_mean(losses, step_mask)


def aggregate_steps(step_probs: torch.Tensor, step_mask: torch.Tensor, how: str) -> torch.Tensor:
    """A solution's score from its steps' probabilities of being good, (B, K) -> (B,): `min` (Math-Shepherd) or
    `product` (Lightman et al. 2023). Padding counts as 1, neutral to both; a solution with no step scores 0."""
    if step_probs.shape[1] == 0:  # no solution of the batch has a step: amin over an empty axis would raise
        return step_probs.new_zeros(step_probs.shape[0])
    filled = step_probs.masked_fill(step_mask == 0, 1.0)  # (B, K)
    score = filled.amin(1) if how == "min" else filled.prod(1)  # (B,)
    return torch.where(step_mask.any(1), score, 0.0)


def best_of_n_accuracy(scores: torch.Tensor, correct: torch.Tensor, n: int) -> float:
    """The share of problems whose top-scored solution is right: scores, correct (P·N,), N a problem; ties: first."""
    best = scores.view(-1, n).argmax(1)  # (P,)
    return correct.view(-1, n).gather(1, best[:, None]).float().mean().item()


# ---------------------------------------------------------------------------------------------
# Scoring and data
# ---------------------------------------------------------------------------------------------
def batch_labels(rows: list[dict], kind: str, K: int, device) -> torch.Tensor:
    """Each row's step labels, zero-padded to K: (B, K)."""
    labels = [step_labels(torch.tensor(row["rollouts_correct"]), row["rollouts"], kind) for row in rows]
    # a row of K zeros sets the width
    return pad_sequence(labels + [torch.zeros(K)], batch_first=True)[:-1].to(device)


@torch.no_grad()
def label_solutions(
    policy,
    tokenizer,
    problems: list[tasks.Problem],
    num_solutions: int,
    num_rollouts: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    batch: int = 16,
) -> list[dict]:
    """Math-Shepherd's automatic process annotation: N solutions per problem, then k rollouts from each step's prefix
    but the last. Rows {prompt, answer, completion, correct, rollouts (k), rollouts_correct (one count per step)}."""
    device = next(policy.parameters()).device
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    generator = torch.Generator(device=device).manual_seed(seed)

    # n completions of each formatted prompt text, in order
    def sample(texts: list[str], n: int) -> list[str]:
        tokenizer.padding_side = "left"
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        ids = common.sample_completions(
            policy,
            enc.input_ids,
            enc.attention_mask,
            n,
            max_new_tokens,
            eos,
            pad,
            temperature,
            1.0,
            generator,
        )
        return tasks.decode_completions(tokenizer, ids, common.completion_mask(ids, eos))

    rows = []
    for chunk in tqdm(
        [problems[i : i + batch] for i in range(0, len(problems), batch)], "solutions", leave=False
    ):
        texts = sample([tasks.format_prompt(tokenizer, p.prompt) for p in chunk], num_solutions)
        # a problem's N are consecutive
        for p, text in zip([p for p in chunk for _ in range(num_solutions)], texts):
            rows.append(
                {
                    "prompt": p.prompt,
                    "answer": p.answer,
                    "completion": text,
                    "rollouts": num_rollouts,
                    "correct": int(tasks.verify(text, p.answer)),
                    "rollouts_correct": [],
                }
            )
    # the prefix s_1..s_i of every step but the last, each ending in the newline that starts the next step
    prefixes = [
        (row, row["completion"][:end] + "\n")
        for row in rows
        for _, end in stepwise.split_steps(row["completion"])[:-1]
    ]
    for chunk in tqdm(
        [prefixes[i : i + batch] for i in range(0, len(prefixes), batch)], "rolling out", leave=False
    ):
        texts = sample(
            [tasks.format_prompt(tokenizer, row["prompt"]) + prefix for row, prefix in chunk], num_rollouts
        )
        for j, (row, prefix) in enumerate(chunk):  # in step order: a row's prefixes are consecutive
            rollouts = texts[j * num_rollouts : (j + 1) * num_rollouts]
            row["rollouts_correct"].append(
                int(sum(tasks.verify(prefix + t, row["answer"]) for t in rollouts))
            )
    # the last step: the solution's own answer
    for row in filter(lambda row: stepwise.split_steps(row["completion"]), rows):
        row["rollouts_correct"].append(num_rollouts * row["correct"])
    return rows


def step_label_data(args: Args, tokenizer, device, precision: str) -> tuple[dict[str, list[dict]], Path]:
    """Labelled solutions of num_problems training problems and of the eval_size held-out ones (both multi-step
    chains, never sharing a prompt: tasks.training_exclusion), sampled once and cached under runs.CACHE_DIR, keyed by
    everything that changes them (not --label: rows keep the counts) and written whole or not at all."""
    name = args.policy or args.model
    model_key = Path(name).name + (
        f"-{hashlib.sha1(str(Path(name).resolve()).encode()).hexdigest()[:8]}" if os.path.isdir(name) else ""
    )
    key = (
        f"v1-{model_key}-seed{args.seed}-problems{args.num_problems}-eval{args.eval_size}-n{args.num_solutions}"
        f"-k{args.num_rollouts}-tokens{args.max_new_tokens}-temp{args.temperature:g}-{precision}"
        f"{'' if tokenizer.chat_template else '-plain'}"
    )
    folder = runs.CACHE_DIR / "prm-data" / key
    splits = ("train", "heldout")
    if not folder.exists() and distributed.is_main():  # under torchrun rank 0 labels them, the others wait
        train, heldout = tasks.multistep_problems(args.seed, args.num_problems, args.eval_size)
        policy = models.load_model(
            name,
            len(tokenizer),
            device,
            precision,
            args.seed,
            kernels_on=models.resolve_kernels("auto", device),
        ).eval()

        def label(problems: list) -> list[dict]:
            return label_solutions(
                policy,
                tokenizer,
                problems,
                args.num_solutions,
                args.num_rollouts,
                args.max_new_tokens,
                args.temperature,
                args.seed,
            )

        labelled = {"train": label(train), "heldout": label(heldout)}
        tasks.write_splits(folder, labelled)
    distributed.barrier()
    return tasks.read_splits(folder, splits), folder


@torch.no_grad()
def evaluate(
    model, tokenizer, rows: list[dict], kind: str, aggregate: str, num_solutions: int, batch=32
) -> dict:
    """Held-out step-label accuracy, and best-of-N accuracy with the `aggregate` score."""
    model.eval()
    hits = 0.0
    steps = 0
    scores = []
    for chunk in (rows[start : start + batch] for start in range(0, len(rows), batch)):
        logits, step_mask = stepwise.score_steps(
            model, tokenizer, *zip(*[(r["prompt"], r["completion"]) for r in chunk])
        )
        labels = batch_labels(chunk, kind, logits.shape[1], logits.device)
        hits += common.masked_sum(((logits > 0) == (labels > 0.5)).float(), step_mask).item()
        steps += int(step_mask.sum())
        scores.append(aggregate_steps(torch.sigmoid(logits), step_mask, aggregate))
    correct = torch.tensor([r["correct"] for r in rows], dtype=torch.float)
    return {
        "eval/step_accuracy": hits / max(1, steps),
        "eval/best_of_n_accuracy": best_of_n_accuracy(torch.cat(scores).cpu(), correct, num_solutions),
        "eval/sample_accuracy": correct.mean().item(),
        "eval/oracle_accuracy": correct.view(-1, num_solutions).amax(1).mean().item(),
    }


def check_args(args: Args) -> None:
    runs.check_options(
        args,
        at_least_one=(
            "steps",
            "batch_size",
            "eval_size",
            "num_problems",
            "num_solutions",
            "num_rollouts",
            "max_new_tokens",
        ),
        divided_over_ranks="batch_size",
        compiled_decoding=False,
    )
    require(args.temperature > 0, "--temperature must be > 0 (it samples the solutions and the rollouts)")


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    """Label solutions by rollouts, train the PRM on the step labels; returns the final metrics (also eval.json)."""
    check_args(args)
    models.set_seed(args.seed)
    device, precision, kernels_on = models.resolve_run(args.run, args.model)
    # checked before any model loads; None if new
    resumed = runs.load_trainer_state(args.run.resume, args.steps)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    data, folder = step_label_data(args, tokenizer, device, precision)
    # a solution without a step teaches nothing
    train_rows = [r for r in data["train"] if r["rollouts_correct"]]
    require(bool(train_rows), f"no training solution in {folder} has a step (a non-blank line)")
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
    # a saved checkpoint scores batches in transformers too
    model.config.pad_token_id = tokenizer.pad_token_id
    fsdp.shard(args.run.fsdp, model)  # --fsdp: 1/N of the model's weights on a rank
    optimizer, scheduler = common.make_optimizer(model, args.lr, 0.0, args.warmup_steps)
    batches = tasks.epoch_batches(len(train_rows), args.batch_size, args.steps, args.seed)
    run = runs.Run(args, "prm", tokenizer, device, resumed, lambda result: result, "eval/step_accuracy")
    run.checkpointed(model, optimizer=optimizer, scheduler=scheduler)  # the data position is the step

    def report(step: int, pass_k: int = 0) -> dict:
        result = evaluate(model, tokenizer, data["heldout"], args.label, args.aggregate, args.num_solutions)
        tqdm.write(
            f"step {step}: held-out step accuracy {result['eval/step_accuracy']:.3f}; best-of-N accuracy "
            f"{result['eval/best_of_n_accuracy']:.3f} ({args.aggregate}; random "
            f"{result['eval/sample_accuracy']:.3f}, oracle {result['eval/oracle_accuracy']:.3f})"
        )
        return result

    run.begin(report)
    for step, batch in enumerate(batches[run.first_step - 1 :], run.first_step):
        # B/N solutions on a rank
        t0 = time.time()
        rows = distributed.share([train_rows[i] for i in batch])

        # ---- 1. score every step of each solution ---------------------------------------------------------------
        model.train()
        logits, step_mask = stepwise.score_steps(
            model, tokenizer, [r["prompt"] for r in rows], [r["completion"] for r in rows]
        )
        labels = batch_labels(rows, args.label, logits.shape[1], device)  # (B, K)

        # ---- 2. binary cross-entropy on the step labels, and update -----------------------------------------------
        loss = prm_loss(logits, labels, step_mask)
        run.check_finite(loss, step)
        share = distributed.share_of(step_mask.sum())  # this rank's part of the batch's steps; 1.0 alone
        (loss * share).backward()
        distributed.all_reduce_grads(model)  # Σ over the ranks
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        run.check_finite(grad_norm, step, "gradient norm")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        # ---- 3. log -------------------------------------------------------------------------------------------------
        hits = ((logits.detach() > 0) == (labels > 0.5)).float()

        def mean(x: torch.Tensor) -> float:  # over every rank's steps
            return common.masked_mean(x, step_mask, all_sum=distributed.all_sum).item()

        stats = {
            "loss": distributed.all_sum(loss.item() * share),
            "step_accuracy": mean(hits),
            "label_mean": mean(labels),
            "steps": distributed.all_sum(int(step_mask.sum())),
            "grad_norm": grad_norm.item(),
            "lr": scheduler.get_last_lr()[0],
            "time/step": time.time() - t0,
        }
        scheduler.step()
        run.log(step, stats, {"loss": f"{stats['loss']:.4f}", "acc": f"{stats['step_accuracy']:.2f}"})

        # ---- 4. evaluate and checkpoint ---------------------------------------------------------------------------
        run.evaluate(step, report)
        run.save_if_due(step)

    return run.finish(
        report,
        lambda before, after: {
            **{
                f"{k[5:]}_{when}": v
                for when, result in (("before", before), ("after", after))
                for k, v in result.items()
            },
            "solutions_train": len(train_rows),
            "solutions_heldout": len(data["heldout"]),
        },
        lambda before, after: (
            f"held-out step accuracy {before['eval/step_accuracy']:.3f} -> {after['eval/step_accuracy']:.3f}"
        ),
    )


if __name__ == "__main__":
    runs.cli(main, Args)
