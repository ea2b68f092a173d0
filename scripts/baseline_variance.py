"""The variance a baseline removes, computed exactly on a K-armed bandit.

REINFORCE follows g = (1/G) Σ_g Â_g ∇_θ log π(y_g) over a group of G samples y_1 … y_G drawn from π.
With Â = r its expectation is the policy gradient, but its variance grows with the reward's offset;
subtracting a baseline b that does not depend on y_g keeps the expectation and removes that variance.
This script measures both, exactly, for the baselines of the project's algorithms.

The bandit is tests/test_bandit.py's: one prompt, K one-token answers (arms), a tabular softmax policy
π = softmax(θ) whose K logits are the parameters, known rewards r. Then

    ∇_θ log π(a) = e_a − π                       (the score of arm a, a K-vector)
    ∇J = ∇_θ E_π[r] = Σ_a π_a r_a (e_a − π)       (the exact policy gradient)

and every expectation over groups is a sum over all K^G groups y, each with probability Π_g π(y_g):
no sampling, no seeds. For each baseline the script reports
- the scale s = ⟨E[g], ∇J⟩ / ‖∇J‖² of the mean gradient E[g] (a K-vector) against ∇J, and the cosine
  between them, since a biased E[g] need not be parallel to ∇J;
- the bias ‖E[g] − ∇J‖;
- the total variance tr Cov[g] = E‖g‖² − ‖E[g]‖², computed as Σ_y p(y) ‖g(y) − E[g]‖²;
- tr Cov[g] / s², the variance of g/s: at a learning rate that makes the expected steps equal, the noise
  that is left. A baseline that shrinks E[g] shrinks tr Cov[g] with it, and this column undoes that.

The baselines, Â_g for sample g of the group:
- none: Â_g = r_g.
- group mean (grpo.group_advantages, scale_by_std=False; Dr. GRPO): Â_g = r_g − (1/G) Σ_h r_h. With one
  prompt the batch is the group, so the batch mean (the mean over every sample of the batch, the sample
  itself included) is this same baseline: one row stands for both. It includes r_g, so it depends on
  y_g: E[g] = ((G−1)/G) ∇J, biased by scale (tests/test_bandit.py derives it).
- group mean and std (grpo.group_advantages, its default): Â_g = (r_g − mean) / (std + 1e-4), population
  std; a group whose rewards are all equal gets 0. The divisor depends on y_g, so E[g] is not a multiple
  of ∇J in general.
- leave-one-out (variants.rloo_advantages, RLOO): Â_g = r_g − (1/(G−1)) Σ_{h≠g} r_h, independent of y_g:
  unbiased. Â_g = (G/(G−1)) (r_g − mean), so per group it is exactly G/(G−1) times the group-mean
  estimator, and its variance (G/(G−1))² times that one's: the same tr Cov[g] / s².
- critic, b = V = E_π[r]: the value that a critic trained on squared error converges to for this one
  prompt; unbiased. It is the exact value, the best case of a trained critic, which only estimates it.
- the variance-optimal constant b* = E_π[r ‖∇log π‖²] / E_π[‖∇log π‖²]. The samples are independent, so
  for a constant b, tr Cov[g] = (1/G) (E_π[(r − b)² ‖∇log π‖²] − ‖∇J‖²), a parabola in b with its minimum
  at b*. b* is not V: V minimises E_π[(r − b)²], not the variance weighted by ‖∇log π‖².

Each table is printed twice: for the rewards r and for r + offset. Every baseline's row is unchanged by
the offset (the mean, the std, V and b* all move with it); only the row without a baseline changes: E[g]
stays ∇J, because E_π[∇log π] = 0, while tr Cov[g] grows with the offset squared.

    python scripts/baseline_variance.py                    # K = 4, G = 4, offset 5
    python scripts/baseline_variance.py --group-size 8 --offset 100
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grpo import group_advantages  # noqa: E402
from variants import rloo_advantages  # noqa: E402

# Shapes: K arms, G group size, N = K^G groups.
# tests/test_bandit.py's π_ref as the policy, and rewards whose best arm is the least likely
PI = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)  # (K,)
R = torch.tensor([1.0, 0.7, 0.0, 0.0], dtype=torch.float64)  # (K,)


# ---- the bandit ---------------------------------------------------------------------------------------------
def all_groups(num_arms: int, group_size: int) -> torch.Tensor:
    """Every group of `group_size` arms, in lexicographic order. -> (K^G, G) arm indices"""
    return torch.tensor(list(itertools.product(range(num_arms), repeat=group_size)))


def group_probabilities(pi: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """p(y) = Π_g π(y_g): the samples of a group are independent. pi (K,), groups (N, G) -> (N,)"""
    return pi[groups].prod(dim=1)


def scores(pi: torch.Tensor, arms: torch.Tensor) -> torch.Tensor:
    """∇_θ log π(a) = e_a − π for the softmax logits θ. pi (K,), arms (...) -> (..., K)"""
    one_hot = torch.nn.functional.one_hot(arms, len(pi)).to(pi.dtype)
    return one_hot - pi


def exact_gradient(pi: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """∇J = Σ_a π_a r_a (e_a − π). -> (K,)"""
    arms = torch.arange(len(pi))
    return ((pi * r)[:, None] * scores(pi, arms)).sum(dim=0)


def value(pi: torch.Tensor, r: torch.Tensor) -> float:
    """V = E_π[r], the one prompt's value."""
    return (pi * r).sum().item()


def optimal_constant_baseline(pi: torch.Tensor, r: torch.Tensor) -> float:
    """b* = E_π[r ‖∇log π‖²] / E_π[‖∇log π‖²], the constant b with the least tr Cov[g]."""
    squared_norms = scores(pi, torch.arange(len(pi))).pow(2).sum(dim=1)  # (K,) ‖e_a − π‖²
    return ((pi * r * squared_norms).sum() / (pi * squared_norms).sum()).item()


# ---- the advantages: rewards (N·G,), consecutive runs of G are one group -> (N·G,) ------------------------
def no_baseline(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Â_g = r_g: plain REINFORCE."""
    return rewards


def group_mean(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Â_g = r_g − mean of the group, the sample itself included (= the batch mean, with one prompt)."""
    return group_advantages(rewards, group_size, scale_by_std=False)


def group_mean_and_std(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Â_g = (r_g − mean) / (std + 1e-4) within the group, GRPO's default."""
    return group_advantages(rewards, group_size, scale_by_std=True)


def leave_one_out(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Â_g = r_g − mean of the G − 1 other rewards of the group (RLOO)."""
    return rloo_advantages(rewards, group_size)


def constant_baseline(rewards: torch.Tensor, baseline: float) -> torch.Tensor:
    """Â_g = r_g − b for a b fixed before the group is drawn (a critic's value, or b*)."""
    return rewards - baseline


# ---- exact moments of g ----------------------------------------------------------------------------------
def gradient_estimates(pi: torch.Tensor, groups: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """g(y) = (1/G) Σ_g Â_g (e_{y_g} − π) for every group. groups (N, G), advantages (N, G) -> (N, K)"""
    return (advantages[:, :, None] * scores(pi, groups)).mean(dim=1)


def moments(pi: torch.Tensor, groups: torch.Tensor, advantages: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(E[g], tr Cov[g]), exact sums over all groups with their probabilities. groups, advantages (N, G)"""
    p = group_probabilities(pi, groups)  # (N,)
    g = gradient_estimates(pi, groups, advantages)  # (N, K)
    mean = (p[:, None] * g).sum(dim=0)  # (K,)
    # Σ p ‖g − E[g]‖² = E‖g‖² − ‖E[g]‖², without the cancellation when ‖g‖ is large
    total_variance = (p * (g - mean).pow(2).sum(dim=1)).sum().item()
    return mean, total_variance


def row(pi: torch.Tensor, r: torch.Tensor, groups: torch.Tensor, advantages: torch.Tensor) -> dict:
    """One baseline's numbers: scale s = ⟨E[g], ∇J⟩/‖∇J‖², cos(E[g], ∇J), bias ‖E[g] − ∇J‖, tr Cov[g]."""
    mean, total_variance = moments(pi, groups, advantages)
    grad = exact_gradient(pi, r)
    return {
        "mean": mean,
        "scale": (mean @ grad / (grad @ grad)).item(),
        "cos": torch.nn.functional.cosine_similarity(mean, grad, dim=0).item(),
        "bias": (mean - grad).norm().item(),
        "trace_cov": total_variance,
    }


def baseline_rows(pi: torch.Tensor, r: torch.Tensor, group_size: int) -> dict[str, dict]:
    """name -> row, for every baseline on the bandit (pi, r) with groups of `group_size`."""
    groups = all_groups(len(pi), group_size)  # (N, G)
    rewards = r[groups].reshape(-1)  # (N·G,)
    advantages = {
        "none (REINFORCE)": no_baseline(rewards, group_size),
        "group mean = batch mean (Dr. GRPO)": group_mean(rewards, group_size),
        "group mean and std (GRPO)": group_mean_and_std(rewards, group_size),
        "leave-one-out (RLOO)": leave_one_out(rewards, group_size),
        "critic, b = V = E_π[r]": constant_baseline(rewards, value(pi, r)),
        "optimal constant b*": constant_baseline(rewards, optimal_constant_baseline(pi, r)),
    }
    return {name: row(pi, r, groups, a.view(groups.shape)) for name, a in advantages.items()}


def table(rows: dict[str, dict]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| baseline | E[g] / ∇J (scale) | cos(E[g], ∇J) | bias ‖E[g] − ∇J‖ | tr Cov[g] | tr Cov[g] / scale² |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, x in rows.items():
        relative = x["trace_cov"] / x["scale"] ** 2
        lines.append(
            f"| {name} | {x['scale']:.4f} | {x['cos']:.4f} | {x['bias']:.4f} | {x['trace_cov']:.5f} "
            f"| {relative:.5f} |"
        )
    return "\n".join(lines)


def vector(x: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:.4f}" for v in x.tolist()) + "]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--group-size", type=int, default=4, help="G, at least 2 (leave-one-out needs one other)"
    )
    parser.add_argument("--offset", type=float, default=5.0, help="the second table's rewards are r + offset")
    args = parser.parse_args(argv)
    if args.group_size < 2:
        parser.error("--group-size must be at least 2")
    for r in (R, R + args.offset):
        grad = exact_gradient(PI, r)
        v = value(PI, r)
        b_star = optimal_constant_baseline(PI, r)
        num_groups = len(PI) ** args.group_size
        print(f"π = {vector(PI)}, r = {vector(r)}, G = {args.group_size}, {num_groups} groups")
        print(f"∇J = {vector(grad)}, V = {v:.4f}, b* = {b_star:.4f}")
        print()
        print(table(baseline_rows(PI, r, args.group_size)))
        print()


if __name__ == "__main__":
    main()
