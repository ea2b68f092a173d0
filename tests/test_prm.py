"""prm.py: step cutting, Math-Shepherd labels from fixed rollouts, the loss by hand, where the score is read, the
aggregates, the dense reward, and runs through main and the command line."""

import json
import math
import os

import pytest
import torch

import common
from infra import models
from task import tasks
import prm
from conftest import RUN_FILES, args_of, assert_resume_is_exact, metrics_of, run_script
from prm import Args, aggregate_steps, batch_labels, best_of_n_accuracy, main, prm_loss, step_labels
from task.stepwise import (
    dense_step_rewards,
    read_at_step_ends,
    score_steps,
    split_steps,
    step_end_tokens,
    tokenize_steps,
)


def tiny_args(tmp_path, **overrides) -> Args:
    defaults = dict(
        model="tiny",
        steps=2,
        batch_size=4,
        num_problems=8,
        eval_size=4,
        num_solutions=2,
        num_rollouts=2,
        max_new_tokens=16,
        output_dir=str(tmp_path / "runs"),
        lr=1e-3,
        warmup_steps=1,
    )
    return args_of(Args, **{**defaults, **overrides})


# ---- step cutting ---------------------------------------------------------------------------------------------------
def test_step_cutting_on_ragged_text(tokenizer):
    # blank and whitespace-only lines are no step; leading and trailing spaces and tabs are left out; the last line
    # has no newline
    text = "12 + 3 = 15\n\n  15 - 4 = 11 \n\t \n11 + 1 = 12"
    spans = split_steps(text)
    assert [text[a:b] for a, b in spans] == ["12 + 3 = 15", "15 - 4 = 11", "11 + 1 = 12"]
    assert spans == [(0, 11), (15, 26), (31, 42)]
    assert split_steps("") == [] and split_steps(" \n\n") == [] and split_steps("42") == [(0, 2)]
    # offsets of a BPE that merges "15\n" into one token (1) and "\n11" into another (3): the step's last token is the
    # one holding its last character, also when it holds the newline after it
    offsets = [(0, 1), (1, 4), (4, 5), (5, 8), (8, 9)]  # "a", "15\n", "b", "\n11", "c" of "a15\nb\n11c"
    assert step_end_tokens(offsets, [(0, 3), (4, 5), (6, 9)]) == [1, 2, 4]
    # a byte-level BPE splits "€" into three tokens with the same offsets: the step "5€" ends at the last of them
    offsets = [(0, 1), (1, 2), (1, 2), (1, 2), (2, 3), (3, 4)]  # "5", "€" as 3 bytes, "\n", "7" of "5€\n7"
    assert step_end_tokens(offsets, [(0, 2), (3, 4)]) == [3, 5]
    # the tiny tokenizer (one token a character): each step's last token decodes to its last character
    ids, mask, ends, step_mask = tokenize_steps(tokenizer, [text, "7"], "cpu")
    assert ends.tolist() == [[10, 25, 41], [0, 0, 0]] and step_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert [tokenizer.decode(ids[0, e]) for e in ends[0]] == ["5", "1", "2"]
    assert mask.sum(1).tolist() == [len(text), 1] and (ids[1, 1:] == tokenizer.pad_token_id).all()


# ---- labels from fixed rollouts -------------------------------------------------------------------------------------
PROBLEM = tasks.Problem("What is 10 + 5 - 3 + 1?", "13")
# wrong from its second step
SOLUTIONS = [
    "10 + 5 = 15\n15 - 3 = 12\n12 + 1 = 13",  # right throughout
    "10 + 5 = 15\n15 - 3 = 11\n11 + 1 = 12",
]
# the completions the policy gives, by the last line of what it continues ("assistant" ends the bare chat prompt)
# 0 of 4
ROLLOUTS = {
    "assistant": SOLUTIONS,
    "10 + 5 = 15": ["15 - 3 = 12\n12 + 1 = 13", "15 - 3 = 11\n11 + 1 = 12", "7", "13"],  # 2 of 4 reach 13
    "15 - 3 = 12": ["12 + 1 = 13", "12 + 1 = 13", "12 + 1 = 14", "13"],  # 3 of 4
    "15 - 3 = 11": ["11 + 1 = 12"] * 4,
}


def test_hard_and_soft_labels_from_fixed_rollouts(tokenizer, monkeypatch):
    continued = []

    def fake_sampler(model, prompt_ids, prompt_mask, num_samples, *args, **kwargs):
        texts = []
        for ids, mask in zip(prompt_ids, prompt_mask):
            prompt = tokenizer.decode(ids[mask.bool()])
            continued.append(prompt)
            last_line = prompt.rstrip("\n").split("\n")[-1]
            texts += (ROLLOUTS[last_line.removeprefix("<|im_start|>")] * num_samples)[:num_samples]
        return tasks.tokenize_completions(tokenizer, texts, "cpu")[0]

    monkeypatch.setattr(common, "sample_completions", fake_sampler)
    rows = prm.label_solutions(
        torch.nn.Linear(1, 1),
        tokenizer,
        [PROBLEM],
        num_solutions=2,
        num_rollouts=4,
        max_new_tokens=32,
        temperature=1.0,
        seed=0,
    )
    assert [r["completion"] for r in rows] == SOLUTIONS and [r["correct"] for r in rows] == [1, 0]
    # step 1 (shared): 2 of 4; step 2: 3 of 4, or 0 of 4 after the wrong step; the last step: the solution's own answer
    assert [r["rollouts_correct"] for r in rows] == [[2, 3, 4], [2, 0, 0]]
    # each rollout continues the prompt and the steps so far, up to and including the step labelled, and a newline
    prompt = tasks.format_prompt(tokenizer, PROBLEM.prompt)
    assert continued[1:] == [
        prompt + "10 + 5 = 15\n",
        prompt + "10 + 5 = 15\n15 - 3 = 12\n",
        prompt + "10 + 5 = 15\n",
        prompt + "10 + 5 = 15\n15 - 3 = 11\n",
    ]
    hard = [step_labels(torch.tensor(r["rollouts_correct"]), 4, "hard").tolist() for r in rows]
    soft = [step_labels(torch.tensor(r["rollouts_correct"]), 4, "soft").tolist() for r in rows]
    assert hard == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]  # any rollout reaches 13
    assert soft == [[0.5, 0.75, 1.0], [0.5, 0.0, 0.0]]  # the fraction that do
    assert prm.batch_labels(rows[1:] + rows[:1], "soft", 4, "cpu").tolist() == [
        [0.5, 0, 0, 0],
        [0.5, 0.75, 1, 0],
    ]


# ---- the loss -------------------------------------------------------------------------------------------------------
def test_prm_loss_by_hand():
    # z = 0, y = 1: log 2 = 0.693147; z = 2, y = 0: log(1 + e^2) = 2.126928;
    # z = -1, y = 0.5 (soft): 0.5·log(1 + e^1) + 0.5·log(1 + e^-1) = 0.5·(1.313262 + 0.313262) = 0.813262;
    # the padded step (z = 5, y = 1) counts for nothing: mean (0.693147 + 2.126928 + 0.813262) / 3 = 1.211112
    logits = torch.tensor([[0.0, 2.0], [-1.0, 5.0]])
    labels, step_mask = torch.tensor([[1.0, 0.0], [0.5, 1.0]]), torch.tensor([[1, 1], [1, 0]])
    assert prm_loss(logits, labels, step_mask).item() == pytest.approx(1.211112, abs=1e-6)
    # a soft label is its own best prediction: σ(z) = 0.75 (z = log 3) has zero gradient at y = 0.75
    z = torch.tensor([[math.log(3.0)]], requires_grad=True)
    prm_loss(z, torch.tensor([[0.75]]), torch.ones(1, 1)).backward()
    assert z.grad.item() == pytest.approx(0.0, abs=1e-6)


# ---- where the score is read ----------------------------------------------------------------------------------------
def test_read_at_step_ends_by_hand():
    token_scores = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]])
    step_ends, step_mask = torch.tensor([[1, 3], [2, 0]]), torch.tensor([[1, 1], [1, 0]])
    # row 2 has one step; its padded slot reads 0, never token 0's 0.5
    torch.testing.assert_close(
        read_at_step_ends(token_scores, step_ends, step_mask), torch.tensor([[0.2, 0.4], [0.7, 0.0]])
    )


def test_score_is_read_at_the_step_ends_whatever_the_padding(tiny_name_and_tokenizer):
    """In a batch with prompts and completions of different lengths, each step's logit is the head on the last token
    of prompt + steps so far, scored alone and unpadded (tiny-gpt2: absolute positions, pad = EOS)."""
    name, tokenizer = tiny_name_and_tokenizer
    model = models.load_model(name, len(tokenizer), torch.device("cpu"), "fp32", seed=0, head="score").eval()
    prompts, completions = ["What is 10 + 5 - 3?", "What is 7 + 1?"], ["10 + 5 = 15\n15 - 3 = 12", "  8\n"]
    with torch.no_grad():
        logits, step_mask = score_steps(model, tokenizer, prompts, completions)
        assert step_mask.tolist() == [[1, 1], [1, 0]] and logits[1, 1] == 0
        for row, (prompt, completion) in enumerate(zip(prompts, completions)):
            prompt_ids = tokenizer(tasks.format_prompt(tokenizer, prompt), add_special_tokens=False).input_ids
            completion_ids = tokenizer(completion, add_special_tokens=False).input_ids
            for k, (_, end) in enumerate(split_steps(completion)):
                # one character a token: end is a count
                alone = torch.tensor([prompt_ids + completion_ids[:end]])
                expected = common.reward_scores(model, alone, torch.ones_like(alone)).item()
                assert logits[row, k].item() == pytest.approx(expected, abs=1e-5), (row, k)


# ---- uses: best-of-N and the dense reward --------------------------------------------------------------------------
def test_min_and_product_aggregation_by_hand():
    probs = torch.tensor([[0.9, 0.5, 0.8], [0.6, 0.7, 0.1], [0.3, 0.3, 0.3]])
    # row 2's third step is padding; row 3 has none
    step_mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    # min: 0.5 and 0.6 (never row 2's padded 0.1); product: 0.9·0.5·0.8 = 0.36 and 0.6·0.7 = 0.42; no step scores 0
    assert aggregate_steps(probs, step_mask, "min").tolist() == pytest.approx([0.5, 0.6, 0.0])
    assert aggregate_steps(probs, step_mask, "product").tolist() == pytest.approx([0.36, 0.42, 0.0])
    # a batch in which no solution has a step (an evaluation chunk of one-line answers): every score is 0
    for how in ("min", "product"):
        assert aggregate_steps(torch.zeros(2, 0), torch.zeros(2, 0), how).tolist() == [0.0, 0.0]
    # best-of-2 on two problems, solutions [row 1, row 2] and [row 2, row 1], row 1 right: min picks row 2 (0.6 > 0.5)
    # and is wrong both times; product too (0.42 > 0.36); the mean would pick row 1 (0.733 > 0.65) and be right
    scores = aggregate_steps(probs[[0, 1, 1, 0]], step_mask[[0, 1, 1, 0]], "min")
    assert best_of_n_accuracy(scores, torch.tensor([1.0, 0.0, 0.0, 1.0]), 2) == 0.0
    assert best_of_n_accuracy(-scores, torch.tensor([1.0, 0.0, 0.0, 1.0]), 2) == 1.0


def test_dense_step_rewards_by_hand():
    # row 1: steps end at tokens 0 (a one-token first step) and 3; row 2: one step at token 2, its padding points at 0
    scores, step_ends = torch.tensor([[0.9, 0.2], [0.7, 0.4]]), torch.tensor([[0, 3], [2, 0]])
    rewards = dense_step_rewards(scores, step_ends, torch.tensor([[1, 1], [1, 0]]), num_tokens=5)
    torch.testing.assert_close(rewards, torch.tensor([[0.9, 0.0, 0.0, 0.2, 0.0], [0.0, 0.0, 0.7, 0.0, 0.0]]))
    # the padded slot (index 0, score 0) must not overwrite a real first step ending at token 0
    rewards = dense_step_rewards(
        torch.tensor([[0.9, 0.4]]), torch.tensor([[0, 0]]), torch.tensor([[1, 0]]), 3
    )
    torch.testing.assert_close(rewards, torch.tensor([[0.9, 0.0, 0.0]]))


# ---- runs -----------------------------------------------------------------------------------------------------------
def test_smoke_run_through_main_hard_min_then_soft_product_from_the_cache(tmp_path, preference_cache):
    result = main(tiny_args(tmp_path))
    assert sorted(os.listdir(result["run_dir"])) == RUN_FILES
    assert result["solutions_heldout"] == 4 * 2 and result["solutions_train"] > 0
    for key in (
        "step_accuracy_before",
        "step_accuracy_after",
        "best_of_n_accuracy_after",
        "sample_accuracy_after",
        "oracle_accuracy_after",
    ):
        assert 0.0 <= result[key] <= 1.0, key
    rows = metrics_of(result)
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    (folder,) = (preference_cache / "prm-data").iterdir()  # written whole: no .tmp left beside it
    assert sorted(os.listdir(folder)) == ["heldout.jsonl", "train.jsonl"]
    held = [json.loads(line) for line in open(folder / "heldout.jsonl")]
    assert {r["prompt"] for r in held} == {p.prompt for p in tasks.multistep_problems(0, 1, 4)[1]}
    # --label and --aggregate change no sampled data: the second run reads the same folder
    again = main(tiny_args(tmp_path, label="soft", aggregate="product"))
    assert list((preference_cache / "prm-data").iterdir()) == [folder] and math.isfinite(
        metrics_of(again)[0]["loss"]
    )


def test_resume_continues_exactly(tmp_path, preference_cache):
    assert_resume_is_exact(tmp_path, main, lambda out, **kw: tiny_args(out, eval_every=2, **kw))


def test_cli_smoke_run(tmp_path):
    proc = run_script(
        "prm.py",
        "--model",
        "tiny",
        "--steps",
        "3",
        "--output-dir",
        str(tmp_path / "runs"),
        RLHF_CACHE=str(tmp_path / "cache"),
        OMP_NUM_THREADS="1",
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out step accuracy" in proc.stdout and "best-of-N accuracy" in proc.stdout
    assert len(os.listdir(tmp_path / "runs")) == 1


def test_step_labels_hard_and_soft_and_their_padded_batch_by_hand():
    # 4 rollouts a step: 0, 1 and 4 of them reach the answer. hard: any did; soft: the share that did
    correct = torch.tensor([0, 1, 4])
    assert step_labels(correct, 4, "hard").tolist() == [0.0, 1.0, 1.0]
    assert step_labels(correct, 4, "soft").tolist() == [0.0, 0.25, 1.0]
    rows = [{"rollouts_correct": [2, 0], "rollouts": 4}, {"rollouts_correct": [1, 1, 2], "rollouts": 2}]
    # zero-padded to K = 4, whatever the longest row: the padding is never a label of 1
    assert batch_labels(rows, "soft", 4, "cpu").tolist() == [[0.5, 0.0, 0.0, 0.0], [0.5, 0.5, 1.0, 0.0]]
