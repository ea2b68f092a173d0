"""The rewards grpo.py --rewards adds beside `correct` (the verifier's 0/1, or a reward model's score): each a pure
function (completion, answer) -> float, summed with --reward-weights.

    format      DeepSeek-R1's format reward: 1.0 for `<think> … </think><answer> … </answer>`, else 0.0
    repetition  minus the share of the completion's word 3-grams that repeat an earlier one: 0.0 for text that never
                repeats itself, towards -1.0 for a loop (`14 + 95 = 14 + 95 = 14 + 96`: -4/9)
    concise     1.0 for an answer of 1 to 8 words (`14 + 95 = 109.`), else 0.0: a length constraint beside correctness
"""

import re

_NO_TAG = r"(?:(?!</?(?:think|answer)>).)+"  # one or more characters, none of them starting a tag
_R1_FORM = re.compile(rf"<think>({_NO_TAG})</think>\s*<answer>({_NO_TAG})</answer>", re.DOTALL)


def format_reward(completion: str, answer: str) -> float:
    """1.0 if the completion is exactly `<think>…</think>` then `<answer>…</answer>`, each holding a non-space
    character, with only whitespace around and between them and no tag inside, else 0.0: DeepSeek-R1's format
    reward. It pays the form only (`answer` is unused; whether the answer is right is the verifier's job), so text
    after </answer> earns 0."""
    form = _R1_FORM.fullmatch(completion.strip())
    # "<think> </think>" is empty too
    return float(form is not None and all(part.strip() for part in form.groups()))


REPETITION_N = 3  # words in an n-gram: "14 + 95" repeated is a repeat; "= 85" ending two answers is not


def repetition_penalty(completion: str, answer: str) -> float:
    """-(repeated n-grams / n-grams) over the completion's words, n = REPETITION_N: an n-gram counts as repeated when
    the same n words came earlier in the completion. 0.0 for fewer than n words. `answer` is unused: the term pays
    the form, as format_reward does, and a weight (--reward-weights) sets its price against being right."""
    words = completion.split()
    grams = [tuple(words[i : i + REPETITION_N]) for i in range(len(words) - REPETITION_N + 1)]
    if not grams:
        return 0.0
    # every occurrence of an n-gram after its first is a repeat
    return -(len(grams) - len(set(grams))) / len(grams)


# "14 + 95 = 109." and "The answer is 109." pay; the base model's 20-word explanations do not
CONCISE_WORDS = 8


def concise_reward(completion: str, answer: str) -> float:
    """1.0 if the completion has 1 to CONCISE_WORDS words, else 0.0: a length constraint, of the kind GDPO (arXiv
    2601.05242) trains beside correctness. An empty completion earns 0: saying nothing is not a short answer. Binary
    like the verifier, so that summed with it at weights 1 and 1, right-but-long and wrong-but-short tie: the collapse
    of distinct reward combinations into one advantage that GDPO's per-reward normalisation undoes."""
    return float(1 <= len(completion.split()) <= CONCISE_WORDS)


# the rewards grpo.py --rewards names beside `correct`
REWARDS = {"format": format_reward, "repetition": repetition_penalty, "concise": concise_reward}
