"""grpo_adaptive.py: ragged group advantages by hand, the extra samples go to the prompts whose first group agrees,
each completion scored against its own prompt, resume, bad input and the command line."""

import itertools
import os

import pytest
import torch

import grpo
from infra import runs
from conftest import (
    assert_one_line_error,
    assert_resume_is_exact,
    digit_fraction,
    metrics_of,
    run_script,
    run_script_here,
)
from grpo_adaptive import Args, main, padded_to, ragged_group_advantages
from test_grpo import tiny_args as grpo_tiny_args


def tiny_args(tmp_path, **overrides) -> Args:
    """test_grpo.py's tiny run, with this file's options: 4 prompts a step, 2 completions first, 4 at most."""
    defaults = {"prompts_per_step": 4, "first_samples": 2, "group_size": 4}
    return grpo_tiny_args(tmp_path, args_class=Args, **{**defaults, **overrides})


def test_ragged_group_advantages_by_hand():
    # group 0: rewards 1, 0, 0 (mean 1/3, population std √2/3 = 0.471405): (2/3)/0.471405 = 1.414214 and
    # (-1/3)/0.471405 = -0.707107; group 1: 1, 1, all equal: exactly 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    expected = torch.tensor([1.414214, -0.707107, -0.707107, 0.0, 0.0])
    torch.testing.assert_close(ragged_group_advantages(rewards, groups, eps=0.0), expected, atol=1e-6, rtol=0)
    # without std scaling (Dr. GRPO): r - mean only
    centred = torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0])
    torch.testing.assert_close(ragged_group_advantages(rewards, groups, scale_by_std=False), centred)
    # groups of one size: grpo.group_advantages exactly
    even = torch.tensor([0.2, 0.9, 0.4, 0.4, 0.1, 0.7])
    torch.testing.assert_close(
        ragged_group_advantages(even, torch.tensor([0, 0, 0, 1, 1, 1])), grpo.group_advantages(even, 3)
    )


def test_the_prompts_whose_first_group_agrees_are_sampled_again(tmp_path):
    # a reward of 0 for every completion: every first group agrees, every prompt gets G - G0 = 2 more, and the
    # groups still agree after them
    rows = metrics_of(main(tiny_args(tmp_path / "flat", steps=1), reward_fn=lambda completion, answer: 0.0))
    assert rows[0]["samples"] == 4 * 4 and rows[0]["frac_prompts_sampled_again"] == 1.0
    assert rows[0]["frac_reward_zero_std/after"] == 1.0
    # a reward that differs between any two completions (a new number each call): no prompt is sampled again
    calls = itertools.count()
    rows = metrics_of(
        main(tiny_args(tmp_path / "dense", steps=1), reward_fn=lambda completion, answer: float(next(calls)))
    )
    assert rows[0]["samples"] == 4 * 2 and rows[0]["frac_prompts_sampled_again"] == 0.0


@pytest.mark.parametrize("dynamic_sampling", [False, True])
def test_each_completion_is_scored_against_its_own_prompt(tmp_path, dynamic_sampling):
    # Odd answers pay digit_fraction, even ones 0: the even prompts get 2 more completions, the odd ones none,
    # so each prompt's rows are gathered from two sampling calls. The trainer's log-probs must then be the
    # sampler's on every token (fp32 on a CPU: rounding only); a completion paired with another prompt's tokens
    # would be far off.
    def by_parity(completion: str, answer: str) -> float:
        return digit_fraction(completion, answer) if int(answer) % 2 else 0.0

    # (with --dynamic-sampling the even prompts' groups, still all 0, are dropped and the rest renumbered)
    args = tiny_args(tmp_path, steps=2, max_new_tokens=8, dynamic_sampling=dynamic_sampling)
    rows = metrics_of(main(args, reward_fn=by_parity))
    assert any(0 < row["frac_prompts_sampled_again"] < 1 for row in rows)
    assert all(row["mismatch/max_log_ratio"] < 1e-4 for row in rows)


def test_resume_continues_exactly(tmp_path):
    assert_resume_is_exact(
        tmp_path,
        main,
        lambda out, **kw: tiny_args(out, beta=0.1, eval_every=2, **kw),
        reward_fn=digit_fraction,
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(first_samples=4), "--first-samples must be at least 2 and below --group-size 4"),
        (dict(first_samples=1), "--first-samples must be at least 2"),
        (dict(reward_model="runs/r"), "--reward-model is not supported here"),
        (dict(group_size=1, first_samples=2), "--group-size must be at least 2"),  # grpo.py's checks too
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, **overrides))
    assert not os.listdir(tmp_path)  # nothing was started


def test_cli_tiny_run_and_help(tmp_path):
    proc = run_script(
        "grpo_adaptive.py",
        "--model",
        "tiny",
        "--steps",
        "2",
        "--eval-size",
        "8",
        "--output-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = os.listdir(tmp_path)
    assert run_dir.startswith("grpo-adaptive-tiny-0-")
    assert "--first-samples" in run_script_here("grpo_adaptive.py", "--help").stdout
    assert_one_line_error(
        run_script_here("grpo_adaptive.py", "--model", "tiny", "--first-samples", "9"), "--first-samples"
    )


def test_padded_to_pads_on_the_right_with_the_value():
    padded = padded_to(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), 4, value=-1.0)
    assert padded.tolist() == [[1.0, 2.0, -1.0, -1.0], [3.0, 4.0, -1.0, -1.0]]
