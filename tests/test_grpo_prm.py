"""grpo_prm.py: the process-supervised advantages on hand-computed numbers, the steps cut at the sampled tokens, the
PRM's advantages in the loop (where every outcome is equal, under dynamic sampling, without std scaling), resume,
bad input and the command line."""

import os

import pytest
import torch

import grpo
from infra import runs
from task import stepwise
from conftest import (
    assert_one_line_error,
    assert_resume_is_exact,
    digit_fraction,
    metrics_of,
    run_script,
    run_script_here,
)
from grpo_prm import Args, main
from test_grpo import spy_on_loss
from test_grpo import tiny_args as grpo_tiny_args


def tiny_args(tmp_path, **overrides) -> Args:
    """test_grpo.py's tiny run, with this file's options."""
    return grpo_tiny_args(tmp_path, args_class=Args, **overrides)


# ---- process_advantages ---------------------------------------------------------------------------------------------
def test_process_advantages_by_hand():
    # one group of G = 2: o_0's steps score 0.9 and 0.1 and end at tokens 1 and 3; o_1's one step 0.2 ends at 2.
    # R = {0.9, 0.1, 0.2}: mean 0.4, population std sqrt(0.38 / 3) = 0.355903, so r̃ = 1.404878, -0.842927, -0.561951
    # (normalised over the group's steps, not each completion's). Token t gets Σ r̃ of the steps ending at t or later.
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.0]])
    ends = torch.tensor([[1, 3], [2, 0]])
    step_mask = torch.tensor([[1, 1], [1, 0]])
    expected = [[0.561951, 0.561951, -0.842927, -0.842927, 0.0], [-0.561951, -0.561951, -0.561951, 0.0, 0.0]]
    advantages = stepwise.process_advantages(scores, ends, step_mask, group_size=2, num_tokens=5, eps=0.0)
    torch.testing.assert_close(advantages, torch.tensor(expected), atol=1e-6, rtol=0)
    # a second group, every score 0.5 higher: the same advantages, since each group is normalised on its own
    two_groups = stepwise.process_advantages(
        torch.cat([scores, scores + 0.5]), ends.repeat(2, 1), step_mask.repeat(2, 1), 2, 5, eps=0.0
    )
    torch.testing.assert_close(two_groups, torch.tensor(expected + expected), atol=1e-6, rtol=0)
    # Dr. GRPO (--no-scale-by-std): r - mean(R) = 0.5, -0.3, -0.2, summed from each token on
    centred = [[0.2, 0.2, -0.3, -0.3, 0.0], [-0.2, -0.2, -0.2, 0.0, 0.0]]
    unscaled = stepwise.process_advantages(scores, ends, step_mask, 2, 5, scale_by_std=False)
    torch.testing.assert_close(unscaled, torch.tensor(centred), atol=1e-6, rtol=0)


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_process_advantages_of_a_group_of_equal_step_scores_are_exactly_zero(scale_by_std):
    # three steps of 0.9: their float32 mean is 6e-8 off 0.9, which ÷ (0 + 1e-4) would make ±6e-4 advantages
    scores = torch.tensor([[0.9, 0.9], [0.9, 0.0]])
    ends = torch.tensor([[1, 3], [2, 0]])
    step_mask = torch.tensor([[1, 1], [1, 0]])
    advantages = stepwise.process_advantages(scores, ends, step_mask, 2, 5, scale_by_std=scale_by_std)
    assert advantages.abs().max().item() == 0.0


def test_completion_steps_end_on_the_sampled_tokens(tokenizer):
    # the tiny tokenizer has a token a character: the steps end at the '5' of "15" (index 10) and the last '1' (22)
    text = "12 + 3 = 15\n15 - 4 = 11"
    ids = torch.tensor([tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id, 0]])
    mask = torch.tensor([[1] * (len(text) + 1) + [0]])
    texts, ends, step_mask = stepwise.completion_steps(tokenizer, ids, mask)
    assert texts == [text] and ends.tolist() == [[10, 22]] and step_mask.tolist() == [[1, 1]]


# ---- the loop ------------------------------------------------------------------------------------------------------
def test_a_prm_gives_advantages_where_every_outcome_is_equal(tmp_path, tiny_prm):
    # every completion scores 0, so the outcome advantages are 0 and the loss of the first step (β = 0: no KL) is 0;
    # a PRM's step scores still differ, and so do the advantages
    options = dict(steps=1, beta=0.0, max_new_tokens=16, save_model=False)
    outcome_args = grpo_tiny_args(tmp_path / "outcome", **options)
    outcome = metrics_of(grpo.main(outcome_args, reward_fn=lambda c, a: 0.0))[0]
    process = metrics_of(
        main(tiny_args(tmp_path / "process", prm=tiny_prm, **options), reward_fn=lambda c, a: 0.0)
    )[0]
    assert outcome["loss"] == 0.0 and "prm/step_score" not in outcome
    assert process["loss"] != 0.0 and 0.0 < process["prm/step_score"] < 1.0 and process["prm/steps"] > 0


def test_dynamic_sampling_with_a_prm_keeps_the_groups_whose_step_scores_differ(tmp_path, tiny_prm):
    # every outcome 0: dynamic sampling on the outcome reward would drop every group and skip every step
    args = tiny_args(
        tmp_path, steps=2, prm=tiny_prm, dynamic_sampling=True, max_new_tokens=16, save_model=False
    )
    rows = metrics_of(main(args, reward_fn=lambda c, a: 0.0))
    assert all(row["frac_reward_zero_std"] == 1.0 for row in rows)
    assert all("skipped" not in row and row["loss"] != 0.0 for row in rows)


def test_no_scale_by_std_reaches_the_process_advantages(tmp_path, monkeypatch, tiny_prm):
    # the same completions and step scores (one seed), once per setting: within a group the scaled advantages are
    # the unscaled ones ÷ (std(R) + eps), one factor a group, so their ratio is constant there and not 1
    calls = spy_on_loss(monkeypatch)
    for scale_by_std in (True, False):
        args = tiny_args(
            tmp_path / str(scale_by_std),
            steps=1,
            prm=tiny_prm,
            scale_by_std=scale_by_std,
            max_new_tokens=16,
            save_model=False,
        )
        main(args, reward_fn=lambda c, a: 0.0)
    scaled, unscaled = calls[0]["advantages"], calls[1]["advantages"]  # (B, T)
    for group in range(2):
        rows = slice(4 * group, 4 * group + 4)
        real = unscaled[rows].abs() > 1e-3
        ratios = scaled[rows][real] / unscaled[rows][real]
        assert ratios.max() - ratios.min() < 1e-3 * ratios.max()
        assert abs(ratios.mean().item() - 1.0) > 1e-2


# ---- resume ---------------------------------------------------------------------------------------------------------
def test_resume_continues_exactly(tmp_path, tiny_prm):
    assert_resume_is_exact(
        tmp_path,
        main,
        lambda out, **kw: tiny_args(out, prm=tiny_prm, beta=0.1, eval_every=2, max_new_tokens=16, **kw),
        reward_fn=digit_fraction,
    )


# ---- bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(), "--prm DIR is required: train a process reward model with `python prm.py`"),
        (
            dict(prm="runs/p", reward_model="runs/r"),
            "--prm takes its advantages from the PRM's step scores alone",
        ),
        (dict(prm="runs/p", rewards=("correct", "format")), "--prm takes its advantages from the PRM's"),
        (dict(prm="runs/p", reward_weights=(2.0,)), "--prm takes its advantages from the PRM's"),
        (dict(prm="runs/p", overlong_buffer=2), "--prm takes its advantages from the PRM's"),
        (dict(prm="runs/p", group_size=1), "--group-size must be at least 2"),  # grpo.py's checks too
        (dict(prm="runs/no-such-run/model"), "no such directory"),
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, **overrides))
    assert not os.listdir(tmp_path)  # nothing was started


def test_cli_tiny_run(tmp_path, tiny_prm):
    proc = run_script(
        "grpo_prm.py",
        "--model",
        "tiny",
        "--prm",
        tiny_prm,
        "--steps",
        "2",
        "--max-new-tokens",
        "16",
        "--eval-size",
        "8",
        "--output-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out accuracy" in proc.stdout
    (run_dir,) = os.listdir(tmp_path)
    assert run_dir.startswith("grpo-prm-tiny-0-")


def test_cli_help_and_bad_input_is_one_line_and_exit_2(tmp_path):
    help_text = run_script_here("grpo_prm.py", "--help").stdout
    for flag in ("--prm", "--group-size", "--scale-by-std", "--dynamic-sampling"):
        assert flag in help_text, flag
    proc = run_script_here("grpo_prm.py", "--model", "tiny", "--output-dir", str(tmp_path))
    assert_one_line_error(proc, "--prm DIR is required")
    assert not os.listdir(tmp_path)
