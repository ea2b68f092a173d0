"""grpo_options.py, the catalogue: each later paper's option on hand-computed numbers, in the loop, and refused where
it cannot act."""

import os

import pytest
import torch

import common
import grpo
import grpo_options
from infra import runs
from task import tasks
from conftest import assert_resume_is_exact, digit_fraction, metrics_of, run_script_here
from grpo_options import (
    Args,
    adapted_entropy_coef,
    batch_std_advantages,
    capped_rewards,
    ensemble_scores,
    high_entropy_mask,
    main,
    normalised_sum,
    options_loss,
    vespo_weights,
)
from test_grpo import ADVANTAGES3, LOGPROBS3, MASK3, REF3, loss_and_grad, spy_on_loss, tiny_args


def catalogue_args(tmp_path, **overrides) -> Args:
    """test_grpo's tiny run, with the catalogue's Args."""
    return tiny_args(tmp_path, Args, **overrides)


def options_loss_and_grad(ref=None, **options):
    """test_grpo.loss_and_grad through options_loss."""
    return loss_and_grad(ref, options_loss, **options)


def test_group_advantages_with_the_batch_std_centre_on_the_group_and_divide_by_the_batch():
    # Lite PPO: rewards (1, 0 | 3, 3), G = 2. Group means 0.5 and 3; the batch's population std: mean 1.75,
    # squares 0.5625 + 3.0625 + 1.5625 + 1.5625 = 6.75, / 4 = 1.6875, √ = 1.299038; ±0.5 / 1.299038 = ±0.384900.
    # The second group is all equal: 0. With its group's std (0.5) the first would be ±1.
    adv = batch_std_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0]), group_size=2, eps=0.0)
    assert adv.tolist() == pytest.approx([0.384900, -0.384900, 0.0, 0.0], abs=1e-6)


@pytest.mark.parametrize("options", [dict(importance_level="seq"), dict(loss_type="CISPO")])
def test_grpo_loss_refuses_an_unknown_importance_level_or_loss_type(options):
    with pytest.raises(ValueError, match="unknown importance_level"):
        options_loss(
            torch.zeros(1, 2), torch.zeros(1, 2), None, torch.ones(1), torch.ones(1, 2), beta=0.0, **options
        )


def test_gspo_clips_one_length_normalised_ratio_per_completion():
    loss, grad, metrics = options_loss_and_grad(beta=0.0, importance_level="sequence")
    # s_i = exp(mean of log ρ over o_i's tokens), the padding left out:
    #   s_0 = exp((0.1 - 0.3 + 0.4) / 3) = 1.068939, in [0.8, 1.2]          -Â s = -1.068939
    #   s_1 = exp(0.3) = 1.349859, Â = -2: above 1 + ε but not clipped     -Â s =  2.699718
    #   s_2 = exp((0.5 + 0.1) / 2) = 1.349859, Â = 0.5: clipped at 1.2      -Â 1.2 = -0.6
    # seq-mean-token-mean: (-1.068939 + 2.699718 - 0.6) / 3 = 0.343593. Clipped per token instead, o_0's
    # e^0.4 = 1.49 and o_2's e^0.5 = 1.65 would be cut alone: 0.369365.
    assert loss == pytest.approx(0.343593, abs=1e-6)
    # through the mean, every token of o_0 gets the same gradient -Â s_0 / (B |o_0|) = -1.068939 / 9 = -0.118771;
    # o_1: 2 × 1.349859 / 3 = 0.899906; o_2 is clipped as a whole: none
    assert torch.allclose(grad, torch.tensor([[-0.118771] * 3, [0.899906, 0, 0], [0, 0, 0]]), atol=1e-6)
    assert metrics["clip_ratio/high"] == pytest.approx(2 / 6)  # o_2's 2 tokens of the 6


def test_cispo_weights_reinforce_by_the_truncated_detached_ratio():
    loss, grad, metrics = options_loss_and_grad(beta=0.0, loss_type="cispo", loss_agg="token-mean")
    # l_t = -min(ρ_t, 1.2) Â log π_t with no lower bound (ρ = e^-0.3 = 0.740818 stays, though below 1 - ε):
    #   o_0 (Â = 1):   1.105171 × 1 + 0.740818 × 2 + 1.2 × 0.5      = 3.186807
    #   o_1 (Â = -2): -1.2 × 2 × 0.3                                = -0.72
    #   o_2 (Â = 0.5): 1.2 × 0.5 × 0.7 + 1.105171 × 0.5 × 1.2        = 1.083103
    # token-mean: 3.549910 / 6 = 0.591652
    assert loss == pytest.approx(0.591652, abs=1e-6)
    # the weight is a constant: ∂l_t/∂log π_t = -w_t Â / 6, the cut tokens (e^0.4, e^0.5 -> 1.2) included
    expected = torch.tensor([[-1.105171, -0.740818, -1.2], [2.4, 0, 0], [-0.6, -0.552585, 0]]) / 6
    assert torch.allclose(grad, expected, atol=1e-6)
    assert metrics["clip_ratio/high"] == pytest.approx(2 / 6) and metrics["clip_ratio/low"] == 0.0


def test_a_clipped_token_gets_no_gradient_under_the_clip_and_one_under_cispo():
    # o_0's last token (ρ = e^0.4 = 1.49) and o_2's first (e^0.5 = 1.65), Â > 0: both above 1 + ε = 1.2
    _, clip_grad, _ = options_loss_and_grad(beta=0.0, loss_agg="token-mean")
    _, cispo_grad, _ = options_loss_and_grad(beta=0.0, loss_agg="token-mean", loss_type="cispo")
    assert clip_grad[0, 2] == 0.0 and clip_grad[2, 0] == 0.0
    assert cispo_grad[0, 2].item() == pytest.approx(-1.2 / 6) and cispo_grad[2, 0].item() == pytest.approx(
        -0.6 / 6
    )


def test_sapo_gates_the_ratio_softly_with_the_temperature_of_the_advantage_sign():
    """SAPO, 2 one-token completions, seq-mean-token-mean, τ_pos = 1, τ_neg = 1.05:
    ρ = 2, Â = 1:     f = σ(1 · 1) · 4 = 0.731059 · 4 = 2.924234;  ∂f/∂log π = 4 σ(1 - σ) ρ = 1.572895
    ρ = 0.5, Â = -1:  f = σ(1.05 · -0.5) · 4 / 1.05 = 1.415938;    ∂f/∂log π = 4 σ(1 - σ) ρ = 0.467070
    loss (-2.924234 + 1.415938) / 2 = -0.754148; gradients -1.572895 / 2 and +0.467070 / 2. At ρ = 1 the slope is
    the surrogate's, 1: ∂f/∂ρ = 4 · 0.5 · 0.5."""
    logprobs = torch.tensor([[2.0], [0.5]]).log().requires_grad_(True)
    advantages = torch.tensor([1.0, -1.0])
    loss, _ = options_loss(
        logprobs, torch.zeros(2, 1), None, advantages, torch.ones(2, 1), beta=0.0, loss_type="sapo"
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.754148, abs=1e-6)
    assert logprobs.grad.flatten().tolist() == pytest.approx([-0.786448, 0.233535], abs=1e-6)
    at_one = torch.zeros(1, 1, requires_grad=True)
    options_loss(
        at_one, torch.zeros(1, 1), None, torch.tensor([1.0]), torch.ones(1, 1), beta=0.0, loss_type="sapo"
    )[0].backward()
    assert at_one.grad.item() == pytest.approx(-1.0)


def test_delta_caps_the_ratio_of_a_negative_advantage_and_leaves_a_positive_one_to_the_clip():
    """INTELLECT-2's two-sided clipping, 4 one-token completions, ε = 0.2, δ = 4, seq-mean-token-mean:
    ρ = 5, Â = -1:  max(1 · min(5, 4), 1 · 1.2) = 4     (without δ: 5), no gradient: capped
    ρ = 2, Â = -1:  max(1 · 2, 1 · 1.2) = 2             under δ: the gradient ρ = 2, as without δ
    ρ = 5, Â = 1:   max(-min(5, 4), -1.2) = -1.2        the clip binds first: no gradient, as without δ
    ρ = 0.5, Â = 1: max(-0.5, -0.8) = -0.5              gradient -ρ = -0.5
    loss (4 + 2 - 1.2 - 0.5) / 4 = 1.075; gradients ÷ 4."""
    ratios = torch.tensor([[5.0], [2.0], [5.0], [0.5]])
    logprobs = ratios.log().requires_grad_(True)
    advantages = torch.tensor([-1.0, -1.0, 1.0, 1.0])
    options = dict(beta=0.0, eps_low=0.2, eps_high=0.2)
    loss, _ = options_loss(
        logprobs, torch.zeros(4, 1), None, advantages, torch.ones(4, 1), delta=4.0, **options
    )
    loss.backward()
    assert loss.item() == pytest.approx(1.075, abs=1e-6)
    assert logprobs.grad.flatten().tolist() == pytest.approx([0.0, 0.5, 0.0, -0.125], abs=1e-6)
    without, _ = options_loss(ratios.log(), torch.zeros(4, 1), None, advantages, torch.ones(4, 1), **options)
    assert without.item() == pytest.approx((5 + 2 - 1.2 - 0.5) / 4, abs=1e-6)


def test_vespo_weights_a_completion_by_a_gamma_shape_of_its_whole_ratio():
    """VESPO's φ(w) = w^k e^(λ(1 - w)), w = Π_t ρ_t over the completion's real tokens (TRL's defaults k, λ = 2, 3 for
    Â >= 0 and 3, 2 for Â < 0):
    row 0, log ρ = 0.1 and -0.3, Â = 1:   log w = -0.2, w = 0.818731: 0.670320 · e^(3 · 0.181269) = 1.154662
    row 1, log ρ = 0.5 (9.0 is padding), Â = -1: w = e^0.5 = 1.648721: 4.481689 · e^(2 · -0.648721) = 1.224530
    On-policy (w = 1) φ = 1 for either sign; φ carries no gradient."""
    log_ratio = torch.tensor([[0.1, -0.3], [0.5, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    advantages = torch.tensor([[1.0], [-1.0]])
    phi = vespo_weights(log_ratio, mask, advantages, (2.0, 3.0, 3.0, 2.0))
    assert phi.flatten().tolist() == pytest.approx([1.154662, 1.224530], abs=1e-6)
    assert not phi.requires_grad
    on_policy = vespo_weights(torch.zeros(2, 2), mask, advantages, (2.0, 3.0, 3.0, 2.0))
    assert on_policy.flatten().tolist() == pytest.approx([1.0, 1.0])


def test_vespo_loss_is_reinforce_weighted_by_phi_and_luspo_sums_each_completion():
    """VESPO, token-mean over 3 tokens: l_it = -φ_i Â_i log π_it, so ∂loss/∂log π_it = -φ_i Â_i / 3: row 0 (ρ = 1,
    φ = 1, Â = 1) -1/3 on each of its 2 tokens; row 1 (Â = -1, one token of log ρ = 0.5, φ = 1.224530) +1.224530/3.
    LUSPO at ρ = 1 (no clip acts), lengths 2 and 1, Â = 1 and -1: each completion's loss times its length, then the
    mean: (2 · -1 + 1 · 1) / 2 = -0.5, where GSPO's per-completion mean gives (-1 + 1) / 2 = 0."""
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    old = torch.tensor([[-1.0, -2.0], [-1.5, 0.0]])
    logprobs = (old + torch.tensor([[0.0, 0.0], [0.5, 0.0]])).requires_grad_(True)
    advantages = torch.tensor([1.0, -1.0])
    loss, _ = options_loss(
        logprobs, old, None, advantages, mask, beta=0.0, loss_type="vespo", loss_agg="token-mean"
    )
    loss.backward()
    expected = [[-1 / 3, -1 / 3], [1.224530 / 3, 0.0]]
    assert logprobs.grad.tolist()[0] == pytest.approx(expected[0], abs=1e-6)
    assert logprobs.grad.tolist()[1] == pytest.approx(expected[1], abs=1e-6)
    level = dict(beta=0.0, importance_level="sequence")
    luspo, _ = options_loss(old, old, None, advantages, mask, loss_type="luspo", **level)
    gspo, _ = options_loss(old, old, None, advantages, mask, **level)
    assert luspo.item() == pytest.approx(-0.5) and gspo.item() == pytest.approx(0.0)


def test_on_policy_the_soft_gates_and_the_clip_give_the_same_gradient():
    """At μ = 1 (grpo.py's default) π_θold is π_θ itself, ρ = 1 on every token, and the losses meet: the clip does not
    bind, SAPO's gate has slope 4 σ(0)(1 - σ(0)) = 1, VESPO's φ(1) = 1, δ never binds. Each token's gradient is
    -Â_i / (B |o_i|) under seq-mean-token-mean: -1/4 for row 0 (Â = 1, 2 tokens), +1/2 for row 1 (Â = -1, 1 token).
    So these options change an update only where it is off-policy: μ > 1, or a stale sampler (grpo_async.py)."""
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    advantages = torch.tensor([1.0, -1.0])
    grads = {}
    for name, options in {
        "clip": {},
        "sapo": dict(loss_type="sapo"),
        "vespo": dict(loss_type="vespo"),
        "delta": dict(delta=4.0),
    }.items():
        logprobs = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], requires_grad=True)
        loss, _ = options_loss(logprobs, logprobs.detach(), None, advantages, mask, beta=0.0, **options)
        loss.backward()
        grads[name] = logprobs.grad.tolist()
    expected = [[-0.25, -0.25], [0.5, 0.0]]
    for name, grad in grads.items():
        assert grad[0] == pytest.approx(expected[0], abs=1e-6) and grad[1] == pytest.approx(
            expected[1], abs=1e-6
        ), name


def test_gdpo_normalises_each_reward_in_its_group_before_the_weighted_sum():
    """Two groups of G = 2, rewards (correct, format), weights 1 and 2:
    group 1: correct 1, 0 -> ±0.5 / (0.5 + 1e-4) = ±0.999800; format 0.5, 0.5 constant -> 0
    group 2: correct 0, 0 constant -> 0;                 format 1, 0 -> ±0.999800, weighted ±1.999600
    sum-then-normalize sums first: 2, 1, 2, 0. GDPO then divides by the batch's std (--scale-rewards batch): the
    population std of (±0.9998, ±1.9996) is 0.9998 · √2.5 = 1.580823, Â = ±0.632416, ±1.264831."""
    per_reward = torch.tensor([[1.0, 0.5], [0.0, 0.5], [0.0, 1.0], [0.0, 0.0]])
    weights = torch.tensor([1.0, 2.0])
    gdpo = normalised_sum(per_reward, weights, 2)
    assert gdpo.tolist() == pytest.approx([0.999800, -0.999800, 1.999600, -1.999600], abs=1e-6)
    assert (per_reward @ weights).tolist() == [2.0, 1.0, 2.0, 0.0]
    advantages = batch_std_advantages(gdpo, 2)
    assert advantages.tolist() == pytest.approx([0.632416, -0.632416, 1.264831, -1.264831], abs=1e-6)
    # a group whose every reward is constant keeps Â = 0 exactly, as dynamic sampling looks for
    constant = normalised_sum(torch.tensor([[1.0, 0.5], [1.0, 0.5], [1.0, 0.0], [0.0, 0.0]]), weights, 2)
    assert constant[:2].tolist() == [0.0, 0.0]


def test_adapted_entropy_coef_moves_toward_the_target_within_its_bounds():
    """Skywork-OR1's control, Δ = 0.005, bounds [0, 0.012]: H = 0.4 <= target 0.5 raises 0.010 to 0.015, capped at
    0.012; H = 0.6 lowers it to 0.005; 0.002 lowered by 0.005 stops at 0."""
    control = dict(target=0.5, step=0.005, bounds=(0.0, 0.012))
    assert adapted_entropy_coef(0.010, 0.4, **control) == pytest.approx(0.012)
    assert adapted_entropy_coef(0.010, 0.6, **control) == pytest.approx(0.005)
    assert adapted_entropy_coef(0.002, 0.6, **control) == 0.0
    assert adapted_entropy_coef(0.004, 0.5, **control) == pytest.approx(0.009)  # at the target: up


def test_an_ensemble_of_reward_models_scores_by_the_mean_or_min_of_standardised_scores():
    """Model A scores 1, 2, 3 (mean 2, population std 0.816497): z = -1.224745, 0, 1.224745; model B 10, 10, 40 (mean
    20, std 14.142136): z = -0.707107, -0.707107, 1.414214. Mean: -0.965926, -0.353553, 1.319479; min: -1.224745,
    -0.707107, 1.224745. One model's scores are used as they are."""
    scores = torch.tensor([[1.0, 2.0, 3.0], [10.0, 10.0, 40.0]])
    assert ensemble_scores(scores, "mean").tolist() == pytest.approx(
        [-0.965926, -0.353553, 1.319479], abs=1e-6
    )
    assert ensemble_scores(scores, "min").tolist() == pytest.approx(
        [-1.224745, -0.707107, 1.224745], abs=1e-6
    )
    assert ensemble_scores(scores[1:], "min").tolist() == [10.0, 10.0, 40.0]


def test_learned_scores_read_each_reward_model_on_the_real_tokens(monkeypatch):
    """Each model sees every prompt repeated for its G completions and the completion's own mask (no padding after
    EOS); their scores then make one (ensemble_scores)."""
    seen = []

    def fake_scores(model, input_ids, attention_mask):
        seen.append((input_ids.tolist(), attention_mask.tolist()))
        return model

    monkeypatch.setattr(common, "reward_scores", fake_scores)
    prompt_ids = torch.tensor([[7, 8]])
    prompt_mask = torch.tensor([[0, 1]])
    completion_ids = torch.tensor([[1, 2], [3, 0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    models_ = [torch.tensor([1.0, 3.0]), torch.tensor([5.0, 1.0])]
    each = [grpo.learned_scores(m, prompt_ids, prompt_mask, completion_ids, mask, 2) for m in models_]
    learned = ensemble_scores(torch.stack(each), "min")
    assert learned.tolist() == pytest.approx([-1.0, -1.0])  # z: (-1, 1) and (1, -1)
    assert seen[0] == ([[7, 8, 1, 2], [7, 8, 3, 0]], [[0, 1, 1, 1], [0, 1, 1, 0]])


ENTROPY = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 5.0]])


ENTROPY_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_high_entropy_mask_keeps_the_top_share_of_the_masked_tokens():
    # the 5 masked entropies, sorted: 0.1 0.3 0.5 0.7 0.9; the 0.6 quantile sits at 0.6 × 4 = 2.4: 0.5 + 0.4 × 0.2
    # = 0.58. At or above it: 0.9 and 0.7 (5.0 is padding): 2 of 5 tokens, the top 40 %.
    kept = high_entropy_mask(ENTROPY, ENTROPY_MASK, 0.4)
    assert kept.tolist() == [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    assert high_entropy_mask(ENTROPY, ENTROPY_MASK, 1.0).tolist() == ENTROPY_MASK.tolist()


def entropy_loss(**options):
    """Two completions of 3 and 2 tokens at ρ = 1 (Â = 1 and -1), β = 0, seq-mean-token-mean: each token's
    policy-gradient term is -Â, then the entropy options."""
    logprobs = torch.zeros(2, 3, requires_grad=True)
    entropy = ENTROPY.clone().requires_grad_(True)
    advantages = torch.tensor([1.0, -1.0])
    loss, _ = options_loss(
        logprobs, logprobs.detach(), None, advantages, ENTROPY_MASK, beta=0.0, entropy=entropy, **options
    )
    loss.backward()
    return loss.item(), entropy.grad


def test_top_entropy_quantile_keeps_the_policy_gradient_on_the_forking_tokens_only():
    # q = 0.4 keeps o_0's third token and o_1's second: (-1/3 + 1/2) / 2 = 0.083333; all tokens: (-1 + 1) / 2 = 0
    assert entropy_loss(top_entropy_quantile=0.4)[0] == pytest.approx(0.083333, abs=1e-6)
    assert entropy_loss()[0] == pytest.approx(0.0, abs=1e-7)


def test_the_entropy_bonus_is_aggregated_as_the_loss():
    # c = 0.1: o_0 (-1.01 - 1.05 - 1.09) / 3 = -1.05, o_1 (0.97 + 0.93) / 2 = 0.95: (-1.05 + 0.95) / 2 = -0.05;
    # ∂/∂H: -c / (B |o_i|): -0.1 / 6 on o_0's tokens, -0.1 / 4 on o_1's two, 0 on padding
    loss, grad = entropy_loss(entropy_coef=0.1)
    assert loss == pytest.approx(-0.05, abs=1e-6)
    expected = torch.tensor([[-0.1 / 6] * 3, [-0.025, -0.025, 0.0]])
    assert torch.allclose(grad, expected, atol=1e-7)


def test_an_entropy_bonus_moves_the_policy_where_the_rewards_are_flat(tmp_path):
    """The tiny model earns reward 0 on every completion: every advantage is 0 and the update's gradient is 0.
    An entropy bonus has a gradient of its own (the entropy is computed with one): the update moves."""
    flat = metrics_of(main(catalogue_args(tmp_path, steps=1, beta=0.0, save_model=False)))[0]
    bonus = metrics_of(main(catalogue_args(tmp_path, steps=1, beta=0.0, save_model=False, entropy_coef=0.1)))[
        0
    ]
    assert flat["reward"] == 0 and flat["grad_norm"] == 0.0
    assert bonus["grad_norm"] > 0.0


@pytest.mark.parametrize("importance_level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["clip", "cispo"])
def test_with_old_equal_to_current_the_ratio_is_exactly_one(importance_level, loss_type):
    # μ = 1: old = current.detach(). Nothing clips even at ε = 0, and the gradient is REINFORCE's,
    # -Â_i / (B |o_i|) on each token of o_i: -1/9, 2/3, -0.5/6. (At ε = 0 the clip's max ties, so the gradient
    # is taken at ε = 0.2.)
    logprobs = LOGPROBS3.clone().requires_grad_(True)
    options = dict(beta=0.0, importance_level=importance_level, loss_type=loss_type)
    _, metrics = options_loss(
        logprobs, logprobs.detach(), None, ADVANTAGES3, MASK3, eps_low=0.0, eps_high=0.0, **options
    )
    assert metrics["clip_ratio"] == 0.0
    loss, _ = options_loss(logprobs, logprobs.detach(), None, ADVANTAGES3, MASK3, **options)
    loss.backward()
    expected = torch.tensor([[-1 / 9] * 3, [2 / 3, 0, 0], [-0.5 / 6, -0.5 / 6, 0]])
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)


@pytest.mark.parametrize(
    "options, trl_loss",
    [
        # TRL: loss_type="grpo", importance_sampling_level="sequence"
        (dict(importance_level="sequence"), 0.3441809),
        # TRL: loss_type="cispo", epsilon_high=1.2
        (dict(loss_type="cispo", loss_agg="token-mean"), 0.5921609),
    ],
)
def test_gspo_and_cispo_match_trl(options, trl_loss):
    # TRL 1.16's value for these tensors: GRPOTrainer._compute_loss with β = 0.04 (its KL is k3, as here), one
    # process, no accumulation. TRL caps CISPO's ρ at epsilon_high itself, this file at 1 + eps_high.
    loss, _, _ = options_loss_and_grad(ref=REF3, beta=0.04, **options)
    assert loss == pytest.approx(trl_loss, abs=1e-5)


def test_weighted_rewards_cap_each_term_before_the_sum():
    # a verifier's 0/1 and a learned score of -6, 0.5 and 9, capped at 1 and 2: scores -2, 0.5, 2, so
    # 1·(1, 0, 1) + 0.5·(-2, 0.5, 2) = (0, 0.25, 2); uncapped the score's tail would give (-2, 0.25, 5.5)
    per_reward = torch.tensor([[1.0, -6.0], [0.0, 0.5], [1.0, 9.0]])
    weights = torch.tensor([1.0, 0.5])
    capped = capped_rewards(per_reward, (1.0, 2.0)) @ weights
    assert capped.tolist() == pytest.approx([0.0, 0.25, 2.0])
    assert (per_reward @ weights).tolist() == pytest.approx([-2.0, 0.25, 5.5])


def test_gspo_cispo_format_reward_and_r1_prompt_run_together(tmp_path, monkeypatch):
    calls = spy_on_loss(monkeypatch, grpo_options, "options_loss")
    args = catalogue_args(
        tmp_path,
        steps=2,
        importance_level="sequence",
        loss_type="cispo",
        rewards=("correct", "format"),
        reward_weights=(1.0, 0.5),
        prompt_style="r1",
        save_model=False,
    )
    result = main(args, reward_fn=digit_fraction)
    options = [(call["options"]["importance_level"], call["options"]["loss_type"]) for call in calls]
    assert options == [("sequence", "cispo")] * 2
    assert all(
        {"rewards/correct/mean", "rewards/format/mean", "clip_ratio"} <= set(row)
        for row in metrics_of(result)
    )
    assert result["samples_before"][0]["prompt"].endswith(tasks.R1_INSTRUCTION)


def test_an_ensemble_of_reward_models_scores_in_the_loop(tmp_path, tiny_reward_model_path):
    # the same model twice: each one's scores standardised over the batch are the same z, so their min and mean are
    # z itself, whose batch mean is 0 and whose population std is 1 (a batch whose scores all agree aside)
    args = catalogue_args(
        tmp_path,
        steps=1,
        reward_model=(tiny_reward_model_path, tiny_reward_model_path),
        reward_ensemble="min",
        save_model=False,
    )
    row = metrics_of(main(args, reward_fn=digit_fraction))[0]
    assert row["score"] == pytest.approx(0.0, abs=1e-5) and "verifier" in row


def test_resume_keeps_the_adapted_entropy_coefficient(tmp_path):
    # the coefficient moves every step (a target no entropy reaches: up by 0.01 a step), and is checkpointed with it
    assert_resume_is_exact(
        tmp_path,
        main,
        lambda out, **kw: catalogue_args(
            out, eval_every=2, entropy_target=100.0, entropy_coef_step=0.01, **kw
        ),
        reward_fn=digit_fraction,
    )


def test_the_entropy_coefficient_adapts_each_step_in_the_loop(tmp_path):
    rows = metrics_of(
        main(
            catalogue_args(tmp_path, steps=3, entropy_target=100.0, entropy_coef_step=0.01, save_model=False),
            reward_fn=digit_fraction,
        )
    )
    assert [row["entropy_coef"] for row in rows] == pytest.approx([0.01, 0.02, 0.03])
    below = metrics_of(
        main(catalogue_args(tmp_path, steps=2, entropy_target=0.0, entropy_coef=0.02, save_model=False))
    )
    assert [row["entropy_coef"] for row in below] == pytest.approx(
        [0.015, 0.01]
    )  # entropy above 0: down by 0.005


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(delta=1.1), r"--delta must be above 1 \+ --eps-high \(1.2\), not 1.1"),
        (dict(scale_by_std=False, scale_rewards="batch"), "--no-scale-by-std is --scale-rewards none"),
        (dict(top_entropy_quantile=0.0), r"--top-entropy-quantile must be in \(0, 1\]"),
        (dict(reward_clip=(1.0, 2.0)), "--reward-clip: one cap > 0 per --rewards"),
        (dict(reward_clip=(0.0,)), "--reward-clip: one cap > 0 per --rewards"),
        (
            dict(loss_type="sapo", sapo_temperatures=(1.0, 0.5)),
            "--sapo-temperatures: τ_pos > 0 and τ_neg >= τ_pos",
        ),
        (dict(sapo_temperatures=(1.0, 2.0)), "--sapo-temperatures acts only with --loss-type sapo"),
        (dict(vespo_params=(1.0, 1.0, 1.0, 1.0)), "--vespo-params acts only with --loss-type vespo"),
        (dict(loss_type="cispo", delta=4.0), "--delta acts only with the clip"),
        (dict(entropy_coef_step=0.1), "--entropy-coef-step acts only with --entropy-target"),
        (dict(entropy_coef_bounds=(0.0, 0.5)), "--entropy-coef-bounds acts only with --entropy-target"),
        (dict(reward_ensemble="min"), "--reward-ensemble acts only with several --reward-model"),
        (dict(loss_type="luspo"), "--loss-type luspo needs --importance-level sequence"),
        (
            dict(loss_type="luspo", importance_level="sequence", loss_agg="token-mean"),
            "sums each completion's tokens itself",
        ),
        (
            dict(loss_type="vespo", importance_level="sequence"),
            "--loss-type vespo weighs the whole completion",
        ),
        (
            dict(multi_objective_aggregation="normalize-then-sum"),
            "normalize-then-sum needs --scale-rewards batch",
        ),
        (dict(entropy_target=0.5, entropy_coef_step=0.0), "--entropy-target: --entropy-coef-step > 0"),
        # grpo.py's own checks hold here too
        (dict(group_size=1), "--group-size must be at least 2"),
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(catalogue_args(tmp_path, **overrides))
    assert not os.listdir(tmp_path)  # nothing was started


def test_cli_help_lists_the_catalogue_beside_every_option_of_grpo():
    proc = run_script_here("grpo_options.py", "--help")
    assert proc.returncode == 0
    for flag in (
        "--loss-type",
        "--importance-level",
        "--delta",
        "--sapo-temperatures",
        "--vespo-params",
        "--entropy-coef",
        "--entropy-target",
        "--top-entropy-quantile",
        "--scale-rewards",
        "--multi-objective-aggregation",
        "--reward-clip",
        "--reward-ensemble",
        "--group-size",
        "--loss-agg",
        "--dynamic-sampling",
    ):
        assert flag in proc.stdout, flag
    assert "cispo" in proc.stdout and "luspo" in proc.stdout


def test_grpo_refuses_the_catalogues_options_and_names_none_of_them():
    proc = run_script_here("grpo.py", "--model", "tiny", "--loss-type", "cispo")
    assert proc.returncode == 2 and "Unrecognized options: --loss-type" in proc.stderr
    help_text = run_script_here("grpo.py", "--help").stdout
    for flag in (
        "--loss-type",
        "--importance-level",
        "--delta",
        "--entropy-coef",
        "--scale-rewards",
        "--reward-clip",
    ):
        assert flag not in help_text, flag


def test_gspo_sequence_ratio_is_the_mean_log_ratio_of_each_completion_by_hand():
    # the padding's 9.0 never counts: (0.3 - 0.1) / 2 = 0.1 for every token of o_0, 0.2 for o_1
    log_ratio = torch.tensor([[0.3, -0.1, 9.0], [0.2, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    expected = torch.tensor([[0.1, 0.1, 0.1], [0.2, 0.2, 0.2]])
    assert torch.allclose(grpo_options.sequence_ratio(log_ratio, mask), expected)


def test_two_sided_clip_caps_a_negative_advantages_ratio_at_delta_by_hand():
    # Â = -1, ε = 0.2, δ = 4: max(min(ρ, 4), clip(ρ, 0.8, 1.2)) = 0.8, 1.1, 3, 4 for ρ = 0.5, 1.1, 3, 5
    ratio = torch.tensor([[0.5, 1.1, 3.0, 5.0]])
    capped = grpo_options.two_sided_clip(ratio, torch.tensor([[-1.0]]), 0.2, 0.2, 4.0)
    assert capped[0].tolist() == pytest.approx([0.8, 1.1, 3.0, 4.0])


def test_the_table_of_losses_side_by_side_by_hand():
    """ρ = 0.5, 1, 1.5 and log π = -1, -2, -0.5 on one completion, Â = 1, then Â = -1, the default knobs:
    clip   Â = 1: max(-ρ, -clip(ρ)) = -0.5, -1, -1.2; Â = -1: 0.8, 1, 1.5
    cispo  -min(ρ, 1.2) Â log π: 0.5, 2, 0.6, and their negatives
    sapo   Â = 1, τ = 1: -4 σ(ρ - 1) = -1.510166, -2, -2.489834;
           Â = -1, τ = 1.05: 4/1.05 σ(1.05 (ρ - 1)) = 1.415947, 1.904762, 2.393577
    vespo  w = 0.75, log w = -0.287682: φ = e^(3 + 2 log w - 3 w) = 1.190813 (k 2, λ 3), then e^(2 + 3 log w - 2 w) =
           0.695554 (k 3, λ 2): -φ Â log π
    luspo  the clip's tokens (it changes the aggregation)"""
    ratio = torch.tensor([[0.5, 1.0, 1.5]])
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]])
    mask = torch.ones(1, 3)
    knobs = grpo_options.Knobs()
    log_ratio = ratio.log()
    for adv, sign in ((torch.tensor([[1.0]]), 1), (torch.tensor([[-1.0]]), -1)):
        computed = {
            "clip": grpo_options.clip_loss(ratio, adv, logprobs, log_ratio, mask, knobs),
            "cispo": grpo_options.cispo_loss(ratio, adv, logprobs, log_ratio, mask, knobs),
            "sapo": grpo_options.sapo_loss(ratio, adv, logprobs, log_ratio, mask, knobs),
            "vespo": grpo_options.vespo_loss(ratio, adv, logprobs, log_ratio, mask, knobs),
        }
        expected = {
            "clip": [-0.5, -1.0, -1.2] if sign > 0 else [0.8, 1.0, 1.5],
            "cispo": [sign * 0.5, sign * 2.0, sign * 0.6],
            "sapo": [-1.510166, -2.0, -2.489834] if sign > 0 else [1.415947, 1.904762, 2.393577],
            "vespo": [1.190813, 2.381626, 0.595407] if sign > 0 else [-0.695554, -1.391109, -0.347777],
        }
        for name, per_token in computed.items():
            assert per_token[0].tolist() == pytest.approx(expected[name], abs=1e-5), name
    # the table: each name to its function, LUSPO's tokens the clip's
    assert grpo_options.LOSSES == {
        "clip": grpo_options.clip_loss,
        "cispo": grpo_options.cispo_loss,
        "sapo": grpo_options.sapo_loss,
        "vespo": grpo_options.vespo_loss,
        "luspo": grpo_options.clip_loss,
    }
