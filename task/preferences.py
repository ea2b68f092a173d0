"""Preference data: the pairs DPO, the reward model and the offline variants learn from, and their log-probs.

Without a --dataset, pairs are the reference model's own samples on training problems, labelled by the task's
verifier and paired correct-with-incorrect, built once and cached; with one, the user's JSONL of prompt, chosen,
rejected. `sequence_logps` turns (prompt, completion) text into log π(y|x), the quantity every preference loss
compares. The task itself (problems, verifier, prompts) is task/tasks.py's.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Callable, Optional

import torch

import common
from infra import distributed
from infra import models
from infra import runs
from task import tasks
from common import InputError


def label_samples(
    model,
    tokenizer,
    problems: list[tasks.Problem],
    samples_per_prompt: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    label_fn: Callable[[str, str], float] = tasks.verify,
    prompts_per_batch: int = 32,
    desc: str = "sampling preference data (once, then cached)",
) -> list[dict]:
    """G samples per problem, each labelled by the verifier: rows {prompt, answer, completion, label (1 or 0),
    finished (the model emitted EOS within max_new_tokens; a truncated sample must not get one later)}."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = []
    bar = runs.progress(len(problems), desc)
    for start in range(0, len(problems), prompts_per_batch):
        batch = problems[start : start + prompts_per_batch]
        ids, mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in batch], device)
        completion_ids = common.sample_completions(
            model, ids, mask, samples_per_prompt, max_new_tokens, eos, pad, temperature, 1.0, generator
        )
        texts = tasks.decode_completions(
            tokenizer, completion_ids, common.completion_mask(completion_ids, eos)
        )
        # (B,) the first EOS ends a row, also when pad == eos
        finished = (completion_ids == eos).any(1).tolist()
        for i, text in enumerate(texts):
            p = batch[i // samples_per_prompt]
            rows.append(
                {
                    "prompt": p.prompt,
                    "answer": p.answer,
                    "completion": text,
                    "label": int(label_fn(text, p.answer) > 0),
                    "finished": finished[i],
                }
            )
        bar.update(len(batch))
    bar.close()
    return rows


def pair_samples(samples: list[dict]) -> list[dict]:
    """(prompt, chosen, rejected) rows: each prompt's i-th correct completion with its i-th incorrect one. Every
    completion is used at most once, so a prompt gives min(#correct, #incorrect) pairs and a prompt whose samples
    are all right or all wrong gives none. Empty completions are skipped."""
    by_prompt: dict[str, list[dict]] = {}
    for s in samples:
        if s["completion"].strip():
            by_prompt.setdefault(s["prompt"], []).append(s)
    pairs = []
    for prompt, group in by_prompt.items():
        chosen = [s for s in group if s["label"] == 1]
        rejected = [s for s in group if s["label"] == 0]
        pairs += [
            {
                "prompt": prompt,
                "chosen": c["completion"],
                "rejected": r["completion"],
                "answer": group[0]["answer"],
                "chosen_finished": c.get("finished", True),
                "rejected_finished": r.get("finished", True),
            }
            for c, r in zip(chosen, rejected)
        ]
    return pairs


def pair_completions(pairs: list[dict]) -> tuple[list[str], list[bool]]:
    """Chosen and rejected interleaved [chosen_0, rejected_0, chosen_1, ...], and whether each ended with EOS
    (a user's pairs are finished answers; sampled ones say so in chosen_finished / rejected_finished)."""
    texts = [p[k] for p in pairs for k in ("chosen", "rejected")]
    finished = [bool(p.get(f"{k}_finished", True)) for p in pairs for k in ("chosen", "rejected")]
    return texts, finished


def preference_data(
    model_name: str,
    tokenizer,
    seed: int,
    num_prompts: int,
    samples_per_prompt: int,
    max_new_tokens: int,
    temperature: float,
    device: torch.device,
    precision: str,
    eval_size: int = tasks.DEFAULT_EVAL_SIZE,
) -> tuple[dict[str, list[dict]], Path]:
    """Train pairs, held-out pairs and held-out samples from the reference model, built once and cached as JSONL.

    `num_prompts` distinct arithmetic problems (never one of the `eval_size` accuracy problems, nor of the default
    200: tasks.training_exclusion) are each sampled `samples_per_prompt` times; the first eighth of the prompts are held
    out, so no held-out pair shares a prompt with a training pair. The folder is keyed by everything that changes
    the data (eval_size only above 200, where it does) and written whole or not at all; delete it to rebuild.
    Returns ({"train", "heldout", "heldout_samples"}, folder)."""
    # v2: samples record whether they finished (v1 gave every sample an EOS, truncated ones too)
    # A checkpoint folder is keyed by its full path too (every run's is called .../model); plain prompts by "-plain".
    model_key = Path(model_name).name + (
        f"-{hashlib.sha1(str(Path(model_name).resolve()).encode()).hexdigest()[:8]}"
        if os.path.isdir(model_name)
        else ""
    )
    prompt_key = "" if tokenizer.chat_template else "-plain"
    eval_key = f"-eval{eval_size}" if eval_size > tasks.DEFAULT_EVAL_SIZE else ""
    key = (
        f"v2-{model_key}-seed{seed}-prompts{num_prompts}-samples{samples_per_prompt}-tokens{max_new_tokens}"
        f"-temp{temperature:g}-{precision}{prompt_key}{eval_key}"
    )
    folder = runs.CACHE_DIR / "preference-data" / key
    if not folder.exists() and distributed.is_main():  # under torchrun rank 0 builds it, the others wait
        problems = {}  # distinct prompts, in the order the stream first gives them
        for p in tasks.train_problems(seed, tasks.training_exclusion(eval_size)):
            problems.setdefault(p.prompt, p)
            if len(problems) == num_prompts:
                break
        kernels = models.resolve_kernels("auto", device)  # the same samples either way; faster on a CPU
        model = models.load_model(
            model_name, len(tokenizer), device, precision, seed, kernels_on=kernels
        ).eval()
        samples = label_samples(
            model, tokenizer, list(problems.values()), samples_per_prompt, max_new_tokens, temperature, seed
        )
        n_heldout = samples_per_prompt * max(1, num_prompts // 8)
        heldout = samples[:n_heldout]
        train = samples[n_heldout:]
        splits = {
            "heldout_samples": heldout,
            "train_samples": train,
            "heldout": pair_samples(heldout),
            "train": pair_samples(train),
        }
        tasks.write_splits(folder, splits)
    distributed.barrier()
    data = tasks.read_splits(folder, ("train", "heldout", "heldout_samples"))
    for name in ("train", "heldout"):
        if not data[name]:
            accuracy = sum(s["label"] for s in data["heldout_samples"]) / max(1, len(data["heldout_samples"]))
            raise InputError(
                f"no {name} preference pairs: the {model_name} samples in {folder} are all correct or "
                f"all wrong (held-out sample accuracy {accuracy:.2f}); use more --num-prompts, a stronger "
                "--model, or --dataset pairs.jsonl"
            )
    return data, folder


def load_preference_pairs(
    dataset: Optional[str],
    model_name: str,
    tokenizer,
    seed: int,
    num_prompts: int,
    samples_per_prompt: int,
    max_new_tokens: int,
    temperature: float,
    device,
    precision: str,
    eval_size: int = tasks.DEFAULT_EVAL_SIZE,
) -> tuple[list[dict], list[dict], list[dict]]:
    """(train pairs, held-out pairs, held-out labelled samples) for the offline scripts. Without a dataset: the
    reference model's own verifier-labelled samples (preference_data), none of them on one of the `eval_size`
    problems the script measures accuracy on. With one: the user's JSONL with prompt, chosen, rejected, shuffled by
    the seed, a tenth (at most 64) held out; it has no labelled samples."""
    if dataset is None:
        data, folder = preference_data(
            model_name,
            tokenizer,
            seed,
            num_prompts,
            samples_per_prompt,
            max_new_tokens,
            temperature,
            device,
            precision,
            eval_size,
        )
        print(f"preference pairs: {len(data['train'])} train, {len(data['heldout'])} held-out, from {folder}")
        return data["train"], data["heldout"], data["heldout_samples"]
    pairs = tasks.read_rows(dataset, ("prompt", "chosen", "rejected"))
    if len(pairs) < 2:
        raise InputError(f"{dataset}: {len(pairs)} pair; need at least 2 (one to train on, one held out)")
    random.Random(seed).shuffle(pairs)
    n_heldout = heldout_count(len(pairs))
    return pairs[n_heldout:], pairs[:n_heldout], []


def heldout_count(num_pairs: int) -> int:
    """How many of a dataset's pairs are held out: a tenth, at least 1 and at most 64."""
    return max(1, min(64, num_pairs // 10))


def sequence_logps(
    model,
    tokenizer,
    prompts: list[str],
    completions: list[str],
    max_completion_tokens: int,
    finished: Optional[list[bool]] = None,
):
    """log π(y|x) summed over each completion's tokens (EOS included) and the lengths |y|, (B,) and (B,), for
    len(completions)/len(prompts) completions per prompt, in order. Prompts get the chat template;
    completions are tokenised apart from them (tokenize_completions); each prompt is encoded once."""
    device = next(model.parameters()).device
    per_prompt = len(completions) // len(prompts)
    prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, prompts, device)
    completion_ids, mask = tasks.tokenize_completions(
        tokenizer, completions, device, max_completion_tokens, finished
    )
    repeats = torch.full((len(prompts),), per_prompt, device=device)
    logprobs, _ = common.completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, repeats)
    return common.masked_sum(logprobs, mask, dim=1), mask.sum(1).float()
