"""Gao et al.'s functional forms of reward over-optimisation (arXiv:2210.10760, eqs. 1-2), fitted to the
over-optimisation runs in docs/results.md: the gold reward's gain R over the start against d = √KL, the distance
from the starting policy,

    best-of-n   R(d) = d (α - β d)          peak at d* = α / (2β)
    RL          R(d) = d (α - β ln d)       peak at d* = exp(α/β - 1)

each fitted by least squares through the origin (R(0) = 0: no distance, no gain), with the fit's residual.

The points are the runs of "Reward over-optimisation: what mitigates it" (docs/results.md): `ppo.py` from the SFT
model on one learned reward model (AUC 0.65 against the verifier), each run with one mitigation of
`ppo_overoptimisation.py`, the gold reward being the verifier's 0/1 of the training samples and KL the k1 per
completion, both over each run's last 5 steps; the start is the SFT model's samples (0.65, KL 0). Each run ends at
its own distance, so the points trace gold against distance across runs of one reward model and one start, where
Gao et al. follow one run through its steps: a cross-section, and the mitigations change what is optimised.

    python scripts/gao_fit.py
"""

from __future__ import annotations

import math

import numpy as np

START_GOLD = 0.65
# (run, KL per completion, the verifier's reward of the samples), the last 5 steps of each run of the table
RUNS = [
    ("no mitigation", 8.37, 0.28),
    ("--verifier-weight 1", 9.06, 0.23),
    ("--kl-budget 1", 0.30, 0.65),
    ("--reward-clip 1", 4.86, 0.40),
    ("--length-penalty 0.05", 14.87, 0.17),
    ("--reward-clip 1 --verifier-weight 1", 2.99, 0.65),
    ("--ensemble of 3, min", 4.32, 0.42),
]


def basis(d: np.ndarray, form: str) -> np.ndarray:
    """The two columns R is linear in, (N,) -> (N, 2): R = α · col0 - β · col1."""
    if form == "best-of-n":
        return np.stack([d, -(d**2)], axis=1)
    if form == "rl":
        return np.stack([d, -d * np.log(d)], axis=1)
    raise ValueError(f"unknown form {form!r}: best-of-n or rl")


def fit(kl: np.ndarray, gain: np.ndarray, form: str) -> tuple[float, float, float]:
    """(α, β, root-mean-square residual) of R(d) = d (α - β f(d)), d = √KL, by least squares. (N,), (N,)"""
    columns = basis(np.sqrt(kl), form)
    (alpha, beta), *_ = np.linalg.lstsq(columns, gain, rcond=None)
    residual = gain - columns @ np.array([alpha, beta])
    return float(alpha), float(beta), float(np.sqrt(np.mean(residual**2)))


def peak_kl(alpha: float, beta: float, form: str) -> float:
    """The KL where the fitted R peaks (d*²); inf where it never turns (β <= 0), 0 where best-of-n's only falls
    (α <= 0: d (α - β d) < 0 for every d > 0)."""
    if beta <= 0:
        return math.inf
    if form == "best-of-n":
        return (max(alpha, 0.0) / (2 * beta)) ** 2
    return math.exp(2 * (alpha / beta - 1))


def main() -> str:
    kl = np.array([run[1] for run in RUNS])
    gain = np.array([run[2] for run in RUNS]) - START_GOLD
    lines = [
        "| form | α | β | RMS residual | gold's spread (std of R) | peak at KL |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for form in ("best-of-n", "rl"):
        alpha, beta, rms = fit(kl, gain, form)
        peak = peak_kl(alpha, beta, form)
        lines.append(
            f"| {form} | {alpha:.4f} | {beta:.4f} | {rms:.4f} | {gain.std():.4f} | "
            f"{'never' if math.isinf(peak) else f'{peak:.2f}'} |"
        )
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
