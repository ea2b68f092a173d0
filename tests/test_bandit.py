"""The KL-regularised optimum on a K-armed bandit, reached with the project's own loss functions.

One prompt, K one-token answers (arms), a tabular softmax policy π = softmax(θ) whose K logits
are the parameters, known rewards r and a known reference π_ref. The KL-regularised objective

    J(π) = E_π[r] − β KL(π ‖ π_ref)

has the closed-form maximiser π*(a) ∝ π_ref(a) · exp(r(a)/β) (Rafailov et al. 2023, eq. 4: the
step DPO is built on). Each test below trains θ from θ = log π_ref with the project's functions and
compares the policy it reaches with a closed form, in total variation TV(p, q) = ½ Σ |p − q|.

No sampling noise: every expectation is exact, a sum over the K arms (or over all K^G groups of G
arms, with their probabilities). The functions' `mask` carries those probabilities: a masked mean
with weights π is the expectation under π. So the gradient followed is the algorithm's expected
gradient, and Adam walks to its stationary point.

PPO (ppo.kl_penalized_rewards, compute_gae, ppo_policy_loss): the k1 penalty goes into the reward
as a number, r̃_a = r_a − β (log π_a − log π_ref,a), and the policy gradient is E_π[r̃ ∇log π].
The missing −β E_π[∇log π] is 0, so this is ∇J exactly and the stationary point is π*. (The
critic is a baseline: it changes the variance, never the expectation; exact expectations need none.)

DPO (dpo.dpo_loss) on preferences from the Bradley-Terry model of r, P(a ≻ b) = σ(r_a − r_b): the
population loss over every pair is a logistic regression whose minimum has
β h_ab = r_a − r_b with h_ab = log π_a/π_ref,a − log π_b/π_ref,b, so β log π/π_ref = r + const: π*.

GRPO (grpo.group_advantages, grpo_loss) puts the KL in the loss, and reaches the stationary point
of the objective its own expected gradient follows, which is not always J's:
(a) Without std scaling, Â_g = r_g − (1/G) Σ_h r_h. The G − 1 other samples are independent of
    y_g and E_π[∇log π] = 0, so E[Â_g ∇log π(y_g)] = ((G−1)/G) ∇E_π[r]: the group-mean baseline
    shrinks the reward by c = (G−1)/G. With k2, E_π[∇k2] = ∇KL(π ‖ π_ref), so GRPO maximises
    c E_π[r] − β KL(π ‖ π_ref):  π ∝ π_ref · exp(c r / β), which is π* at the larger β/c.
(b) With k3, E_π[∇k3] = ∇KL(π_ref ‖ π) (the forward KL; see grpo.kl_estimate), so GRPO maximises
    c E_π[r] − β KL(π_ref ‖ π). On the simplex, ∂/∂π_a is the same for every arm:
    c r_a + β π_ref,a / π_a = λ, so  π_a = β π_ref,a / (λ − c r_a),  λ > c max r fixed by Σ π = 1.
    A different policy, not a rescaled π*: π_a ≥ β π_ref,a / λ keeps a floor under every arm π_ref
    likes, and above it the policy is greedier for the best arm than the reverse-KL optimum (a).
(c) Dividing Â by the group's std makes the reward scale vanish: r and 10 r give the same
    advantages, so the same policy, whereas π* at r and at 10 r are far apart. Where it lands: the
    expected gradient is Σ_a π_a ρ_a ∇log π_a − β ∇KL(π_ref ‖ π) with ρ_a = E[Â_g | y_g = a] over
    the policy's own groups, so the reached π satisfies (b)'s condition with ρ(π) for c·r:
    ρ_a(π) + β π_ref,a / π_a = λ, a fixed point rather than a formula. In words: the effective β is β
    times the reward std the policy's groups see, and std scaling turns the reward into nearly a
    rank: once π sits on the best arm, a group [1, 1, 1, x] gives x the advantage −√3 whatever x is,
    so every other arm is pushed down alike and they end up ordered by π_ref, not by reward (below,
    the r = 0.7 arm keeps less probability than the r = 0 arm).

Run as a script to print the README's table:  python tests/test_bandit.py
"""

import itertools
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpo import dpo_loss  # noqa: E402
from grpo import group_advantages, grpo_loss  # noqa: E402
from ppo import compute_gae, kl_penalized_rewards, ppo_policy_loss  # noqa: E402

R = torch.tensor([1.0, 0.7, 0.2, 0.0], dtype=torch.float64)  # rewards of the K = 4 arms
# the reference puts most mass on the worst arm
PI_REF = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
BETA, G = 0.5, 4


def tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * (p - q).abs().sum().item()


# ---- closed forms ------------------------------------------------------------------------------
def kl_optimum(r: torch.Tensor, pi_ref: torch.Tensor, beta: float) -> torch.Tensor:
    """π* ∝ π_ref · exp(r/β), the maximiser of E_π[r] − β KL(π ‖ π_ref)."""
    return torch.softmax(pi_ref.log() + r / beta, 0)


def forward_kl_optimum(r: torch.Tensor, pi_ref: torch.Tensor, beta: float) -> torch.Tensor:
    """The maximiser of E_π[r] − β KL(π_ref ‖ π): π_a = β π_ref,a / (λ − r_a), λ by bisection on Σ π = 1."""
    lo, hi = r.max().item(), r.max().item() + beta  # Σ π falls from ∞ at lo to ≤ 1 at hi
    for _ in range(200):
        lam = (lo + hi) / 2
        lo, hi = (lam, hi) if (beta * pi_ref / (lam - r)).sum() > 1 else (lo, lam)
    return beta * pi_ref / ((lo + hi) / 2 - r)


# ---- each algorithm's exact expected loss at θ ----------------------------------------------------
def ppo_expected_loss(theta, r, pi_ref, beta):
    logprobs = torch.log_softmax(theta, 0)[:, None]  # (K, 1) each arm is a one-token completion
    pi = logprobs.exp().detach()  # (K, 1) the arms' probabilities: the mask's weights
    ones = torch.ones_like(pi)  # (K, 1) every arm's one token is a completion token
    # (K, 1) r̃ = r − β k1
    rewards, _ = kl_penalized_rewards(r, logprobs.detach(), pi_ref.log()[:, None], ones, beta)
    advantages, _ = compute_gae(rewards, torch.zeros_like(rewards), ones)  # (K, 1) r̃ itself: no baseline
    loss, _ = ppo_policy_loss(logprobs, logprobs.detach(), advantages, pi)  # E_π of the clipped surrogate
    return loss


def dpo_expected_loss(theta, r, pi_ref, beta):
    logprobs = torch.log_softmax(theta, 0)  # (K,)
    # every ordered pair: a chosen, b rejected
    pairs = torch.tensor([(a, b) for a, b in itertools.permutations(range(len(r)), 2)])
    chosen, rejected = pairs[:, 0], pairs[:, 1]
    p_chosen = torch.sigmoid(r[chosen] - r[rejected])  # Bradley-Terry: how often a is preferred to b
    losses, _, _ = dpo_loss(
        logprobs[chosen], logprobs[rejected], pi_ref.log()[chosen], pi_ref.log()[rejected], beta
    )
    return (p_chosen * losses).sum() / p_chosen.sum()  # each unordered pair equally often, labelled by BT


def grpo_expected_loss(theta, r, pi_ref, beta, group_size, kl_kind, scale_by_std):
    K = len(r)
    logprobs = torch.log_softmax(theta, 0)  # (K,)
    # (K^G, G) every possible group
    groups = torch.tensor(list(itertools.product(range(K), repeat=group_size)))
    group_prob = logprobs.detach().exp()[groups].prod(1)  # (K^G,)
    arms = groups.reshape(-1)  # (K^G·G,) consecutive runs of G are one group
    advantages = group_advantages(r[arms], group_size, scale_by_std)  # (K^G·G,)
    # (K^G·G, 1) token-mean over these = E over groups of the group mean
    weights = group_prob.repeat_interleave(group_size)[:, None]
    lp = logprobs[arms][:, None]  # (K^G·G, 1)
    loss, _ = grpo_loss(
        lp,
        lp.detach(),
        pi_ref.log()[arms][:, None],
        advantages,
        weights,
        beta=beta,
        loss_agg="token-mean",
        kl_kind=kl_kind,
    )
    return loss


def reach(expected_loss, *args, steps: int = 1000, lr: float = 0.2) -> torch.Tensor:
    """Adam on θ, from θ = log π_ref, following the exact expected gradient; returns softmax(θ)."""
    pi_ref = args[1]
    theta = pi_ref.log().clone().requires_grad_(True)
    optimizer = torch.optim.Adam([theta], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        expected_loss(theta, *args).backward()
        optimizer.step()
    assert theta.grad.abs().max() < 1e-6, (
        "not converged: the test would compare a point that is not stationary"
    )
    return torch.softmax(theta.detach(), 0)


def cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name -> (the policy reached, its closed form)."""
    c = (G - 1) / G
    return {
        "PPO, k1 in the reward": (reach(ppo_expected_loss, R, PI_REF, BETA), kl_optimum(R, PI_REF, BETA)),
        "DPO on Bradley-Terry preferences": (
            reach(dpo_expected_loss, R, PI_REF, BETA),
            kl_optimum(R, PI_REF, BETA),
        ),
        "GRPO, k2 in the loss, no std scaling": (
            reach(grpo_expected_loss, R, PI_REF, BETA, G, "k2", False),
            kl_optimum(c * R, PI_REF, BETA),
        ),
        "GRPO, k3 in the loss, no std scaling": (
            reach(grpo_expected_loss, R, PI_REF, BETA, G, "k3", False),
            forward_kl_optimum(c * R, PI_REF, BETA),
        ),
    }


# ---- the closed forms themselves --------------------------------------------------------------
def test_kl_optimum_by_hand():
    # π_ref·exp(r/β) = [0.1·e², 0.2·e^1.4, 0.3·e^0.4, 0.4] = [0.738906, 0.811040, 0.447547, 0.4], sum 2.397493
    assert kl_optimum(R, PI_REF, BETA).tolist() == pytest.approx(
        [0.308199, 0.338287, 0.186673, 0.166841], abs=1e-6
    )


def test_forward_kl_optimum_satisfies_its_stationarity_condition():
    pi = forward_kl_optimum(R, PI_REF, BETA)
    assert pi.sum().item() == pytest.approx(1.0, abs=1e-12)
    # r_a + β π_ref,a / π_a is the same λ for every arm
    lam = R + BETA * PI_REF / pi
    assert (lam.max() - lam.min()).item() < 1e-9


# ---- the algorithms reach them ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def reached():
    return cases()


@pytest.mark.parametrize("name", ["PPO, k1 in the reward", "DPO on Bradley-Terry preferences"])
def test_ppo_and_dpo_reach_the_kl_regularised_optimum(reached, name):
    policy, closed_form = reached[name]
    assert tv(policy, closed_form) < 1e-4  # 2 % would show the optimum; exact expectations give far better


def test_grpo_with_k2_reaches_the_optimum_of_a_shrunk_reward(reached):
    policy, closed_form = reached["GRPO, k2 in the loss, no std scaling"]
    assert tv(policy, closed_form) < 1e-4
    assert tv(policy, kl_optimum(R, PI_REF, BETA)) > 0.05  # and that is not π*: (G-1)/G matters


def test_grpo_with_k3_reaches_the_forward_kl_optimum(reached):
    policy, closed_form = reached["GRPO, k3 in the loss, no std scaling"]
    assert tv(policy, closed_form) < 1e-4
    c = (G - 1) / G
    lam = c * R + BETA * PI_REF / policy  # Σ_a π_a λ = c E_π[r] + β, so λ is known
    assert (lam - (c * (policy * R).sum() + BETA)).abs().max().item() < 1e-6
    assert tv(policy, kl_optimum((G - 1) / G * R, PI_REF, BETA)) > 0.02  # not the reverse-KL optimum either


def expected_standardised_advantage(
    pi: list[float], r: list[float], group_size: int, eps: float = 1e-4
) -> list[float]:
    """ρ_a = E[Â_g | y_g = a] over all groups π samples, Â standardised within each group: a plain loop, by the
    definition."""
    joint = [0.0] * len(r)  # E[Â_g 1{y_g = a}], the same for every position g
    for group in itertools.product(range(len(r)), repeat=group_size):
        rewards = [r[a] for a in group]
        mean = sum(rewards) / group_size
        std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / group_size)
        if max(rewards) == min(rewards):
            continue
        p = math.prod(pi[a] for a in group)
        for a, x in zip(group, rewards):
            joint[a] += p * (x - mean) / (std + eps) / group_size
    return [j / q for j, q in zip(joint, pi)]


def test_grpo_with_std_scaling_lands_on_its_own_fixed_point():
    reached_r = reach(grpo_expected_loss, R, PI_REF, BETA, G, "k3", True)
    rho = torch.tensor(
        expected_standardised_advantage(reached_r.tolist(), R.tolist(), G), dtype=torch.float64
    )
    lam = rho + BETA * PI_REF / reached_r  # (b)'s stationarity with ρ(π) for c·r: the same λ for every arm
    assert (lam.max() - lam.min()).item() < 1e-6
    # Σ π λ = E[Â] + β Σ π_ref = β: each group's advantages sum to 0
    assert lam.mean().item() == pytest.approx(BETA, abs=1e-6)
    assert tv(reached_r, forward_kl_optimum((G - 1) / G * R, PI_REF, BETA)) > 0.05  # not (b)'s policy
    assert reached_r[1] < reached_r[3]  # the r = 0.7 arm below the r = 0 arm: ordered by π_ref, not by reward


def test_grpo_with_std_scaling_ignores_the_reward_scale():
    reached_r = reach(grpo_expected_loss, R, PI_REF, BETA, G, "k3", True)
    reached_10r = reach(grpo_expected_loss, 10 * R, PI_REF, BETA, G, "k3", True)
    assert tv(reached_r, reached_10r) < 1e-3  # eps = 1e-4 in the std is the only trace of the scale
    # π* depends on it strongly
    assert tv(kl_optimum(R, PI_REF, BETA), kl_optimum(10 * R, PI_REF, BETA)) > 0.5


if __name__ == "__main__":
    rows = cases()
    std_r = reach(grpo_expected_loss, R, PI_REF, BETA, G, "k3", True)
    std_10r = reach(grpo_expected_loss, 10 * R, PI_REF, BETA, G, "k3", True)
    fmt = lambda p: "[" + ", ".join(f"{x:.3f}" for x in p.tolist()) + "]"  # noqa: E731
    star = kl_optimum(R, PI_REF, BETA)
    print(f"r = {fmt(R)}, π_ref = {fmt(PI_REF)}, β = {BETA}, G = {G};  π* = {fmt(star)}\n")
    print("| algorithm | closed form | reached | TV(reached, closed form) | TV(reached, π*) |")
    print("| --- | --- | --- | --- | --- |")
    for name, (policy, closed_form) in rows.items():
        print(
            f"| {name} | {fmt(closed_form)} | {fmt(policy)} | {tv(policy, closed_form):.1e} | {tv(policy, star):.3f} |"
        )
    print(
        f"| GRPO, k3, std scaling, reward r | (none: depends on the policy) | {fmt(std_r)} | | {tv(std_r, star):.3f} |"
    )
    print(
        f"| GRPO, k3, std scaling, reward 10 r | | {fmt(std_10r)} | TV to the row above: {tv(std_10r, std_r):.1e} "
        f"| {tv(std_10r, kl_optimum(10 * R, PI_REF, BETA)):.3f} (to π* of 10 r) |"
    )
