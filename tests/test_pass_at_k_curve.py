"""scripts/pass_at_k_curve.py: the curve by hand, and the script end to end on the tiny model."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import pass_at_k_curve  # noqa: E402


def test_the_curve_by_hand():
    # n = 4 samples. One problem with c = 1 right: pass@1 = 1/4, pass@2 = 1 − C(3,2)/C(4,2) = 1 − 3/6 = 1/2,
    # pass@4 = 1. One with c = 0: 0 throughout. Averaged: 1/8, 1/4, 1/2.
    assert pass_at_k_curve.pass_at_k_curve([1, 0], 4) == pytest.approx({1: 0.125, 2: 0.25, 4: 0.5})
    # c = 2 of 4: pass@1 = 1/2, pass@2 = 1 − C(2,2)/C(4,2) = 5/6, pass@4 = 1
    assert pass_at_k_curve.pass_at_k_curve([2], 4) == pytest.approx({1: 0.5, 2: 5 / 6, 4: 1.0})
    assert pass_at_k_curve.powers_of_two(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert pass_at_k_curve.powers_of_two(6) == [1, 2, 4]


def test_the_script_runs_on_the_tiny_model(tmp_path, capsys):
    out = tmp_path / "curve.json"
    argv = ["--models", "tiny", "tiny-gpt2", "--problems", "2", "--samples", "4", "--chunk", "3"]
    result = pass_at_k_curve.main([*argv, "--max-new-tokens", "4", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "| model | pass@1 | pass@2 | pass@4 |" in printed and "| tiny-gpt2 |" in printed
    assert json.loads(out.read_text())["models"]["tiny"]["correct"] == result["models"]["tiny"]["correct"]
    # chunks of 3 and 1: every sample drawn once
    assert all(0 <= c <= 4 for row in result["models"].values() for c in row["correct"])
