"""Test-only entry: `python tests/fixed_completions.py grpo.py ARGS...`, alone or under torchrun, runs the script with
its completions fixed by the prompts and a reward the random tiny model can earn. Each rank samples from its own
generator, so one process and N ranks never draw the same completions; with these fixed ones they train on the same
batch, and tests/test_distributed.py compares the weights. SAMPLE=1 keeps the sampling (only the reward is replaced).
"""

import os
import runpy
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import common  # noqa: E402
from task import tasks  # noqa: E402


def fixed_completions(model, prompt_ids, prompt_mask, num_samples, max_new_tokens, eos, pad, *args, **kwargs):
    """Completion j of a prompt: characters and a length (EOS, then padding) that follow from the prompt's tokens and
    j alone, never from its padding or its row, so any split of the batch gives each prompt the same completions."""
    rows = []
    for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist()):
        s = sum(i * m for i, m in zip(ids, mask))
        for j in range(num_samples):
            # from 2 tokens to max_new_tokens (then cut, no EOS)
            length = 2 + (s + 5 * j) % (max_new_tokens - 1)
            # characters of the tiny vocab
            tokens = [4 + (s * (j + 1) + 13 * k) % 96 for k in range(length)] + [eos]
            rows.append((tokens + [pad] * max_new_tokens)[:max_new_tokens])
    return torch.tensor(rows, device=prompt_ids.device)


def digit_fraction(completion: str, answer: str) -> float:
    """A reward the random tiny model earns in varied amounts: the share of its characters that are digits."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


def sampler_from(completions_of):
    """A stand-in for common.sample_with_logprobs made from one for common.sample_completions (same arguments, the
    completions alone): its completions, and the log-probs the trainer's forward gives them, as a sampler that
    agrees with the trainer would return them (0 after EOS, and when greedy)."""

    def sample(
        model, prompt_ids, prompt_mask, num_samples, max_new_tokens, eos, pad, temperature=1.0, *args, **kw
    ):
        ids = completions_of(
            model, prompt_ids, prompt_mask, num_samples, max_new_tokens, eos, pad, temperature, *args, **kw
        )
        mask = common.completion_mask(ids, eos)
        if temperature == 0:
            return ids, torch.zeros(ids.shape)
        repeats = torch.full((len(prompt_ids),), len(ids) // len(prompt_ids))
        with torch.no_grad():
            logprobs, _ = common.completion_logprobs(
                model, prompt_ids, prompt_mask, ids, repeats, temperature
            )
        return ids, logprobs * mask

    return sample


if __name__ == "__main__":
    if os.environ.get("SAMPLE") != "1":
        common.sample_with_logprobs = sampler_from(fixed_completions)
    tasks.VERIFIERS["last-number"] = digit_fraction  # GRPO's reward
    tasks.verify = digit_fraction  # PPO's --reward verifier, and held-out accuracy
    sys.argv = sys.argv[1:]
    runpy.run_path(str(REPO / sys.argv[0]), run_name="__main__")
