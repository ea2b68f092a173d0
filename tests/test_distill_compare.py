"""scripts/distill_compare.py: the rows sft.py needs, the table by hand, and the comparison end to end on the tiny
model."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import compare  # noqa: E402
import distill_compare  # noqa: E402
import sft  # noqa: E402
from conftest import args_of  # noqa: E402


def test_rows_to_draw_leave_exactly_the_samples_after_sfts_held_out_tenth():
    # 2,624 rows: sft.py holds out min(64, 262) = 64 and trains on 2,560
    assert distill_compare.rows_to_draw(2560) == 2624
    # 142 rows: 14 held out, 128 trained; 141 would hold out 14 and leave 127
    assert distill_compare.rows_to_draw(128) == 142


def test_the_table_by_hand():
    rows = [
        {
            "method": "on-policy",
            "evals": [(0, 0.2), (64, 0.6)],
            "accuracy": 0.6,
            "kl_to_teacher": 0.1,
            "wall_time_s": 60,
        },
        {
            "method": "on-policy",
            "evals": [(0, 0.2), (64, 0.8)],
            "accuracy": 0.8,
            "kl_to_teacher": 0.3,
            "wall_time_s": 180,
        },
    ]
    text = distill_compare.table(rows, [0.5, 0.7])
    # accuracy 0.7 ± stdev(0.6, 0.8) = 0.1414; KL 0.2 ± 0.1414; 2.0 ± 1.4 minutes; the start's KL 0.6 ± 0.1414
    assert "| on-policy | 0.200 | 0.700 ± 0.141 | 0.2000 ± 0.1414 | 2.0 ± 1.4 |" in text
    assert "| (the starting model) | | | 0.6000 ± 0.1414 | |" in text


@pytest.fixture(scope="module")
def tiny_teacher(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("teacher")
    args = args_of(sft.Args, model="tiny", steps=4, lr=1e-2, num_demonstrations=40, output_dir=str(out))
    return sft.main(args)["run_dir"] + "/model"


def test_the_comparison_runs_on_the_tiny_model_and_reads_its_runs_back(
    tmp_path, tiny_teacher, capsys, monkeypatch
):
    measured = []
    sampled_measures = compare.sampled_measures

    def spy(model, base, *rest):
        measured.append((model, base))
        return sampled_measures(model, base, *rest)

    monkeypatch.setattr(compare, "sampled_measures", spy)
    argv = [
        "--teacher",
        tiny_teacher,
        "--model",
        "tiny",
        "--seeds",
        "0",
        "--samples",
        "512",
        "--eval-size",
        "2",
    ]
    argv += ["--k", "2", "--max-new-tokens", "4", "--out", str(tmp_path)]
    rows = distill_compare.main(argv)
    assert [r["method"] for r in rows] == ["on-policy", "off-policy", "grpo"]
    # every student is evaluated after each quarter of its 512 samples
    assert all([samples for samples, _ in r["evals"]] == [0, 128, 256, 384, 512] for r in rows)
    assert all(r["kl_to_teacher"] > 0 for r in rows)
    drawn = (tmp_path / "teacher-samples" / "seed-0.jsonl").read_text().splitlines()
    assert len(drawn) == distill_compare.rows_to_draw(512)
    assert set(json.loads(drawn[0])) == {"prompt", "completion"}
    # the off-policy student trained on those rows; its run is read back, not rerun
    assert json.loads((Path(rows[1]["run_dir"]) / "args.json").read_text())["dataset"].endswith(
        "seed-0.jsonl"
    )
    # KL(π_S ‖ π_T): each student (and the starting model) samples, the teacher is the reference
    assert measured == [(r["run_dir"] + "/model", tiny_teacher) for r in rows] + [("tiny", tiny_teacher)]
    assert "| grpo |" in capsys.readouterr().out
    assert distill_compare.main(argv) == rows
