"""scripts/ppo_budget.py: the criterion by hand, and a search that stops at the first budget where every seed
learns (the runs stubbed: each is a real ppo.py run of minutes)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import compare  # noqa: E402
import ppo_budget  # noqa: E402
import sensitivity  # noqa: E402


def run(explained, before=0.3, after=0.4):
    return {"explained_variance (last quarter)": explained, "accuracy_before": before, "accuracy": after}


def test_a_run_learns_when_its_critic_explains_the_returns_and_its_accuracy_rises():
    assert ppo_budget.learns(run(0.1))
    assert not ppo_budget.learns(run(-0.1))
    # no step with a defined explained variance: not learned
    assert not ppo_budget.learns(run(None))
    # the critic learned but the policy did not improve
    assert not ppo_budget.learns(run(0.1, after=0.3))


def test_the_search_stops_at_the_first_budget_where_every_seed_learns(tmp_path, monkeypatch):
    # explained variance by (budget, seed): at 128 seed 1's critic has not learned; at 256 every seed's has
    explained = {(128, 0): 0.2, (128, 1): -0.5, (256, 0): 0.1, (256, 1): 0.3, (384, 0): 0.4, (384, 1): 0.4}
    calls = []

    def one_run(args, slug, seed, out):
        calls.append((args.budget, seed, slug))
        return {"completions": args.budget, "seed": seed, "run_dir": f"{args.budget}/{seed}", **run(None)}

    def logged(run_dir, key, how):
        budget, seed = map(int, str(run_dir).split("/"))
        return explained[(budget, seed)] if how == "last quarter" else 0.0

    monkeypatch.setattr(compare, "ALGORITHMS", dict(compare.ALGORITHMS))  # the search adds its rows there
    monkeypatch.setattr(compare, "one_run", one_run)
    monkeypatch.setattr(sensitivity, "logged", logged)
    found = ppo_budget.main(["--budgets", "384", "128", "256", "--seeds", "0", "1", "--out", str(tmp_path)])
    assert found == 256
    # smallest first, every seed of a budget, none past the first that passes
    assert [(b, s) for b, s, _ in calls] == [(128, 0), (128, 1), (256, 0), (256, 1)]
    # each budget's runs in a folder of their own, ppo.py at its defaults: 128 completions a step
    assert calls[0][2] == "ppo-verifier-128"
    assert compare.ALGORITHMS["ppo-verifier-128"][1:] == (["ppo.py", "--reward", "verifier"], 128)
    table = (tmp_path / "search.md").read_text()
    assert "| 128 | 1 | 0.300 → 0.400 | -0.500 | no |" in table
    assert "| 256 | 1 | 0.300 → 0.400 | 0.300 | yes |" in table
