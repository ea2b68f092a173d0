"""The task the models are trained on, and its data: arithmetic problems, the verifier, prompts, datasets.

Everything that knows *what* is learned lives here; common.py knows only *how* a model is run. Every algorithm
reports greedy held-out accuracy on the same problems with the same verifier, so all compare on one number.

Your own task: change this file only (task/preferences.py builds its pairs from it). A task provides three functions,
and the algorithm files use nothing else of it beyond the generic data helpers below them:
    heldout_problems(n)            -> list[Problem]       fixed, the same for every run; a larger n only appends
    train_problems(seed, exclude)  -> Iterator[Problem]   endless, never a held-out prompt
    verify(completion, answer)     -> float               the reward (1.0 correct, 0.0 not)
SFT's default demonstrations need a fourth, `demonstration(problem) -> str` (the worked answer). A Problem is a
prompt and a reference answer; format_prompt decides how a question is shown to the model (its chat template, or
`Question: ...\\nAnswer:` when it has none). A JSONL `--dataset` replaces the generated problems, no code changed.

No script trains on a problem it measures accuracy on: `--eval-size n` evaluates heldout_problems(n), which the
online scripts' stream (load_problems) excludes; SFT's demonstrations and the preference prompts exclude
training_exclusion(n) = heldout_problems(max(n, 200)), so their data (and its cache) is the same at every n <= 200.

`verify_strict` (grpo.py --verifier strict; `unearned` in evaluate_accuracy) pays only a result stated as one:
a restated question ("0 + 24", "the sum of 0 and 24") earns 0.0 there. The rewards grpo.py --rewards adds beside
the verifier's (DeepSeek-R1's format, a repetition penalty) are in task/rewards.py; R1_INSTRUCTION, here, asks for
R1's form.
"""

from __future__ import annotations

import codecs
import dataclasses
import itertools
import json
import math
import os
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
from tqdm.auto import tqdm

import common
from infra import distributed
from infra import runs
from common import InputError
from task import rewards


# ---------------------------------------------------------------------------------------------
# The shared task: arithmetic with a verifier
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


# (digits of a, digits of b): one-digit sums are mostly solved, two-digit ones mostly not.
DIFFICULTIES = [(1, 1), (2, 1), (2, 2)]
DEFAULT_EVAL_SIZE = 200  # every script's --eval-size for a real model
_NUMBER = re.compile(r"(?<![\d.])-?\d[\d,]*(?:\.\d+)?")


def make_problem(rng: random.Random) -> Problem:
    da, db = rng.choice(DIFFICULTIES)
    a = rng.randint(0 if da == 1 else 10, 10**da - 1)
    b = rng.randint(0 if db == 1 else 10, 10**db - 1)
    if rng.random() < 0.5:
        a, b = b, a
    return Problem(prompt=f"What is {a} + {b}?", answer=str(a + b))


# A multi-step family for the process reward model (prm.py): a chain of 2-4 operands joined by + and -, worked
# left to right, one step per line ("23 + 45 = 68\n68 - 17 = 51"). A '-' that would go below zero becomes '+', so
# every intermediate result is a plain non-negative number; the verifier reads the final one, as for the sums.
_CHAIN = re.compile(r"What is (\d+(?: [+-] \d+)+)\?")


def make_multistep_problem(rng: random.Random) -> Problem:
    total = rng.randint(10, 99)
    question = str(total)
    for _ in range(rng.randint(1, 3)):
        b, op = rng.randint(1, 99), rng.choice("+-")
        op = "+" if op == "-" and b > total else op
        total = total + b if op == "+" else total - b
        question += f" {op} {b}"
    return Problem(prompt=f"What is {question}?", answer=str(total))


def heldout_problems(
    n: int = DEFAULT_EVAL_SIZE, seed: int = 1234, make: Callable[[random.Random], Problem] = make_problem
) -> list[Problem]:
    """A fixed held-out set, distinct problems, the same for every algorithm and run seed; heldout_problems(n)
    starts with heldout_problems(m) for every m < n (training_exclusion relies on it). `make` picks the family
    (make_problem, or make_multistep_problem for prm.py)."""
    rng = random.Random(seed)
    problems = {}
    while len(problems) < n:
        p = make(rng)
        problems.setdefault(p.prompt, p)
    return list(problems.values())


def evaluation_for_model(args):
    """`args` with an unset --eval-size and --pass-k chosen for the model: 200 held-out problems and pass@8, or for
    the tiny random models, which answer nothing right, 16 problems and no pass@k, so that a smoke run takes
    seconds. args.json records the values chosen. Without GENERAL_TEXT (an algorithm file copied alone) it also
    says, once a run, that evaluate_policy skips the general text's NLL."""
    if not GENERAL_TEXT.is_file():
        tqdm.write(f"{GENERAL_TEXT} not found: skipping the general-text NLL (the forgetting measure)")
    tiny = args.model in common.TINY_MODELS
    eval_size = args.eval_size if args.eval_size is not None else 16 if tiny else DEFAULT_EVAL_SIZE
    pass_k = args.pass_k if args.pass_k is not None else 0 if tiny else 8
    return dataclasses.replace(args, eval_size=eval_size, pass_k=pass_k)


def training_exclusion(
    eval_size: int, make: Callable[[random.Random], Problem] = make_problem
) -> list[Problem]:
    """The problems the offline data (SFT's demonstrations, the preference prompts) must never train on: the
    `eval_size` evaluated ones, and never fewer than the default 200, so that data built at --eval-size <= 200 is
    the same whatever the size (a superset: heldout_problems(n) starts with heldout_problems(200))."""
    return heldout_problems(max(eval_size, DEFAULT_EVAL_SIZE), make=make)


def train_problems(
    seed: int, exclude: list[Problem], make: Callable[[random.Random], Problem] = make_problem
) -> Iterator[Problem]:
    """An endless stream of training problems from `seed` (of the family `make`) that never repeats a held-out one."""
    rng = random.Random(seed)
    held = {p.prompt for p in exclude}
    while True:
        p = make(rng)
        if p.prompt not in held:
            yield p


def multistep_problems(seed: int, num_train: int, eval_size: int) -> tuple[list[Problem], list[Problem]]:
    """(num_train distinct training chains from `seed`, the eval_size held-out chains): make_multistep_problem's own
    held-out set, never trained on (nor the default 200 of it: training_exclusion), as for the sums."""
    chain = make_multistep_problem
    stream = train_problems(seed, training_exclusion(eval_size, make=chain), make=chain)
    train: dict[str, Problem] = {}  # distinct prompts, in the stream's order
    while len(train) < num_train:
        train.setdefault((p := next(stream)).prompt, p)
    return list(train.values()), heldout_problems(eval_size, make=chain)


def extract_final_number(text: str) -> Optional[float]:
    """The last number in free text, or None. '1,234' is 1234; '5-3' is 5 and 3, not -3. Parsed with a regular
    expression and float(), never evaluated: model output is not code."""
    matches = _NUMBER.findall(text)
    # _NUMBER's matches all parse, commas removed
    return float(matches[-1].replace(",", "")) if matches else None


# DeepSeek-R1 reads the answer from its tag (Guo et al. 2025, arXiv:2501.12948, §2.2.2): when a completion has
# `<answer>…</answer>`, both verifiers score the content of the last one and nothing outside it.
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def tagged_answer(completion: str) -> Optional[str]:
    """The content of the completion's last `<answer>…</answer>`, or None when it has none."""
    tagged = _ANSWER_TAG.findall(completion)
    if not tagged:
        return None
    return tagged[-1]


def verify(completion: str, answer: str) -> float:
    """Reward 1.0 if the completion's final number equals the answer's (so '1,234' and '1234' match), else 0.0.
    A completion with `<answer>…</answer>` is scored on the tag's content alone."""
    tagged = tagged_answer(completion)
    if tagged is not None:
        completion = tagged
    value = extract_final_number(completion)
    target = extract_final_number(answer)
    return float(value is not None and target is not None and math.isclose(value, target, abs_tol=1e-9))


# The number stated as a result: right after a marker ('=', 'is', 'equals', 'equal to', 'answer', 'answer is', or the
# 's of "it's" / "that's", straight or curly apostrophe), then an optional ':' and any '**' bold or '$' sign.
_RESULT_MARKER = r"(?:=|\bis\b|\bequals\b|\bequal\s+to\b|\banswer\b(?:\s*is\b)?|['\u2019]s\b)"
_STATED_RESULT = re.compile(_RESULT_MARKER + r"\s*:?[\s*$]*(" + _NUMBER.pattern + ")", re.IGNORECASE)
# An `<answer>` tag that holds one number alone (perhaps in '**' bold, after '$', before a full stop) states it.
_TAGGED_NUMBER = re.compile(r"[\s*$]*(" + _NUMBER.pattern + r")[\s*.]*")


def verify_strict(completion: str, answer: str) -> float:
    """1.0 only if the answer is *stated as a result*: the last number that follows '=', 'is', 'equals',
    'equal to', 'answer' or "it's"/"that's" (then perhaps ':', '**' or '$') must equal it. `verify` pays for
    the last number anywhere, so `What is 0 + 24?` answered "…the sum of 0 and 24." or "0 + 24" earns 1.0
    by restating an operand; here it earns 0.0, while "0 + 24 = 24", "The sum is 24.", "The answer is: 24",
    "The total is $24." and "It's 24" earn 1.0. A bare "24" earns 0.0 too: strict means the result is stated.
    The `<answer>` tag is a statement of its own: "<answer>24</answer>" earns 1.0, and the tag's content is
    all that is read, so "<think>14 + 10 = 24</think><answer>23</answer>" earns 0.0."""
    tagged = tagged_answer(completion)
    if tagged is None:
        matches = _STATED_RESULT.findall(completion)
    elif _TAGGED_NUMBER.fullmatch(tagged):
        matches = [_TAGGED_NUMBER.fullmatch(tagged).group(1)]
    else:
        matches = _STATED_RESULT.findall(tagged)
    target = extract_final_number(answer)
    if not matches or target is None:
        return 0.0
    # every match parses
    return float(math.isclose(float(matches[-1].replace(",", "")), target, abs_tol=1e-9))


VERIFIERS = {"last-number": verify, "strict": verify_strict}

# The last sentence of DeepSeek-R1-Zero's template (Guo et al. 2025, arXiv:2501.12948, Table 1), after the question.
R1_INSTRUCTION = (
    " The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags,"
    " respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>."
)


@dataclass
class Scored:
    """What the rewards say of a batch of completions (score_completions)."""

    rewards: torch.Tensor  # (B, K), one column per reward named, in their order
    verified: torch.Tensor  # (B,) the verifier's 0/1: the true reward, logged beside a learned one
    unearned: list[float]  # (B,) paid by the last-number verifier, refused by the strict one


def score_completions(
    texts: list[str],
    answers: list[str],
    names: tuple[str, ...],
    verifier: Callable[[str, str], float],
    device,
    learned: Optional[torch.Tensor] = None,
) -> Scored:
    """Every reward of `names` for each completion: "correct" is `verifier`'s 0/1, or the learned
    reward model's scores when `learned` (B,) is given; the others task/rewards.py's."""
    verified = torch.tensor([verifier(t, a) for t, a in zip(texts, answers)], device=device)
    unearned = [verify(t, a) * (1.0 - verify_strict(t, a)) for t, a in zip(texts, answers)]
    columns = []
    for name in names:
        if name == "correct":
            columns.append(verified if learned is None else learned)
        else:
            columns.append(
                torch.tensor([rewards.REWARDS[name](t, a) for t, a in zip(texts, answers)], device=device)
            )
    return Scored(torch.stack(columns, 1), verified, unearned)


def with_prompt_style(
    style: str, train_stream: Iterator[Problem], heldout: list[Problem]
) -> tuple[Iterator[Problem], list[Problem]]:
    """The problems as grpo.py --prompt-style shows them: `question` unchanged, `r1` each question followed by
    R1_INSTRUCTION, in training and held-out alike (a model trained to the format is measured on it)."""
    if style == "question":
        return train_stream, heldout
    if style != "r1":
        raise ValueError(f"unknown prompt style {style!r}")

    def r1(p: Problem) -> Problem:
        return Problem(p.prompt + R1_INSTRUCTION, p.answer)

    return map(r1, train_stream), [r1(p) for p in heldout]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, eq. 1):
    1 − C(n−c, k) / C(n, k), as the stable product 1 − Π_{i=n−c+1..n} (1 − k/i)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, not {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def demonstration(problem: Problem) -> str:
    """The correct, short worked answer that sft.py imitates by default: `47 + 38 = 85`."""
    operands = re.fullmatch(r"What is (\d+) \+ (\d+)\?", problem.prompt)
    if operands is None:
        raise InputError(
            f"no demonstration for {problem.prompt!r}: give sft.py --dataset with prompt and completion fields"
        )
    return f"{operands[1]} + {operands[2]} = {problem.answer}"


def worked_demonstration(problem: Problem) -> str:
    """The step-by-step worked answer of a chain (make_multistep_problem), one step per line, each step the running
    result and the next operand: "What is 23 + 45 - 17?" -> "23 + 45 = 68\n68 - 17 = 51". sft.py would learn the
    form from rows {prompt, completion: worked_demonstration(p)} over the training chains of multistep_problems."""
    chain = _CHAIN.fullmatch(problem.prompt)
    if chain is None:
        raise InputError(
            f"no worked demonstration for {problem.prompt!r}: not a chain like 'What is 23 + 45 - 17?'"
        )
    tokens = chain[1].split(" ")
    total = int(tokens[0])
    lines = []
    for op, b in zip(tokens[1::2], map(int, tokens[2::2])):
        new = total + b if op == "+" else total - b
        lines.append(f"{total} {op} {b} = {new}")
        total = new
    return "\n".join(lines)


def format_prompt(tokenizer, question: str) -> str:
    """The chat template with one user turn when the tokenizer has one, else `Question: ...\\nAnswer:`."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
    return f"Question: {question}\nAnswer:"


def tokenize_prompts(tokenizer, questions: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each question as the model meets it (format_prompt, special tokens included), left-padded: ids, mask (P, S)."""
    tokenizer.padding_side = "left"
    prompts = [format_prompt(tokenizer, q) for q in questions]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.input_ids.to(device), enc.attention_mask.to(device)


def longest_prompt(tokenizer, problems: list[Problem]) -> int:
    """Tokens in the longest formatted prompt of `problems`."""
    return max(
        len(tokenizer(format_prompt(tokenizer, p.prompt), add_special_tokens=False).input_ids)
        for p in problems
    )


def decode_completions(tokenizer, completion_ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return [tokenizer.decode(ids[m.bool()], skip_special_tokens=True) for ids, m in zip(completion_ids, mask)]


@torch.no_grad()
def evaluate_accuracy(
    model,
    tokenizer,
    problems: list[Problem],
    max_new_tokens: int,
    batch_size: int = 64,
    num_samples_kept: int = 8,
    score: Optional[Callable] = None,
) -> dict:
    """Greedy held-out accuracy with the verifier, a few sample completions to read, and `unearned`: the share
    of problems whose greedy answer `verify` pays but `verify_strict` does not (never stated as a result).
    score(prompt_ids, prompt_mask, completion_ids, completion_mask, problems) -> (..., n) also scores each batch's
    completions (a reward model, in ppo.py): returned as "scores", (..., N) over all the problems. Under torchrun
    each rank decodes its share of the problems and the counts are summed (`scores`: this rank's problems only)."""
    device = next(model.parameters()).device
    correct = 0.0
    unearned = 0.0
    samples = []
    scores = []
    mine = distributed.share(problems)  # all of them in one process
    bar = runs.progress(len(mine), "held-out accuracy", leave=False)
    for start in range(0, len(mine), batch_size):
        batch = mine[start : start + batch_size]
        ids, mask = tokenize_prompts(tokenizer, [p.prompt for p in batch], device)
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        completion_ids = common.sample_completions(model, ids, mask, 1, max_new_tokens, eos, pad, 0.0)
        completion_mask = common.completion_mask(completion_ids, eos)
        for p, text in zip(batch, decode_completions(tokenizer, completion_ids, completion_mask)):
            reward = verify(text, p.answer)
            correct += reward
            unearned += reward * (1.0 - verify_strict(text, p.answer))
            if len(samples) < num_samples_kept:
                samples.append(
                    {"prompt": p.prompt, "answer": p.answer, "completion": text, "correct": bool(reward)}
                )
        if score is not None:
            scores.append(score(ids, mask, completion_ids, completion_mask, batch))
        bar.update(len(batch))
    bar.close()
    # every rank's share
    correct = distributed.all_sum(correct)
    unearned = distributed.all_sum(unearned)
    result = {
        "accuracy": correct / len(problems),
        "unearned": unearned / len(problems),
        "samples": distributed.concat(samples)[:num_samples_kept],
    }
    return {**result, "scores": torch.cat(scores, dim=-1)} if score is not None else result


@torch.no_grad()
def evaluate_pass_at_k(
    model,
    tokenizer,
    problems: list[Problem],
    k: int,
    max_new_tokens: int,
    seed: int,
    prompts_per_batch: int = 16,
) -> float:
    """pass@k on held-out problems: k completions each at temperature 1, scored by the verifier, averaged
    over problems with the unbiased estimator (n = k samples). Its own generator, seeded by `seed`, so
    before and after training draw the same random numbers and the training stream is untouched."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    total = 0.0
    bar = runs.progress(len(problems), f"held-out pass@{k}", leave=False)
    for start in range(0, len(problems), prompts_per_batch):
        batch = problems[start : start + prompts_per_batch]
        ids, mask = tokenize_prompts(tokenizer, [p.prompt for p in batch], device)
        # (len(batch)·k, T)
        completion_ids = common.sample_completions(
            model, ids, mask, k, max_new_tokens, eos, pad, temperature=1.0, top_p=1.0, generator=generator
        )
        texts = decode_completions(tokenizer, completion_ids, common.completion_mask(completion_ids, eos))
        for i, p in enumerate(batch):
            total += pass_at_k(k, int(sum(verify(t, p.answer) for t in texts[i * k : (i + 1) * k])), k)
        bar.update(len(batch))
    bar.close()
    return total / len(problems)


# ten paragraphs of everyday English prose, nothing the task rewards: the forgetting measure's text
GENERAL_TEXT = Path(__file__).resolve().parents[1] / "data" / "general.txt"


@torch.no_grad()
def general_text_nll(model, tokenizer) -> float:
    """The forgetting measure: mean negative log-likelihood per token, in nats, of GENERAL_TEXT, each paragraph
    scored from its start. Training on the narrow task can overwrite general ability ("mitigate with LoRA, a
    general-data mix, fewer epochs"); this rises when it does, and no reward in the project sees it."""
    total = 0.0
    count = 0
    for paragraph in GENERAL_TEXT.read_text().split("\n\n"):
        ids = torch.tensor(
            tokenizer(paragraph.strip(), add_special_tokens=False).input_ids, device=model.device
        )
        logits = model(ids[None]).logits[0, :-1].float()  # (T-1, V): each token predicts the next
        total += torch.nn.functional.cross_entropy(logits, ids[1:], reduction="sum").item()
        count += len(ids) - 1
    return total / count


def evaluate_policy(
    model,
    tokenizer,
    problems: list[Problem],
    max_new_tokens: int,
    seed: int,
    step: int,
    pass_k: int = 0,
    score: Optional[Callable] = None,
) -> dict:
    """The held-out evaluation every algorithm reports: greedy accuracy (evaluate_accuracy, with its `score`),
    the general text's NLL (general_text_nll, the forgetting measure; left out without GENERAL_TEXT) and, with
    pass_k, pass@k from pass_k samples a problem at temperature 1 (evaluate_pass_at_k); each said in a line.
    Under torchrun the greedy accuracy is split over the ranks; pass@k is drawn whole by each (the same numbers)."""
    model.eval()
    result = evaluate_accuracy(model, tokenizer, problems, max_new_tokens, score=score)
    if pass_k:
        # runs.Run's expected duration counts pass@k only in the last evaluation
        started = time.perf_counter()
        result[f"pass@{pass_k}"] = evaluate_pass_at_k(
            model, tokenizer, problems, pass_k, max_new_tokens, seed
        )
        result["pass_k_seconds"] = time.perf_counter() - started
        tqdm.write(
            f"step {step}: held-out pass@{pass_k} {result[f'pass@{pass_k}']:.3f} "
            f"({pass_k} samples per problem at temperature 1)"
        )
    tqdm.write(f"step {step}: held-out accuracy {result['accuracy']:.3f} ({len(problems)} problems)")
    if GENERAL_TEXT.is_file():
        result["general_nll"] = general_text_nll(model, tokenizer)
        tqdm.write(
            f"step {step}: general text NLL {result['general_nll']:.4f} nats/token (forgetting if it rises)"
        )
    return result


def before_and_after(before: dict, after: dict) -> dict:
    """eval.json's comparable numbers, in pairs: accuracy, unearned, the general text's NLL and pass@k (when
    measured), before and after."""
    keys = [
        k
        for k in after
        if (k in ("accuracy", "unearned", "general_nll") or k.startswith("pass@")) and k in before
    ]
    return {f"{k}_{when}": result[k] for k in keys for when, result in (("before", before), ("after", after))}


def load_problems(
    dataset: Optional[str], seed: int, eval_size: int, prompts_per_step: int
) -> tuple[Iterator[Problem], list[Problem]]:
    """(endless training stream, held-out problems) for the online scripts: the arithmetic task, or the
    user's JSONL with prompt and a numeric answer, shuffled by the seed, a tenth (at most eval_size) held out."""
    if dataset is None:
        heldout = heldout_problems(eval_size)
        return train_problems(seed, heldout), heldout
    rows = read_rows(dataset, ("prompt", "answer"))
    for line_no, row in enumerate(rows, 1):
        if extract_final_number(row["answer"]) is None:
            raise InputError(
                f"{dataset}: row {line_no}: answer {row['answer']!r} is not a number the verifier can check"
            )
    problems = [Problem(r["prompt"], r["answer"]) for r in rows]
    random.Random(seed).shuffle(problems)
    n_eval = max(1, min(eval_size, len(problems) // 10))
    if len(problems) - n_eval < prompts_per_step:
        raise InputError(
            f"{dataset}: {len(problems)} rows; need at least {prompts_per_step} for training beyond the held-out tenth"
        )
    return itertools.cycle(problems[n_eval:]), problems[:n_eval]


def epoch_batches(num_items: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """The item indices of each step's batch: a fresh shuffle of all items per epoch, fixed by the seed."""
    rng = random.Random(seed)
    order = []
    batches = []
    for _ in range(steps):
        if len(order) < batch_size:
            epoch = list(range(num_items))
            rng.shuffle(epoch)
            order += epoch
        batches.append(order[:batch_size])
        order = order[batch_size:]
    return batches


def tokenize_completions(
    tokenizer,
    texts: list[str],
    device,
    max_tokens: Optional[int] = None,
    finished: Optional[list[bool]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Completion ids, + EOS where the completion finished (default: all), right-padded, and their mask, (B, T).

    A sample the model cut off at max_new_tokens gets no EOS: appending one would teach DPO and the reward model
    that answers end at arbitrary cut points. Completions are tokenised apart from the prompt, which makes chosen
    and rejected share exactly the same prompt tokens (tokenising prompt + completion as one string can merge
    characters across the boundary). Completions longer than max_tokens are cut (then they end without EOS). The
    mask comes from the lengths, not from searching for EOS, so it is right when pad == eos."""
    finished = [True] * len(texts) if finished is None else finished
    rows = [
        tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] * done
        for t, done in zip(texts, finished)
    ]
    if max_tokens is not None:
        rows = [r[:max_tokens] for r in rows]
    T = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), T), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r, dtype=torch.long), 1
    return ids.to(device), mask.to(device)


# ---------------------------------------------------------------------------------------------
# Data files
# ---------------------------------------------------------------------------------------------
def write_splits(folder: Path, splits: dict[str, list[dict]]) -> None:
    """Each split as folder/<name>.jsonl, written whole or not at all (into folder.tmp, then renamed): a cache."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, rows in splits.items():
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(folder)


def read_splits(folder: Path, names) -> dict[str, list[dict]]:
    return {name: [json.loads(line) for line in open(folder / f"{name}.jsonl")] for name in names}


def read_rows(path: str, fields: tuple[str, ...]) -> list[dict]:
    """--dataset's rows, each checked to hold `fields` as strings; errors name the file and line (or row). A JSONL
    file (UTF-8, with or without a byte-order mark), or a Hugging Face dataset: a save_to_disk folder or a Hub id
    (infra/hub.py, GSM8K's fields mapped). A numeric "answer" (42, not "42") is read as its text."""
    from infra import hub

    if hub.is_hf_dataset(path):
        rows = [checked_row(row, fields, f"{path}: row {i}") for i, row in enumerate(hub.load_rows(path), 1)]
    else:
        rows = read_jsonl(path, fields)
    if not rows:
        raise InputError(f"{path}: the dataset is empty")
    return rows


def read_jsonl(path: str, fields: tuple[str, ...]) -> list[dict]:
    if not os.path.isfile(path):
        raise InputError(f"--dataset {path}: no such file")
    data = Path(path).read_bytes().removeprefix(codecs.BOM_UTF8)  # as Notepad saves UTF-8
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        # e.start counts bytes of the whole file (a text-mode read's counts within its last 8 KiB chunk)
        line_no = data[: e.start].count(b"\n") + 1
        raise InputError(
            f"{path}:{line_no}: not UTF-8 text (byte {data[e.start]:#04x}); save the file as UTF-8"
        ) from None
    rows = []
    for line_no, line in enumerate(text.split("\n"), 1):  # a Windows line's \r is JSON's whitespace
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
        rows.append(checked_row(row, fields, f"{path}:{line_no}"))
    return rows


def checked_row(row, fields: tuple[str, ...], where: str) -> dict:
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected a JSON object with fields {', '.join(fields)}")
    if isinstance(row.get("answer"), (int, float)) and not isinstance(row["answer"], bool):
        row["answer"] = str(row["answer"])
    for field in fields:
        if not isinstance(row.get(field), str) or not row[field].strip():
            raise InputError(
                f"{where}: field {field!r} missing or not a non-empty string (need {', '.join(fields)})"
            )
    return row
