"""A solution's steps, and a process reward model's score of each: shared by prm.py, which trains the PRM, and
grpo_prm.py, which takes it as a dense reward.

A step is a line with more than whitespace (split_steps), as the task's worked answers write them
("23 + 45 = 68\n68 - 17 = 51", tasks.worked_demonstration). A PRM (prm.py: a backbone with a scalar head) reads
each step at its last token (score_steps). As a reward (dense_step_rewards) each step's score sits on its last
token and 0 on every other.

Shapes: B solutions, S prompt tokens, T completion tokens, K steps (the most in the batch).
"""

from __future__ import annotations

import re

import torch
from torch.nn.utils.rnn import pad_sequence

import common
from task import tasks


def split_steps(text: str) -> list[tuple[int, int]]:
    """The (start, end) characters of each step: a line that holds more than whitespace, without its leading and
    trailing whitespace. Blank lines are no step; a last line without a newline is one.
    "12 + 3 = 15\\n\\n  15 - 4 = 11 " -> [(0, 11), (15, 26)]"""
    # at each line's start, skip spaces and tabs; the step runs from the first to the last non-space character
    return [line.span(1) for line in re.finditer(r"^[^\S\n]*(\S(?:[^\n]*\S)?)", text, re.MULTILINE)]


def step_end_tokens(offsets: list[tuple[int, int]], step_spans: list[tuple[int, int]]) -> list[int]:
    """The index of each step's last token: the last token whose characters [start, end) hold the step's last
    character. offsets: each token's characters in the text (a fast tokenizer's offset mapping). A token that joins
    the last character with the newline after it (BPE merges) is still the step's last token; a character split
    over several byte tokens ('€' is three in a byte-level BPE, each with its offsets) ends at the last of them."""
    ends = []
    for _, last in step_spans:
        holding = [i for i, (start, end) in enumerate(offsets) if start <= last - 1 < end]
        ends.append(holding[-1])
    return ends


def read_at_step_ends(
    token_scores: torch.Tensor, step_ends: torch.Tensor, step_mask: torch.Tensor
) -> torch.Tensor:
    """Each step's score, read at its last token; 0 where the row has no such step (padding). token_scores (B, T),
    step_ends (B, K) token indices into the completion, step_mask (B, K) 1 on real steps -> (B, K)."""
    return torch.where(step_mask.bool(), token_scores.gather(1, step_ends), 0.0)


def dense_step_rewards(
    step_scores: torch.Tensor, step_ends: torch.Tensor, step_mask: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """The PRM as a dense reward: each step's score on its last completion token, 0 on every other token.
    step_scores, step_ends, step_mask (B, K) -> (B, T = num_tokens).

    ppo.py would add these to kl_penalized_rewards' per-token rewards in place of the single score on the last
    token (Math-Shepherd's step-by-step PPO); GAE then carries each step's reward back to the tokens before it.
    grpo.py would use DeepSeekMath's process supervision (Shao et al. 2024, arXiv:2402.03300): normalise the step
    rewards over the group, and give each token the sum of the normalised rewards of the steps ending at or after
    it. step_scores is σ(z) from score_steps on the policy's completions, tokenised by tokenize_steps."""
    rewards = torch.zeros(step_scores.shape[0], num_tokens, device=step_scores.device)  # (B, T)
    # add, not scatter: padding points at token 0 too, and must not overwrite a one-token first step there
    return rewards.scatter_add(1, step_ends, step_scores * step_mask)


def tokenize_steps(tokenizer, completions: list[str], device) -> tuple[torch.Tensor, ...]:
    """Completion ids and mask (B, T), right-padded, no EOS (the score is read at step ends only), and each step's
    last token and the step mask (B, K); a row with fewer steps is padded with index 0, masked."""
    encoded = [tokenizer(text, add_special_tokens=False, return_offsets_mapping=True) for text in completions]
    ends = [
        torch.tensor(step_end_tokens(e.offset_mapping, split_steps(t)), dtype=torch.long)
        for e, t in zip(encoded, completions)
    ]
    ids = [torch.tensor(e.input_ids, dtype=torch.long) for e in encoded]

    def pad(rows: list[torch.Tensor], value: int = 0) -> torch.Tensor:
        return pad_sequence(rows, batch_first=True, padding_value=value).to(device)

    return (
        pad(ids, tokenizer.pad_token_id),
        pad([torch.ones_like(i) for i in ids]),
        pad(ends),
        pad([torch.ones_like(e) for e in ends]),
    )


def score_steps(
    model, tokenizer, prompts: list[str], completions: list[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's logit z at each step's last token, and the step mask: (B, K), (B, K). The prompt is left-padded,
    the completion right-padded, positions from the mask, so padding changes no score."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, prompts, device)  # (B, S)
    completion_ids, completion_mask, step_ends, step_mask = tokenize_steps(tokenizer, completions, device)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, S+T)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    with common.autocast(model):
        hidden = (
            common.unwrap(model)
            .base_model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=common.position_ids(attention_mask),
            )
            .last_hidden_state
        )
        token_logits = common.unwrap(model).score(hidden).squeeze(-1).float()  # (B, S+T)
    return read_at_step_ends(token_logits[:, prompt_ids.shape[1] :], step_ends, step_mask), step_mask


def completion_steps(tokenizer, completion_ids: torch.Tensor, mask: torch.Tensor) -> tuple[list[str], ...]:
    """The steps of sampled completions, found on the sampled tokens themselves: each row's text (its tokens decoded
    one by one, special tokens dropped), and the index of each step's last token among them with the step mask,
    (B, K) each. completion_ids, mask (B, T). Re-tokenising the text could split it otherwise; these indices are
    the tokens the policy is updated on."""
    texts = []
    ends = []
    for row, row_mask in zip(completion_ids.tolist(), mask.tolist()):
        pieces = [tokenizer.decode([token], skip_special_tokens=True) for token, m in zip(row, row_mask) if m]
        offsets = []
        for piece in pieces:  # each token's [start, end) characters in the joined text
            start = offsets[-1][1] if offsets else 0
            offsets.append((start, start + len(piece)))
        texts.append("".join(pieces))
        ends.append(torch.tensor(step_end_tokens(offsets, split_steps(texts[-1])), dtype=torch.long))
    step_ends = pad_sequence(ends + [torch.zeros(0, dtype=torch.long)], batch_first=True)[:-1]
    step_mask = pad_sequence([torch.ones_like(e) for e in ends] + [step_ends.new_zeros(0)], batch_first=True)[
        :-1
    ]
    return texts, step_ends.to(mask.device), step_mask.to(mask.device)


def process_advantages(
    step_rewards: torch.Tensor,  # (B, K) the PRM's score of each step
    step_ends: torch.Tensor,  # (B, K) each step's last completion token
    step_mask: torch.Tensor,  # (B, K) 1 on real steps
    group_size: int,
    num_tokens: int,
    scale_by_std: bool = True,
    eps: float = 1e-4,
) -> torch.Tensor:
    """DeepSeekMath §4.1.3, process supervision, (B, K) -> (B, T): every step reward of a group's G completions
    normalised together, r̃ = (r - mean(R)) / (std(R) + eps) (population std; with scale_by_std=False, Dr. GRPO's
    r - mean(R)), and each token's advantage the sum of r̃ over the steps that end at or after it. Tokens after the
    last step's end (EOS) get 0. A group whose step rewards are all equal gets exactly 0, as group_advantages: the
    float32 mean of three 0.9s is 6e-8 off 0.9, and ÷ (0 + eps) would turn that rounding into an advantage."""
    grouped = step_rewards.reshape(-1, group_size * step_rewards.shape[1])  # (P, G·K)
    grouped_mask = step_mask.reshape(grouped.shape).bool()
    mean = common.masked_mean(grouped, grouped_mask, dim=1)[:, None]  # (P, 1)
    centered = grouped - mean
    if scale_by_std:
        centered = centered / (common.masked_mean(centered**2, grouped_mask, dim=1)[:, None].sqrt() + eps)
    highest = grouped.masked_fill(~grouped_mask, -torch.inf).amax(1, keepdim=True)
    lowest = grouped.masked_fill(~grouped_mask, torch.inf).amin(1, keepdim=True)
    # (B, K); a group without a step has highest < lowest, and no advantage either
    normalised = torch.where(highest <= lowest, 0.0, centered).reshape(step_rewards.shape)
    dense = dense_step_rewards(normalised, step_ends, step_mask, num_tokens)  # (B, T) r̃ at step ends
    return dense.flip(1).cumsum(1).flip(1)  # Σ_{t' >= t}


@torch.no_grad()
def process_supervision(
    prm,
    tokenizer,
    prompts: list[str],
    completion_ids: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    scale_by_std: bool = True,
) -> tuple[torch.Tensor, ...]:
    """grpo_prm.py: the PRM's σ(z) of each step of the sampled completions (B, T), and their process-supervised
    advantages: (B, T) advantages, (B, K) step scores, (B, K) step mask."""
    texts, step_ends, step_mask = completion_steps(tokenizer, completion_ids, mask)
    step_scores = torch.sigmoid(score_steps(prm, tokenizer, prompts, texts)[0])  # (B, K)
    num_tokens = completion_ids.shape[1]
    advantages = process_advantages(step_scores, step_ends, step_mask, group_size, num_tokens, scale_by_std)
    return advantages, step_scores, step_mask
