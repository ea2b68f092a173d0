"""scripts/gao_fit.py: Gao et al.'s forms fitted by hand-computed points."""

import math
import sys

import numpy as np
import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

import gao_fit  # noqa: E402


def test_the_best_of_n_form_is_recovered_from_its_own_points():
    """α = 0.3, β = 0.05: R(d) = d (0.3 - 0.05 d) at d = 1, 2, 3 is 0.25, 0.4, 0.45; the peak d* = α / 2β = 3, KL 9."""
    alpha, beta, rms = gao_fit.fit(np.array([1.0, 4.0, 9.0]), np.array([0.25, 0.4, 0.45]), "best-of-n")
    assert (alpha, beta, rms) == pytest.approx((0.3, 0.05, 0.0), abs=1e-9)
    assert gao_fit.peak_kl(alpha, beta, "best-of-n") == pytest.approx(9.0)
    assert gao_fit.peak_kl(-0.1, 0.05, "best-of-n") == 0.0  # falls from the start
    assert gao_fit.peak_kl(0.1, 0.0, "best-of-n") == math.inf


def test_the_rl_form_is_recovered_from_its_own_points():
    """α = 0.2, β = 0.1: R(d) = d (0.2 - 0.1 ln d): 0.2 at d = 1, e · 0.1 = 0.271828 at d = e, 0 at d = e²; the peak
    d* = exp(α/β - 1) = e, KL e² = 7.389056."""
    kl = np.array([1.0, math.e**2, math.e**4])
    alpha, beta, rms = gao_fit.fit(kl, np.array([0.2, 0.271828, 0.0]), "rl")
    assert (alpha, beta) == pytest.approx((0.2, 0.1), abs=1e-6) and rms == pytest.approx(0.0, abs=1e-6)
    assert gao_fit.peak_kl(alpha, beta, "rl") == pytest.approx(7.389056, abs=1e-4)


def test_a_residual_is_the_root_mean_square_of_the_misses():
    """Through (d, R) = (1, 1) and (1, -1) (both at KL 1) no curve passes: the fit takes R(1) = 0, residuals ±1."""
    alpha, beta, rms = gao_fit.fit(np.array([1.0, 1.0]), np.array([1.0, -1.0]), "rl")
    assert alpha == pytest.approx(0.0, abs=1e-9) and rms == pytest.approx(1.0)
