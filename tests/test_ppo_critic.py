"""scripts/ppo_critic.py: the critic's values against the returns by position, and the advantage's sign against the
outcome, by hand; then on a tiny PPO run's saved policy and critic."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import ppo_critic  # noqa: E402
import ppo  # noqa: E402
from test_ppo import tiny_args  # noqa: E402


def test_by_position_by_hand():
    # two completions of 3 and 1 tokens, buckets of 2 positions: positions 1-2 hold 3 tokens, 3-4 one
    values = torch.tensor([[0.5, 0.5, 1.0, 0.0], [0.0, 9.0, 9.0, 9.0]])
    returns = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    first, second = ppo_critic.by_position(values, returns, mask, width=2)
    assert first["positions"] == "1-2" and first["tokens"] == 3
    assert first["return"] == pytest.approx(2 / 3) and first["value"] == pytest.approx(1 / 3)
    # returns 1, 1, 0 (variance 2/9); residuals 0.5, 0.5, 0 (variance 1/18): 1 - (1/18) / (2/9) = 0.75
    assert first["explained_variance"] == pytest.approx(0.75)
    assert second["tokens"] == 1 and second["return"] == 1.0 and second["value"] == 1.0


def test_sign_agreement_by_hand():
    # outcomes 1, 0, 0 (mean 1/3): signs +, -, -. Row 0 agrees on both tokens, row 1 on its first only, row 2 on
    # none; padding (row 1's second token) is not counted
    advantages = torch.tensor([[0.5, 0.2], [-1.0, 3.0], [0.1, 0.1]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    tokens, first = ppo_critic.sign_agreement(advantages, torch.tensor([1.0, 0.0, 0.0]), mask)
    assert tokens == pytest.approx(3 / 5) and first == pytest.approx(2 / 3)


def test_a_tiny_run_is_read_back(tmp_path, capsys):
    result = ppo.main(tiny_args(tmp_path, None, reward="verifier", steps=1))
    read = ppo_critic.main([result["run_dir"], "--batch-size", "4"])
    assert sum(row["tokens"] for row in read["by_position"]) > 0 and 0 <= read["sign_agreement_tokens"] <= 1
    assert "advantage's sign" in capsys.readouterr().out
