"""distill.py: the divergences on a two-token vocabulary by hand, the sampled estimator exact on the student's samples
and wrong on the teacher's, the loss's expected gradient, the loop sampling from the student, resume, bad input."""

import os

import pytest
import torch

import common
import sft
from infra import models
from infra import runs
from conftest import args_of, assert_one_line_error, assert_resume_is_exact, metrics_of, run_script_here
from distill import (
    Args,
    forward_kl,
    generalized_jsd,
    main,
    reverse_kl,
    reverse_kl_loss,
    sampled_reverse_kl,
    vocabulary_logprobs,
)

TEACHER = torch.log(torch.tensor([0.5, 0.5]))
STUDENT = torch.log(torch.tensor([0.9, 0.1]))


@pytest.fixture(scope="module")
def tiny_teacher(tmp_path_factory) -> str:
    """An sft.py checkpoint of the tiny model, a few steps trained: a teacher whose distributions differ."""
    out = tmp_path_factory.mktemp("teacher")
    args = args_of(sft.Args, model="tiny", steps=4, lr=1e-2, num_demonstrations=40, output_dir=str(out))
    return sft.main(args)["run_dir"] + "/model"


def tiny_args(tmp_path, teacher="runs/t", **overrides) -> Args:
    defaults = dict(
        model="tiny",
        teacher=teacher,
        steps=2,
        prompts_per_step=4,
        samples_per_prompt=2,
        max_new_tokens=8,
        eval_size=8,
        eval_every=0,
        lr=1e-3,
        output_dir=str(tmp_path / "runs"),
    )
    return args_of(Args, **{**defaults, **overrides})


# ---- the divergences ------------------------------------------------------------------------------------------------
def test_the_divergences_by_hand():
    # π_T = (0.5, 0.5), π_S = (0.9, 0.1):
    # KL(π_T ‖ π_S) = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) = 0.5(-0.587787) + 0.5(1.609438) = 0.510826
    # KL(π_S ‖ π_T) = 0.9 ln(0.9/0.5) + 0.1 ln(0.1/0.5) = 0.529008 - 0.160944 = 0.368064
    assert forward_kl(STUDENT, TEACHER).item() == pytest.approx(0.510826, abs=1e-6)
    assert reverse_kl(STUDENT, TEACHER).item() == pytest.approx(0.368064, abs=1e-6)
    # β = 0.5: M = (0.7, 0.3); KL(π_T ‖ M) = 0.5 ln(0.5/0.7) + 0.5 ln(0.5/0.3) = 0.087177,
    # KL(π_S ‖ M) = 0.9 ln(0.9/0.7) + 0.1 ln(0.1/0.3) = 0.116322; JSD = ½(0.087177 + 0.116322) = 0.101749
    assert generalized_jsd(STUDENT, TEACHER, 0.5).item() == pytest.approx(0.101749, abs=1e-6)
    # β = 0.25: M = 0.25 π_T + 0.75 π_S = (0.8, 0.2); KL(π_T ‖ M) = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.223144,
    # KL(π_S ‖ M) = 0.9 ln(0.9/0.8) + 0.1 ln(0.1/0.2) = 0.036690; JSD = 0.25(0.223144) + 0.75(0.036690) = 0.083304
    assert generalized_jsd(STUDENT, TEACHER, 0.25).item() == pytest.approx(0.083304, abs=1e-6)
    # the endpoints are the forward and the reverse KL, and the formula's limits divided by β and 1 - β
    assert generalized_jsd(STUDENT, TEACHER, 0.0).item() == pytest.approx(0.510826, abs=1e-6)
    assert generalized_jsd(STUDENT, TEACHER, 1.0).item() == pytest.approx(0.368064, abs=1e-6)
    small = 1e-4
    assert generalized_jsd(STUDENT, TEACHER, small).item() / small == pytest.approx(0.510826, rel=1e-3)
    assert generalized_jsd(STUDENT, TEACHER, 1 - small).item() / small == pytest.approx(0.368064, rel=1e-3)


def test_the_sampled_estimate_is_the_reverse_kl_on_the_students_samples_only():
    # E_{y ~ π_S}[log π_S(y) - log π_T(y)] = KL(π_S ‖ π_T) exactly; on the teacher's samples the same
    # expression averages to -KL(π_T ‖ π_S): the wrong divergence, and of the wrong sign
    per_token = sampled_reverse_kl(STUDENT, TEACHER)  # (V,): the estimate if y were each token
    assert (STUDENT.exp() * per_token).sum().item() == pytest.approx(0.368064, abs=1e-6)
    assert (TEACHER.exp() * per_token).sum().item() == pytest.approx(-0.510826, abs=1e-6)


def test_the_losss_expected_gradient_is_the_reverse_kls_gradient():
    # A tabular student, softmax(θ) over 3 tokens; every token's probability as its weight in the masked mean makes
    # the loss its expectation over y ~ π_S. Its gradient must be ∇θ KL(π_S ‖ π_T): the advantage is detached, and
    # Σ_y π_S(y) ∇log π_S(y) = 0 removes the constant.
    theta = torch.tensor([[1.0, -0.5, 0.2]], requires_grad=True)
    teacher = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))
    student = torch.log_softmax(theta, dim=-1)
    reverse_kl_loss(student, teacher, student.exp().detach()).backward()
    sampled = theta.grad.clone()
    theta.grad = None
    reverse_kl(torch.log_softmax(theta, dim=-1), teacher).sum().backward()
    torch.testing.assert_close(sampled, theta.grad)


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2"])
def test_vocabulary_logprobs_hold_the_trainers_log_probs_of_the_sampled_tokens(tokenizer, prompts, name):
    # at τ = 2, gathered at the completion's tokens: common.completion_logprobs' numbers, each row its own prompt
    model = models.load_model(name, len(tokenizer), torch.device("cpu"), "fp32")
    prompt_ids, prompt_mask = prompts
    completions = torch.randint(5, 90, (2, 6), generator=torch.Generator().manual_seed(0))
    vocab = vocabulary_logprobs(model, prompt_ids, prompt_mask, completions, 2.0)  # (2, 6, V)
    gathered = vocab.gather(-1, completions[..., None]).squeeze(-1)
    expected, _ = common.completion_logprobs(
        model, prompt_ids, prompt_mask, completions, torch.ones(2, dtype=torch.long), 2.0
    )
    torch.testing.assert_close(gathered, expected, atol=1e-5, rtol=0)
    assert torch.allclose(vocab.exp().sum(-1), torch.ones(2, 6))


# ---- the loop -------------------------------------------------------------------------------------------------------
def test_the_student_samples_and_the_teacher_scores_its_tokens(tmp_path, monkeypatch, tiny_teacher):
    sampled_by = []
    original = common.sample_completions

    def spy(model, *a, **k):
        sampled_by.append(next(model.parameters()).requires_grad)  # the student trains; the teacher is frozen
        return original(model, *a, **k)

    monkeypatch.setattr(common, "sample_completions", spy)
    main(tiny_args(tmp_path, tiny_teacher, steps=2))
    # two training steps and the evaluations' greedy calls: every one by the student, never the teacher
    assert len(sampled_by) >= 2 and all(sampled_by)


@pytest.mark.parametrize("loss", ["reverse-kl", "jsd"])
def test_the_student_moves_towards_the_teacher(tmp_path, tiny_teacher, loss):
    args = tiny_args(tmp_path, tiny_teacher, loss=loss, steps=12, lr=3e-3, prompts_per_step=8)
    kl = [row["kl/reverse_per_token"] for row in metrics_of(main(args))]
    assert sum(kl[-3:]) < 0.7 * sum(kl[:3]), kl


def test_resume_continues_exactly(tmp_path, tiny_teacher):
    assert_resume_is_exact(tmp_path, main, lambda out, **kw: tiny_args(out, tiny_teacher, eval_every=2, **kw))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(teacher=None), "--teacher DIR is required: train one with `python sft.py`"),
        (dict(beta=1.5), r"--beta must be in \[0, 1\], not 1.5"),
        (dict(teacher="runs/no-such-run/model"), "no such directory"),
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, **overrides))
    assert not os.path.exists(tmp_path / "runs")  # nothing was started


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path):
    gpt2_like = tmp_path / "gpt2-like"
    tokenizer = models.make_tiny_tokenizer()
    tokenizer.add_tokens(["<extra>"])
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32")
    runs.save_checkpoint(model, tokenizer, gpt2_like)
    with pytest.raises(runs.InputError, match="has another tokenizer than the student"):
        main(tiny_args(tmp_path, str(gpt2_like)))


def test_cli_help_and_a_missing_teacher(tmp_path):
    help_text = run_script_here("distill.py", "--help").stdout
    for flag in ("--teacher", "--loss", "--beta", "--samples-per-prompt"):
        assert flag in help_text, flag
    assert_one_line_error(run_script_here("distill.py", "--model", "tiny"), "--teacher DIR is required")
