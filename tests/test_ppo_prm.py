"""ppo_prm.py: the PRM's step scores in PPO's per-token rewards at the tokens that end the steps, the outcome only
logged, resume, bad input and the command line."""

import math
import os

import pytest
import torch

import ppo
from infra import runs
from task import stepwise
from conftest import assert_one_line_error, assert_resume_is_exact, metrics_of, run_script, run_script_here
from ppo_prm import Args, main
from test_ppo import assert_penalty_reads_the_updated_kl, fixed_completions
from test_ppo import tiny_args as ppo_tiny_args


def tiny_args(tmp_path, **overrides) -> Args:
    """test_ppo.py's tiny run, with this file's options and no reward model."""
    return ppo_tiny_args(tmp_path, overrides.pop("reward_model", None), args_class=Args, **overrides)


def test_step_scores_are_rewarded_on_the_tokens_that_end_the_steps(
    tmp_path, monkeypatch, tokenizer, tiny_prm
):
    # every completion is "1 + 1 = 2\n2 + 1 = 3" and EOS: a token a character, the steps end at its 9th character
    # (index 8) and its last (index 18). The PRM's logits there, 0 and ln 3, are σ = 0.5 and 0.75. With no KL
    # penalty and no truncation, the rewards GAE gets are those two numbers at those two tokens and 0 elsewhere,
    # though the outcome reward pays 1.0 for every completion: it is only logged.
    text = "1 + 1 = 2\n2 + 1 = 3"
    fixed_completions(
        monkeypatch, [tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]]
    )

    def fixed_logits(model, tokenizer, prompts, completions):
        assert completions == [text] * len(prompts)  # the steps of the sampled tokens
        return torch.tensor([[0.0, math.log(3.0)]] * len(prompts)), torch.ones(len(prompts), 2)

    monkeypatch.setattr(stepwise, "score_steps", fixed_logits)
    seen = []
    original = ppo.compute_gae
    monkeypatch.setattr(
        ppo, "compute_gae", lambda rewards, *a: seen.append(rewards.clone()) or original(rewards, *a)
    )
    args = tiny_args(tmp_path, prm=tiny_prm, kl_coef=0.0, steps=1)
    row = metrics_of(main(args, reward_fn=lambda completion, answer: 1.0))[0]
    expected = torch.zeros(len(text) + 1)
    expected[8] = 0.5
    expected[18] = 0.75
    torch.testing.assert_close(seen[0], expected.repeat(seen[0].shape[0], 1))
    assert row["score"] == 1.0 and row["prm/step_score"] == pytest.approx(0.625) and row["prm/steps"] == 2.0
    assert row["prm/reward"] == pytest.approx(1.25)


def test_penalty_adapts_on_the_kl_of_the_updated_policy_on_the_batch(tmp_path, tiny_prm, monkeypatch):
    args = tiny_args(
        tmp_path,
        prm=tiny_prm,
        steps=1,
        ppo_epochs=1,
        minibatch_size=4,
        policy_loss="penalty",
        kl_old_target=1e-6,
    )
    assert_penalty_reads_the_updated_kl(main, args, monkeypatch)


def test_critic_warmup_trains_the_critic_alone_for_its_steps(tmp_path, tiny_prm):
    rows = metrics_of(main(tiny_args(tmp_path, prm=tiny_prm, steps=2, ppo_epochs=2, critic_warmup_steps=1)))
    assert rows[0]["approx_kl"] == 0.0 and rows[1]["kl"] == 0.0 and rows[1]["approx_kl"] > 0


def test_resume_continues_exactly(tmp_path, tiny_prm):
    assert_resume_is_exact(
        tmp_path, main, lambda out, **kw: tiny_args(out, prm=tiny_prm, eval_every=2, max_new_tokens=16, **kw)
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(), "--prm DIR is required: train a process reward model with `python prm.py`"),
        (dict(prm="runs/p", reward="model", reward_model="runs/r"), "--prm takes its rewards from the PRM's"),
        (
            dict(prm="runs/p", minibatch_size=3),
            "--minibatch-size 3 must divide --batch-size 4",
        ),  # ppo.py's checks
        (dict(prm="runs/no-such-run/model"), "no such directory"),
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, **overrides))
    assert not os.path.exists(tmp_path / "runs") or not os.listdir(tmp_path / "runs")  # nothing was started


def test_cli_tiny_run_and_help(tmp_path, tiny_prm):
    argv = [
        "--model",
        "tiny",
        "--prm",
        tiny_prm,
        "--steps",
        "2",
        "--eval-size",
        "8",
        "--output-dir",
        str(tmp_path),
    ]
    proc = run_script("ppo_prm.py", *argv)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = os.listdir(tmp_path)
    assert run_dir.startswith("ppo-prm-tiny-0-") and "held-out accuracy" in proc.stdout
    help_text = run_script_here("ppo_prm.py", "--help").stdout
    for flag in ("--prm", "--gamma", "--lam", "--policy-loss"):
        assert flag in help_text, flag
    assert_one_line_error(run_script_here("ppo_prm.py", "--model", "tiny"), "--prm DIR is required")
