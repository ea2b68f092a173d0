"""scripts/judge.py: the judge's report and labels on hand-made verdicts, its verdict read from the tiny model, and
the files it writes."""

import json
import sys

import pytest
import torch

from conftest import PAIRS, REPO
from task import tasks

sys.path.insert(0, str(REPO / "scripts"))
import judge  # noqa: E402

# P(A) for 4 pairs with the correct answer shown first, then second
P_FIRST = torch.tensor([0.9, 0.8, 0.3, 0.6])
P_SECOND = torch.tensor([0.7, 0.2, 0.6, 0.7])


def test_the_report_by_hand():
    chosen_longer = torch.tensor([True, False, False, True])
    equal_length = torch.tensor([False, False, True, False])
    report = judge.judge_report(P_FIRST, P_SECOND, chosen_longer, equal_length)
    # right when shown first: 0.9, 0.8, 0.6 (3 of 4); right when shown second (P(A) < 0.5): 0.2 (1 of 4)
    assert report["accuracy"] == pytest.approx(4 / 8)
    # for the first answer shown: 0.9, 0.8, 0.6, then 0.7, 0.6, 0.7
    assert report["position/first"] == pytest.approx(6 / 8)
    # the same answer in both orders: pair 1 right twice, pair 2 wrong twice; 0 and 3 right, then wrong
    assert report["order_agreement"] == pytest.approx(2 / 4)
    # unequal pairs 0, 1, 3: the longer picked by (0: right, longer) (1: right, shorter) (3: right, longer), then
    # (0: wrong, shorter) (1: right, shorter) (3: wrong, shorter): 2 of 6; the truth is longer in 2 of 3
    assert report["length/longer"] == pytest.approx(2 / 6)
    assert report["length/correct_is_longer"] == pytest.approx(2 / 3)


def test_labels_follow_the_mean_over_both_orders_and_a_coin_on_a_tie():
    pairs = [
        {"prompt": str(i), "chosen": f"right{i}", "rejected": f"wrong{i}", "rejected_finished": False}
        for i in range(4)
    ]
    labelled = judge.judge_labels(pairs, P_FIRST, P_SECOND, seed=0)
    # mean P(right) over the orders: 0.6, 0.8, 0.35, 0.45: pairs 2 and 3 are swapped, their finished flags with them
    assert [row["chosen"] for row in labelled] == ["right0", "right1", "wrong2", "wrong3"]
    assert labelled[2]["chosen_finished"] is False and labelled[2]["rejected_finished"] is True
    assert pairs[2]["chosen"] == "right2"  # the verifier's pairs are left as they were
    # a judge that always answers A is at exactly 1/2 on every pair: a coin decides, never the pair's own order
    always_a = torch.ones(200)
    many = [{"prompt": "q", "chosen": "right", "rejected": "wrong"}] * 200
    kept = sum(row["chosen"] == "right" for row in judge.judge_labels(many, always_a, always_a, seed=0))
    assert 70 < kept < 130


def test_the_verdict_is_the_two_letters_next_token_probability_whatever_the_padding(tokenizer):
    from infra import models

    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32", seed=0)
    questions = ["What is 3 + 4?", "What is 12 + 45? Show your working."]
    firsts = ["7", "12 + 45 = 57, since 2 + 5 = 7"]
    seconds = ["8", "56"]
    p = judge.first_is_better(model, tokenizer, questions, firsts, seconds)
    a = tokenizer("A", add_special_tokens=False).input_ids[-1]
    b = tokenizer("B", add_special_tokens=False).input_ids[-1]
    for i in range(2):
        text = tasks.format_prompt(tokenizer, judge.judge_question(questions[i], firsts[i], seconds[i]))
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
        assert p[i].item() == pytest.approx(torch.softmax(logits[[a, b]], -1)[0].item(), abs=1e-5)
    assert "Answer A: 7\n\nAnswer B: 8" in judge.judge_question(questions[0], firsts[0], seconds[0])


def test_the_script_writes_both_labellings_of_the_same_pairs(tmp_path, monkeypatch):
    """An oracle judge (it prefers whichever answer the verifier chose) is right everywhere, has no position bias,
    agrees with itself, and writes the verifier's labels; both files hold the same pairs."""

    def oracle(model, tokenizer, questions, firsts, seconds, batch=16):
        right = {json.loads(line)["chosen"] for line in open(PAIRS)}
        return torch.tensor([1.0 if first in right else 0.0 for first in firsts])

    monkeypatch.setattr(judge, "first_is_better", oracle)
    args = judge.parse_args(
        ["--judge-model", "tiny", "--dataset", PAIRS, "--max-pairs", "6", "--out", str(tmp_path)]
    )
    report = judge.main(args)
    assert report["accuracy"] == report["accuracy/both_orders"] == report["order_agreement"] == 1.0
    assert report["position/first"] == 0.5 and report["label_smoothing"] == 0.0 and report["pairs"] == 6
    rows = {name: (tmp_path / f"{name}.jsonl").read_text() for name in ("verifier", "judge")}
    assert rows["verifier"] == rows["judge"] and rows["judge"].count("\n") == 6
    with pytest.raises(SystemExit):
        judge.parse_args(["--max-pairs", "-1"])
