"""The rewards grpo.py --rewards adds beside `correct` (the verifier's 0/1, or a reward model's score): each a pure
function (completion, answer) -> float, summed with --reward-weights.

    format      DeepSeek-R1's format reward: 1.0 for `<think> … </think><answer> … </answer>`, else 0.0
    repetition  minus the share of the completion's word 3-grams that repeat an earlier one: 0.0 for text that never
                repeats itself, towards -1.0 for a loop (`14 + 95 = 14 + 95 = 14 + 96`: -4/9)
"""

from __future__ import annotations

import re

_NO_TAG = r"(?:(?!</?(?:think|answer)>).)+"  # one or more characters, none of them starting a tag
_R1_FORM = re.compile(rf"<think>({_NO_TAG})</think>\s*<answer>({_NO_TAG})</answer>", re.DOTALL)


def format_reward(completion: str, answer: str = "") -> float:
    """1.0 if the completion is exactly `<think>…</think>` then `<answer>…</answer>`, each holding a non-space
    character, with only whitespace around and between them and no tag inside, else 0.0: DeepSeek-R1's format
    reward. It pays the form only (`answer` is unused; whether the answer is right is the verifier's job), so text
    after </answer> earns 0."""
    form = _R1_FORM.fullmatch(completion.strip())
    if form is None:
        return 0.0
    reasoning, stated = form.groups()
    return float(bool(reasoning.strip()) and bool(stated.strip()))  # "<think> </think>" is empty too


REPETITION_N = (
    3  # words in an n-gram: "14 + 95" repeated is a repeat; "= 85" at the end of two answers is not
)


def repetition_penalty(completion: str, answer: str = "") -> float:
    """-(repeated n-grams / n-grams) over the completion's words, n = REPETITION_N: an n-gram counts as repeated when
    the same n words came earlier in the completion. 0.0 for fewer than n words. `answer` is unused: the term pays
    the form, as format_reward does, and a weight (--reward-weights) sets its price against being right."""
    words = completion.split()
    grams = [tuple(words[i : i + REPETITION_N]) for i in range(len(words) - REPETITION_N + 1)]
    if not grams:
        return 0.0
    seen = set()
    repeated = 0
    for gram in grams:
        repeated = repeated + (gram in seen)
        seen.add(gram)
    return -repeated / len(grams)


# the rewards grpo.py --rewards names beside `correct`
REWARDS = {"format": format_reward, "repetition": repetition_penalty}
