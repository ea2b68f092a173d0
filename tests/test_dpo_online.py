"""dpo_online.py: the pairs the policy samples, the loss against offline DPO's, the step with no pair, resume, the
bad input and the command line."""

import math
import os

import pytest
import torch

import common
from infra import models
from infra import runs
from task import tasks
from fixed_completions import sampler_from
from conftest import (
    args_of,
    assert_one_line_error,
    assert_resume_is_exact,
    metrics_of,
    run_script,
    run_script_here,
    write,
)
from dpo import concatenated_logps, dpo_loss
from dpo_online import Args, check_args, main, sample_pairs


def tiny_args(tmp_path, **overrides) -> Args:
    defaults = dict(
        model="tiny",
        steps=2,
        batch_size=4,
        max_new_tokens=8,
        eval_size=8,
        output_dir=str(tmp_path / "runs"),
        lr=1e-3,
        warmup_steps=1,
    )
    return args_of(Args, **{**defaults, **overrides})


# ---- the pairs: two samples a problem, the verifier's order, equal labels dropped ----------------------------------
def fixed_samples(tokenizer, texts: list[str], finished: list[bool]):
    """A stand-in for common.sample_completions that returns these completions (EOS where finished), right-padded;
    sampler_from makes it one for common.sample_with_logprobs."""
    ids, _ = tasks.tokenize_completions(tokenizer, texts, "cpu", finished=finished)
    return lambda *args, **kwargs: ids


def test_online_pairs_take_the_verifiers_order_and_drop_equal_labels(monkeypatch, tokenizer):
    problems = [
        tasks.Problem("What is 3 + 4?", "7"),
        tasks.Problem("What is 1 + 1?", "2"),
        tasks.Problem("What is 2 + 3?", "5"),
        tasks.Problem("What is 4 + 5?", "9"),
    ]
    # the chosen one cut off at max_new_tokens (no EOS): it stays unfinished
    texts = [
        "3 + 4 = 8",
        "3 + 4 = 7",  # the correct one second: it is chosen all the same
        "2",
        "1 + 1 = 2",  # both right: no preference, dropped
        "no idea",
        "6",  # both wrong: dropped
        "9",
        "8",
    ]
    monkeypatch.setattr(
        common,
        "sample_with_logprobs",
        sampler_from(fixed_samples(tokenizer, texts, [True] * 6 + [False, True])),
    )
    policy = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32", seed=0)
    pairs, dropped = sample_pairs(policy, tokenizer, problems, 8, 1.0, None)
    assert dropped == 2
    assert pairs == [
        {
            "prompt": "What is 3 + 4?",
            "chosen": "3 + 4 = 7",
            "rejected": "3 + 4 = 8",
            "chosen_finished": True,
            "rejected_finished": True,
        },
        {
            "prompt": "What is 4 + 5?",
            "chosen": "9",
            "rejected": "8",
            "chosen_finished": False,
            "rejected_finished": True,
        },
    ]


# ---- the loop ------------------------------------------------------------------------------------------------------
def test_online_loss_equals_offline_dpo_on_the_same_pairs(tmp_path, monkeypatch, tokenizer):
    # The loop draws 4 problems a step from the same stream as this copy; each step's samples are, per problem,
    # [right, wrong], [wrong, right], [wrong, wrong], [right, right]: 2 pairs kept, 2 dropped.
    stream, _ = tasks.load_problems(None, 0, 8, 4)
    # the starting model
    reference = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32", seed=0)
    real, expected = common.sample_with_logprobs, []

    def two_samples(model, prompt_ids, prompt_mask, num_samples, *args, **kwargs):
        if num_samples != 2:  # the held-out evaluation's greedy answers
            return real(model, prompt_ids, prompt_mask, num_samples, *args, **kwargs)[0]
        problems = [next(stream) for _ in range(len(prompt_ids))]
        right = [f"= {p.answer}" for p in problems]
        wrong = [f"= {int(p.answer) + 1}" for p in problems]
        texts = [
            right[0],
            wrong[0],
            wrong[1],
            right[1],
            wrong[2],
            f"= {int(problems[2].answer) + 2}",
            right[3],
            f"it is {problems[3].answer}",
        ]
        # offline DPO on the same two pairs, with the policy as it is now (this step's, before its update)
        pairs = [
            {"prompt": p.prompt, "chosen": right[i], "rejected": wrong[i]} for i, p in enumerate(problems[:2])
        ]
        with torch.no_grad():
            policy_chosen, policy_rejected, _, _ = concatenated_logps(model, tokenizer, pairs, None)
            ref_chosen, ref_rejected, _, _ = concatenated_logps(reference, tokenizer, pairs, None)
        expected.append(
            dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, 0.1)[0].mean().item()
        )
        return tasks.tokenize_completions(tokenizer, texts, "cpu")[0]

    monkeypatch.setattr(common, "sample_with_logprobs", sampler_from(two_samples))
    rows = metrics_of(main(tiny_args(tmp_path, steps=2, lr=1e-2, save_model=False)))
    assert [(r["pairs/kept"], r["pairs/dropped"]) for r in rows] == [(2, 2), (2, 2)]
    assert expected[0] == pytest.approx(math.log(2), abs=1e-6)  # step 1: the policy is the reference
    assert abs(expected[1] - math.log(2)) > 1e-3  # step 2: one update later, the reference is still the start
    assert [r["loss"] for r in rows] == pytest.approx(expected, abs=1e-5)


def test_online_step_with_no_pair_makes_no_update(tmp_path):
    # the random tiny model writes no digits: both samples of every prompt are wrong, every pair is dropped
    result = main(tiny_args(tmp_path, steps=2))
    assert [(r["pairs/kept"], r["pairs/dropped"], "loss" in r) for r in metrics_of(result)] == [
        (0, 4, False)
    ] * 2


def test_online_resume_continues_exactly(tmp_path, monkeypatch):
    # a stand-in verifier that tells the random model's samples apart, so that pairs are kept and trained on
    monkeypatch.setattr(tasks, "verify", lambda completion, answer: float(len(completion) % 2))
    assert_resume_is_exact(
        tmp_path, main, lambda out, **kw: tiny_args(out, eval_every=2, temperature=1.0, **kw)
    )
    (run_dir,) = (tmp_path / "straight" / "runs").iterdir()
    assert all(r["pairs/kept"] > 0 for r in metrics_of({"run_dir": str(run_dir)}))  # every step trained


# ---- bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(beta=0.0), "--beta must be > 0"),
        (dict(label_smoothing=0.5), r"--label-smoothing must be in \[0, 0.5\)"),
        (dict(temperature=0.0), "--temperature must be > 0"),
        (dict(batch_size=0), "--batch-size must be at least 1"),
        (dict(dataset="/nonexistent.jsonl"), "no such file"),
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, **overrides))
    assert not os.path.exists(tmp_path / "runs")  # nothing was started


def test_a_dataset_answer_the_verifier_cannot_check_is_one_clear_error(tmp_path):
    text = '{"prompt": "What is 1 + 1?", "answer": "2"}\n{"prompt": "Name a colour.", "answer": "blue"}\n'
    with pytest.raises(runs.InputError, match=r"problems.jsonl: row 2: answer 'blue' is not a number"):
        main(tiny_args(tmp_path, dataset=write(tmp_path, "problems.jsonl", text)))


def test_torchrun_is_refused_before_anything_loads(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun --nproc_per_node 2 sets it
    with pytest.raises(runs.InputError, match="does not run under torchrun yet: run it alone"):
        check_args(tasks.evaluation_for_model(tiny_args(tmp_path)))


# ---- the command line ---------------------------------------------------------------------------------------------
def test_cli_tiny_run(tmp_path):
    proc = run_script(
        "dpo_online.py", "--model", "tiny", "--steps", "3", "--eval-size", "8", "--output-dir", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out accuracy" in proc.stdout
    (run_dir,) = os.listdir(tmp_path)
    # the random model writes no digits: both samples of all 8 problems are wrong, every pair dropped
    assert [row["pairs/dropped"] for row in metrics_of({"run_dir": str(tmp_path / run_dir)})] == [8, 8, 8]


def test_cli_help_lists_every_option_with_its_default():
    proc = run_script_here("dpo_online.py", "--help")
    assert proc.returncode == 0
    for flag in (
        "--model",
        "--dataset",
        "--beta",
        "--label-smoothing",
        "--temperature",
        "--batch-size",
        "--lr",
    ):
        assert flag in proc.stdout, flag
    assert "default: smollm2" in proc.stdout


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    proc = run_script_here("dpo_online.py", "--model", "tiny", "--beta", "0", "--output-dir", str(tmp_path))
    assert_one_line_error(proc, "--beta must be > 0")
