"""scripts/tool_study.py: the table by hand, and the study end to end on the tiny model."""

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import tool_study  # noqa: E402


def test_the_table_by_hand():
    rows = [
        {
            "stage": "starting model, the question alone",
            "accuracy": 0.1,
            "sampled": 0.05,
            "tool/use": 0.0,
            "tool/well_formed": math.nan,
        },
        {
            "stage": "after GRPO, with the tool",
            "accuracy": 0.5,
            "sampled": 0.2,
            "tool/use": 1.0,
            "tool/well_formed": 0.9,
        },
        {
            "stage": "after GRPO, with the tool",
            "accuracy": 0.7,
            "sampled": 0.4,
            "tool/use": 0.8,
            "tool/well_formed": math.nan,
        },
    ]
    text = tool_study.table(rows)
    # a model that never calls has no share of well-formed calls: "—"
    assert (
        "| starting model, the question alone | 0.100 ± 0.000 | 0.050 ± 0.000 | 0.000 ± 0.000 | — | 1 |"
        in text
    )
    # 0.6 ± stdev(0.5, 0.7) = 0.141; 0.3 ± stdev(0.2, 0.4) = 0.141; 0.9 ± stdev(0.8, 1.0) = 0.141; the NaN seed
    # left out of the last column
    row = "| after GRPO, with the tool | 0.600 ± 0.141 | 0.300 ± 0.141 | 0.900 ± 0.141 | 0.900 ± 0.000 | 2 |"
    assert row in text


def test_the_study_runs_on_the_tiny_model_and_reads_its_runs_back(tmp_path, capsys):
    argv = [
        "--model",
        "tiny",
        "--seeds",
        "0",
        "--demonstrations",
        "40",
        "--sft-steps",
        "2",
        "--grpo-steps",
        "2",
        "--sft-lr",
        "2e-5",
    ]
    rows = tool_study.main([*argv, "--eval-size", "4", "--out", str(tmp_path)])
    assert [r["stage"] for r in rows] == [
        "starting model, the question alone",
        "starting model, with the tool",
        "after SFT, with the tool",
        "after GRPO, with the tool",
        "after SFT, the calculator off",
        "after GRPO, the calculator off",
    ]
    # the question alone has no calculator: no share of calls to count ("—")
    assert math.isnan(rows[0]["tool/use"]) and rows[1]["tool/use"] == 0.0
    sft_args = json.loads(next((tmp_path / "seed-0" / "sft").glob("*/args.json")).read_text())
    assert sft_args["lr"] == 2e-5
    # the GRPO run started from the SFT run's model
    grpo_args = json.loads(next((tmp_path / "seed-0" / "grpo").glob("*/args.json")).read_text())
    assert grpo_args["model"].startswith(str(tmp_path / "seed-0" / "sft"))
    # and so did the run with the calculator off, which answers no call
    off_args = json.loads(next((tmp_path / "seed-0" / "grpo-calculator-off").glob("*/args.json")).read_text())
    assert off_args["model"] == grpo_args["model"] and (off_args["max_calls"], grpo_args["max_calls"]) == (
        0,
        2,
    )
    assert math.isnan(rows[-1]["tool/use"]) and math.isnan(rows[-1]["tool/well_formed"])
    assert "| after GRPO, with the tool |" in capsys.readouterr().out
    again = tool_study.main([*argv, "--eval-size", "4", "--out", str(tmp_path)])
    assert json.dumps(again) == json.dumps(rows)


def test_ask_scores_each_problems_samples_at_temperature_one(monkeypatch):
    # a stand-in sampler: greedy, every answer wrong; at temperature 1, the first of each problem's samples right
    args = argparse.Namespace(model="tiny", device="cpu", eval_size=5, samples=4)
    heldout = tool_study.tasks.heldout_problems(5, make=tool_study.tools.make_tool_problem)
    answers = iter([p.answer for p in heldout])
    drawn = []

    def sample_with_tool(policy, tokenizer, ids, mask, group_size, options, generator, temperature):
        drawn.append((len(ids), group_size, temperature))
        rows = []
        for _ in range(len(ids)):
            answer = next(answers) if temperature == 1.0 else "-1"
            rows += [tool_study.grpo_tools.Transcript([], [], [], last_turn=answer)]
            rows += [
                tool_study.grpo_tools.Transcript([], [], [], last_turn="-1") for _ in range(group_size - 1)
            ]
        return rows

    monkeypatch.setattr(tool_study.grpo_tools, "sample_with_tool", sample_with_tool)
    asked = tool_study.ask(args, "tiny", True, 2)
    assert drawn == [(5, 1, 0.0), (5, 4, 1.0)]
    # greedy: none right; sampled: 1 of each problem's 4
    assert asked["accuracy"] == 0.0 and asked["sampled"] == 0.25
