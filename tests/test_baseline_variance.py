"""scripts/baseline_variance.py: the exact mean and variance of the policy-gradient estimator under each baseline,
by hand on a 2-armed bandit with groups of 2, against a plain loop, and the lesson's claims on the 4-armed one.

The hand bandit: π = (1/4, 3/4), r = (1, 0), G = 2. The scores are multiples of u = (1, −1), ‖u‖² = 2:
∇log π(0) = e_0 − π = (3/4) u, ∇log π(1) = e_1 − π = −(1/4) u, and ∇J = π_0 r_0 ∇log π(0) = (3/16) u.
The four groups (y_1, y_2) have probabilities 1/16, 3/16, 3/16, 9/16.
"""

import itertools
import math
import sys

import pytest
import torch

from conftest import REPO, run_script

sys.path.insert(0, str(REPO / "scripts"))
import baseline_variance as bv  # noqa: E402

PI2 = torch.tensor([0.25, 0.75], dtype=torch.float64)  # (K,) the hand bandit
R2 = torch.tensor([1.0, 0.0], dtype=torch.float64)  # (K,)


def hand_moments(advantages_fn, r: torch.Tensor) -> tuple[list[float], float]:
    """(E[g], tr Cov[g]) on the hand bandit with groups of 2."""
    groups = bv.all_groups(2, 2)
    advantages = advantages_fn(r[groups].reshape(-1), 2).view(groups.shape)
    mean, total_variance = bv.moments(PI2, groups, advantages)
    return mean.tolist(), total_variance


# ---- the pieces ------------------------------------------------------------------------------------------------
def test_scores_are_the_gradient_of_log_softmax():
    theta = torch.tensor([0.3, -1.2, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    pi = torch.softmax(theta, 0).detach()
    for a in range(4):
        (grad,) = torch.autograd.grad(torch.log_softmax(theta, 0)[a], theta)
        assert bv.scores(pi, torch.tensor(a)).tolist() == pytest.approx(grad.tolist(), abs=1e-15)
    # by hand: e_0 − π = (1 − 1/4, −3/4)
    assert bv.scores(PI2, torch.tensor([0, 1])).tolist() == [[0.75, -0.75], [-0.25, 0.25]]


def test_exact_gradient_is_the_gradient_of_the_expected_reward():
    theta = torch.tensor([0.3, -1.2, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad((torch.softmax(theta, 0) * bv.R).sum(), theta)
    pi = torch.softmax(theta, 0).detach()
    assert bv.exact_gradient(pi, bv.R).tolist() == pytest.approx(grad.tolist(), abs=1e-15)
    assert bv.exact_gradient(PI2, R2).tolist() == [3 / 16, -3 / 16]  # (3/16) u


def test_group_probabilities_sum_to_one():
    groups = bv.all_groups(4, 3)
    assert groups.shape == (64, 3)
    assert bv.group_probabilities(bv.PI, groups).sum().item() == pytest.approx(1.0, abs=1e-15)
    assert bv.group_probabilities(PI2, bv.all_groups(2, 2)).tolist() == [1 / 16, 3 / 16, 3 / 16, 9 / 16]


# ---- by hand: K = 2, G = 2 ------------------------------------------------------------------------------------
def test_no_baseline_by_hand():
    # g = ½ (r_1 ∇log π(y_1) + r_2 ∇log π(y_2)):
    #   (0,0) p 1/16: ½ (3/4 + 3/4) u = (3/4) u;  (0,1), (1,0) p 3/16 each: (3/8) u;  (1,1) p 9/16: 0
    # E[g] = (1/16)(3/4) u + (6/16)(3/8) u = (3/16) u = ∇J: unbiased
    # E‖g‖² = 2 [(1/16)(9/16) + (6/16)(9/64)] = 45/256;  ‖E[g]‖² = 2 (9/256) = 18/256;  tr Cov = 27/256
    mean, total_variance = hand_moments(bv.no_baseline, R2)
    assert mean == pytest.approx([3 / 16, -3 / 16], abs=1e-15)
    assert total_variance == pytest.approx(27 / 256, abs=1e-15)


def test_leave_one_out_by_hand():
    # Â = (r_1 − r_2, r_2 − r_1): (0,0), (1,1) give Â = 0, so g = 0;
    #   (0,1): Â = (1, −1), g = ½ ((3/4) u + (1/4) u) = ½ u;  (1,0): the same ½ u
    # E[g] = (6/16)(½) u = (3/16) u = ∇J: unbiased
    # E‖g‖² = (6/16)(¼)(2) = 48/256;  tr Cov = 48/256 − 18/256 = 30/256, more than no baseline's 27/256 here
    mean, total_variance = hand_moments(bv.leave_one_out, R2)
    assert mean == pytest.approx([3 / 16, -3 / 16], abs=1e-15)
    assert total_variance == pytest.approx(30 / 256, abs=1e-15)


def test_group_mean_by_hand():
    # with G = 2, Â = ½ (r_1 − r_2, r_2 − r_1): half of leave-one-out's, group by group
    # E[g] = (3/32) u = ½ ∇J = ((G−1)/G) ∇J;  tr Cov = ¼ (30/256) = 30/1024
    mean, total_variance = hand_moments(bv.group_mean, R2)
    assert mean == pytest.approx([3 / 32, -3 / 32], abs=1e-15)
    assert total_variance == pytest.approx(30 / 1024, abs=1e-15)


def test_an_offset_by_hand():
    # r + 5 = (6, 5): no baseline's tr Cov = ½ (E_π[r² ‖∇log π‖²] − ‖∇J‖²), ‖∇log π(0)‖² = 9/8, ‖∇log π(1)‖² = 1/8:
    #   ½ (¼·36·9/8 + ¾·25·1/8 − 18/256) = ½ (3192/256 − 18/256) = 1587/256; E[g] still (3/16) u
    mean, total_variance = hand_moments(bv.no_baseline, R2 + 5)
    assert mean == pytest.approx([3 / 16, -3 / 16], abs=1e-13)
    assert total_variance == pytest.approx(1587 / 256, abs=1e-13)
    # leave-one-out sees only differences of rewards: 30/256 still
    assert hand_moments(bv.leave_one_out, R2 + 5)[1] == pytest.approx(30 / 256, abs=1e-13)


# ---- against a plain loop -----------------------------------------------------------------------------------
def loop_moments(
    pi: list[float], r: list[float], group_size: int, advantages_fn
) -> tuple[list[float], float]:
    """E[g] and E‖g‖² − ‖E[g]‖² by the definitions, a Python loop over every group."""
    K = len(pi)
    first = [0.0] * K  # E[g]
    second = 0.0  # E‖g‖²
    for group in itertools.product(range(K), repeat=group_size):
        p = math.prod(pi[a] for a in group)
        rewards = torch.tensor([r[a] for a in group], dtype=torch.float64)
        advantages = advantages_fn(rewards, group_size).tolist()
        g = [0.0] * K
        for a, adv in zip(group, advantages):
            for k in range(K):
                g[k] += adv * ((k == a) - pi[k]) / group_size
        first = [f + p * x for f, x in zip(first, g)]
        second += p * sum(x * x for x in g)
    return first, second - sum(f * f for f in first)


@pytest.mark.parametrize(
    "advantages_fn", [bv.no_baseline, bv.group_mean, bv.group_mean_and_std, bv.leave_one_out]
)
def test_moments_match_a_plain_loop(advantages_fn):
    groups = bv.all_groups(4, 3)
    advantages = advantages_fn(bv.R[groups].reshape(-1), 3).view(groups.shape)
    mean, total_variance = bv.moments(bv.PI, groups, advantages)
    loop_mean, loop_variance = loop_moments(bv.PI.tolist(), bv.R.tolist(), 3, advantages_fn)
    assert mean.tolist() == pytest.approx(loop_mean, abs=1e-14)
    assert total_variance == pytest.approx(loop_variance, abs=1e-14)


# ---- the lesson on the 4-armed bandit ------------------------------------------------------------------------
@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_leave_one_out_is_unbiased_and_the_group_mean_scaled_by_g_minus_1_over_g(group_size):
    rows = bv.baseline_rows(bv.PI, bv.R, group_size)
    grad = bv.exact_gradient(bv.PI, bv.R)
    c = (group_size - 1) / group_size
    assert rows["leave-one-out (RLOO)"]["mean"].tolist() == pytest.approx(grad.tolist(), abs=1e-15)
    assert rows["none (REINFORCE)"]["mean"].tolist() == pytest.approx(grad.tolist(), abs=1e-15)
    assert rows["critic, b = V = E_π[r]"]["mean"].tolist() == pytest.approx(grad.tolist(), abs=1e-15)
    assert rows["group mean = batch mean (Dr. GRPO)"]["mean"].tolist() == pytest.approx(
        (c * grad).tolist(), abs=1e-15
    )
    # leave-one-out is G/(G−1) times the group-mean estimator in every group: variance × (G/(G−1))²
    loo = rows["leave-one-out (RLOO)"]["trace_cov"]
    mean_only = rows["group mean = batch mean (Dr. GRPO)"]["trace_cov"]
    assert loo == pytest.approx(mean_only / c**2, rel=1e-12)


def test_std_scaling_is_biased_and_not_parallel_to_the_gradient():
    x = bv.baseline_rows(bv.PI, bv.R, 4)["group mean and std (GRPO)"]
    assert x["bias"] > 0.1
    assert x["scale"] > 1.5  # dividing by a std of about 0.4 scales up
    assert x["cos"] < 1 - 1e-3  # not a multiple of ∇J


def test_an_offset_grows_only_the_variance_without_a_baseline():
    plain = bv.baseline_rows(bv.PI, bv.R, 4)
    shifted = bv.baseline_rows(bv.PI, bv.R + 5, 4)
    for name in plain:
        assert shifted[name]["mean"].tolist() == pytest.approx(plain[name]["mean"].tolist(), abs=1e-12)
        if name != "none (REINFORCE)":
            assert shifted[name]["trace_cov"] == pytest.approx(plain[name]["trace_cov"], abs=1e-12)
    assert shifted["none (REINFORCE)"]["trace_cov"] > 100 * plain["none (REINFORCE)"]["trace_cov"]
    # with a baseline, the offset r + 5 costs nothing; without, 5 is its own signal-free noise
    assert shifted["leave-one-out (RLOO)"]["trace_cov"] < plain["none (REINFORCE)"]["trace_cov"]


def constant_baseline_variance(baseline: float, group_size: int) -> float:
    """tr Cov[g] = (1/G) (E_π[(r − b)² ‖∇log π‖²] − ‖∇J‖²): G independent samples, E_π[(r − b) ∇log π] = ∇J."""
    squared_norms = bv.scores(bv.PI, torch.arange(4)).pow(2).sum(1)  # (K,)
    grad = bv.exact_gradient(bv.PI, bv.R)
    return (((bv.PI * (bv.R - baseline) ** 2 * squared_norms).sum() - grad @ grad) / group_size).item()


@pytest.mark.parametrize("baseline", [0.0, 0.24, 0.5, -2.0])
def test_a_constant_baselines_variance_matches_its_closed_form(baseline):
    groups = bv.all_groups(4, 4)
    advantages = bv.constant_baseline(bv.R[groups].reshape(-1), baseline).view(groups.shape)
    mean, total_variance = bv.moments(bv.PI, groups, advantages)
    assert mean.tolist() == pytest.approx(bv.exact_gradient(bv.PI, bv.R).tolist(), abs=1e-15)
    assert total_variance == pytest.approx(constant_baseline_variance(baseline, 4), abs=1e-15)


def test_the_optimal_constant_beats_the_value():
    # ‖e_a − π‖² = (1 − π_a)² + Σ_{k≠a} π_k² = 1 − 2π_a + Σπ², Σπ² = 0.3: (1.1, 0.9, 0.7, 0.5)
    # E_π‖∇log π‖² = 0.11 + 0.18 + 0.21 + 0.2 = 0.7;  E_π[r ‖∇log π‖²] = 0.1·1·1.1 + 0.2·0.7·0.9 = 0.236
    # b* = 0.236 / 0.7 = 0.337143, above V = 0.1 + 0.14 = 0.24: the best arm's score is the longest
    b_star = bv.optimal_constant_baseline(bv.PI, bv.R)
    assert b_star == pytest.approx(0.236 / 0.7, abs=1e-15)
    assert bv.value(bv.PI, bv.R) == pytest.approx(0.24, abs=1e-15)
    rows = bv.baseline_rows(bv.PI, bv.R, 4)
    critic = rows["critic, b = V = E_π[r]"]["trace_cov"]
    assert critic == pytest.approx(constant_baseline_variance(0.24, 4), abs=1e-15)
    assert rows["optimal constant b*"]["trace_cov"] == pytest.approx(
        constant_baseline_variance(0.236 / 0.7, 4), abs=1e-15
    )
    assert rows["optimal constant b*"]["trace_cov"] < critic
    for b in (b_star - 0.01, b_star + 0.01):
        groups = bv.all_groups(4, 4)
        advantages = bv.constant_baseline(bv.R[groups].reshape(-1), b).view(groups.shape)
        assert bv.moments(bv.PI, groups, advantages)[1] > rows["optimal constant b*"]["trace_cov"]


# ---- the script ------------------------------------------------------------------------------------------------
def test_main_prints_both_tables(capsys):
    bv.main(["--group-size", "3", "--offset", "5"])
    out = capsys.readouterr().out
    assert out.count("| baseline |") == 2
    assert "r = [6.0000, 5.7000, 5.0000, 5.0000], G = 3, 64 groups" in out
    assert "| leave-one-out (RLOO) | 1.0000 | 1.0000 | 0.0000 |" in out
    assert "| group mean = batch mean (Dr. GRPO) | 0.6667 | 1.0000 |" in out


def test_command_line():
    proc = run_script("scripts/baseline_variance.py", "--group-size", "2")
    assert proc.returncode == 0, proc.stderr
    assert "G = 2, 16 groups" in proc.stdout
    proc = run_script("scripts/baseline_variance.py", "--group-size", "1")
    assert proc.returncode == 2
    assert "at least 2" in proc.stderr
