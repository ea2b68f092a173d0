"""ppo_overoptimisation.py: the ensemble's score and the shaped reward by hand, each mitigation in the loop, the KL
budget's stop and resume, resume, ppo.py's run when no mitigation is set, bad input and the command line."""

import itertools
import os
import re

import pytest
import torch

import common
import ppo
from infra import runs
from task import tasks
from conftest import (
    TIMING,
    assert_one_line_error,
    assert_resume_is_exact,
    metrics_of,
    run_script,
    run_script_here,
)
from ppo_overoptimisation import Args, ensemble_score, main, shaped_score
from test_ppo import fixed_completions, tiny_args


def study_args(tmp_path, rm_path, **overrides) -> Args:
    """test_ppo.py's tiny run, with this file's options."""
    return tiny_args(tmp_path, rm_path, args_class=Args, **overrides)


def steady_rows(result: dict) -> list[dict]:
    """metrics.jsonl's rows without their timings."""
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in metrics_of(result)]


# ---- the math --------------------------------------------------------------------------------------------------------
def test_ensemble_score_by_hand():
    scores = torch.tensor([[1.0, 2.0], [3.0, 0.0], [2.0, 1.0]])  # 3 models, 2 completions
    assert ensemble_score(scores, "min").tolist() == [1.0, 0.0]
    # mean [2, 1]; population std over models sqrt(2/3) = 0.816497 for both; mean − 1·std
    assert ensemble_score(scores, "mean-std", 1.0).tolist() == pytest.approx([1.183503, 0.183503], abs=1e-6)
    assert ensemble_score(scores[:1], "mean-std", 1.0).tolist() == [1.0, 2.0]  # one model: its score


def test_shaped_score_by_hand():
    scores, verified, lengths = torch.tensor([4.0, 0.0]), torch.tensor([1.0, 0.0]), torch.tensor([10, 2])
    # every term off: the score itself
    assert shaped_score(scores, verified, lengths, 1.0, 2.0).tolist() == [4.0, 0.0]
    # start mean 1, std 2: (4 − 1)/2 = 1.5 → clipped to 1; (0 − 1)/2 = −0.5 kept; then + 0.5·verifier − 0.1·length:
    # 1 + 0.5 − 1 = 0.5 and −0.5 + 0 − 0.2 = −0.7
    shaped = shaped_score(scores, verified, lengths, 1.0, 2.0, 1.0, 0.5, 0.1)
    assert shaped.tolist() == pytest.approx([0.5, -0.7])


# ---- the loop --------------------------------------------------------------------------------------------------------
def test_with_no_mitigation_it_is_ppo(tmp_path, tiny_reward_model_path):
    # the copied loop against the reference's: every number of a run with no mitigation set (the missing-EOS penalty
    # on, as ppo.py's default 0 would hide its sign: the tiny model's samples rarely end)
    options = {"eval_every": 1, "target_kl": 0.01, "missing_eos_penalty": 1.0}
    straight = ppo.main(tiny_args(tmp_path / "ppo", tiny_reward_model_path, **options))
    variant = main(study_args(tmp_path / "variant", tiny_reward_model_path, **options))
    rows = steady_rows(variant)
    assert [row.pop("score_shaped") for row in rows] == [row["score"] for row in rows]
    assert rows == steady_rows(straight) and variant["evals"] == straight["evals"]
    assert variant["steps_trained"] == 2


@pytest.mark.parametrize("agg, coef, expected", [("min", 1.0, -1.309307), ("mean-std", 0.5, -1.091089)])
def test_ensemble_standardises_each_model_then_combines(
    tmp_path, tiny_reward_model_path, monkeypatch, agg, coef, expected
):
    # held-out (8 problems, the starting policy): both models score 0..7, mean 3.5, population std
    # sqrt(63/12) = 2.291288. Training batch: model 1 scores [0, 1, 2, 3], model 2 [3, 2, 1, 0]; standardised
    # z = (x − 3.5) / 2.291288 = [−1.527525, −1.091089, −0.654654, −0.218218] and its reverse.
    # min per row [−1.5275, −1.0911, −1.0911, −1.5275]: mean −1.309307.
    # mean − 0.5·std per row: rows 0, 3: −0.872872 − 0.5·0.654654; rows 1, 2: −0.872872 − 0.5·0.218218: mean −1.091089
    calls = itertools.count()

    def scores(model, ids, mask):  # every batch is scored by model 1, then model 2
        x = torch.arange(len(ids)).float()
        return x.flip(0) if next(calls) % 2 and len(ids) == 4 else x

    monkeypatch.setattr(common, "reward_scores", scores)
    args = study_args(
        tmp_path,
        tiny_reward_model_path,
        steps=1,
        ensemble=(tiny_reward_model_path,),
        ensemble_agg=agg,
        ensemble_std_coef=coef,
    )
    result = main(args)
    # metrics.jsonl keeps 6 significant digits
    assert metrics_of(result)[0]["score"] == pytest.approx(expected, abs=5e-6)


def test_reward_clip_standardises_by_the_starting_policys_held_out_scores(
    tmp_path, tiny_reward_model_path, monkeypatch
):
    monkeypatch.setattr(common, "reward_scores", lambda model, ids, mask: torch.arange(len(ids)).float())
    row = metrics_of(main(study_args(tmp_path, tiny_reward_model_path, steps=1, reward_clip=1.0)))[0]
    # held-out (8 problems): scores 0..7, mean 3.5, population std sqrt(63/12) = 2.291288. Training batch 0..3:
    # (0, 1, 2, 3 − 3.5) / 2.291288 = −1.527525, −1.091089, −0.654654, −0.218218; clipped at ±1: mean −0.718218
    assert row["score"] == pytest.approx(1.5) and row["score_shaped"] == pytest.approx(-0.718218, abs=1e-6)


def test_composite_reward_and_length_penalty(tmp_path, tiny_reward_model_path, monkeypatch, tokenizer):
    eos, seven = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("7")
    # lengths 2, 3 (EOS counts), texts "7", "77"
    fixed_completions(monkeypatch, [[seven, eos, 0], [seven, seven, eos]])
    monkeypatch.setattr(common, "reward_scores", lambda model, ids, mask: torch.ones(len(ids)))
    monkeypatch.setattr(tasks, "verify", lambda completion, answer: float(completion == "77"))
    row = metrics_of(
        main(
            study_args(
                tmp_path,
                tiny_reward_model_path,
                steps=1,
                max_new_tokens=3,
                verifier_weight=0.5,
                length_penalty=0.2,
            )
        )
    )[0]
    # 1 + 0.5 · verifier − 0.2 · length: [1 + 0 − 0.4, 1 + 0.5 − 0.6] = [0.6, 0.9], twice: mean 0.75
    assert row["score"] == 1.0 and row["verifier"] == 0.5 and row["score_shaped"] == pytest.approx(0.75)


def test_kl_budget_stops_before_the_update_and_a_resume_redraws_that_batch(
    tmp_path, tiny_reward_model_path, capsys
):
    def run(out, **overrides):
        return main(study_args(out, tiny_reward_model_path, steps=3, eval_every=1, **overrides))

    # the KL per completion of the batch that stopped the last run, as it printed it
    def stopping_kl() -> float:
        return float(
            re.search(r"step 2: KL per completion ([\d.]+) > --kl-budget", capsys.readouterr().out).group(1)
        )

    # step 1 samples from the reference itself (KL 0) and updates; step 2's samples are already off it
    result = run(tmp_path / "split", kl_budget=1e-9)
    assert result["steps_trained"] == 1 and len(metrics_of(result)) == 1
    # the final evaluation replaces step 1's, not a second row
    assert [e["step"] for e in result["evals"]] == [0, 1]
    state = torch.load(os.path.join(result["run_dir"], "model", "trainer_state.pt"), weights_only=False)
    assert state["step"] == 1  # the checkpoint says what was trained: a --resume starts at step 2
    first_kl = stopping_kl()
    # the same budget again: the same batch is drawn, and stops the run again
    again = run(tmp_path / "split", kl_budget=1e-9, resume=result["run_dir"])
    assert again["steps_trained"] == 1 and stopping_kl() == first_kl
    # the budget lifted: the resumed run trains on that batch, exactly as a run that never had a budget does
    resumed, straight = run(tmp_path / "split", resume=result["run_dir"]), run(tmp_path / "straight")
    rows = [steady_rows(r) for r in (straight, resumed)]
    assert [row["step"] for row in rows[1]] == [1, 2, 3] and rows[0] == rows[1]
    assert rows[1][1]["kl"] == pytest.approx(first_kl, abs=5e-4) and straight["evals"] == resumed["evals"]


def test_resume_continues_exactly_with_the_starting_policys_standardisation(
    tmp_path, tiny_reward_model_path, monkeypatch
):
    # two members that disagree in offset and scale, so that the standardisation read back from the checkpoint
    # (not the resumed policy's own, nor none) is what makes the resumed steps equal
    calls = itertools.count()

    def scores(model, ids, mask):
        x = torch.arange(len(ids)).float()
        return 10 * x + 3 if next(calls) % 2 else x

    monkeypatch.setattr(common, "reward_scores", scores)
    assert_resume_is_exact(
        tmp_path,
        main,
        lambda out, **kw: study_args(
            out,
            tiny_reward_model_path,
            eval_every=2,
            ensemble=(tiny_reward_model_path,),
            ensemble_agg="mean-std",
            reward_clip=1.0,
            **kw,
        ),
    )


def test_critic_warmup_trains_the_critic_alone_for_its_steps(tmp_path, tiny_reward_model_path):
    rows = metrics_of(
        main(study_args(tmp_path, tiny_reward_model_path, steps=2, ppo_epochs=2, critic_warmup_steps=1))
    )
    assert rows[0]["approx_kl"] == 0.0 and rows[1]["kl"] == 0.0 and rows[1]["approx_kl"] > 0


# ---- bad input and the command line ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(reward="verifier", reward_model=None, ensemble=("x",)),
            "--ensemble shapes a learned reward: use it with --reward model",
        ),
        (
            dict(reward="verifier", reward_model=None, verifier_weight=1.0),
            "--verifier-weight shapes a learned reward",
        ),
        (dict(reward_clip=0.0), "--reward-clip must be > 0"),
        (dict(kl_budget=-1.0), "--kl-budget must be > 0"),
        (dict(policy_loss="penalty"), "--policy-loss penalty and its --kl-old-target are ppo.py's"),
        (dict(kl_old_target=0.02), "--policy-loss penalty and its --kl-old-target are ppo.py's"),
        (dict(minibatch_size=3), "--minibatch-size 3 must divide --batch-size 4"),  # ppo.py's checks too
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, tiny_reward_model_path, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(study_args(tmp_path, tiny_reward_model_path, **overrides))
    assert not os.path.exists(tmp_path / "runs")


def test_cli_tiny_run_and_bad_input(tmp_path, tiny_reward_model_path):
    proc = run_script(
        "ppo_overoptimisation.py",
        "--model",
        "tiny",
        "--reward-model",
        tiny_reward_model_path,
        "--ensemble",
        tiny_reward_model_path,
        "--reward-clip",
        "1",
        "--kl-budget",
        "100",
        "--steps",
        "2",
        "--eval-size",
        "8",
        "--output-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out accuracy" in proc.stdout and "held-out mean reward" in proc.stdout
    assert_one_line_error(
        run_script_here(
            "ppo_overoptimisation.py", "--model", "tiny", "--reward", "verifier", "--reward-clip", "1"
        ),
        "--reward-clip shapes a learned reward",
    )
    help_text = run_script_here("ppo_overoptimisation.py", "--help").stdout
    for flag in (
        "--ensemble",
        "--ensemble-agg",
        "--ensemble-std-coef",
        "--reward-clip",
        "--length-penalty",
        "--verifier-weight",
        "--kl-budget",
        "--reward-model",
        "--target-kl",
    ):
        assert flag in help_text, flag
