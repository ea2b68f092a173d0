"""Can a language model replace the verifier as the labeller (RLAIF)? Ask it, measure it against the truth, and
write its labels for dpo.py.

Constitutional AI and RLAIF (Bai et al. 2022, arXiv:2212.08073; Lee et al. 2023, arXiv:2309.00267) label preference
pairs with a model instead of people. Here the verifier knows which answer of each pair is right, so the judge can
be scored. Each pair is shown twice, once in each order:

    {question}
    Answer A: {first}
    Answer B: {second}
    Which answer is correct? Reply with the letter A or B only.

The verdict is read from the judge's next-token distribution, restricted to the two letters: p = P(A) / (P(A) +
P(B)), no sampling. Reported against the verifier on the same pairs:
- accuracy: the share of the 2N verdicts (both orders) that pick the correct answer; 0.5 is chance;
- accuracy/both_orders: the label written, from the mean of the two orders' P(correct) (RLAIF's position
  debiasing); its error ε is what cDPO's --label-smoothing is set from;
- position/first: the share of verdicts for the answer shown first (0.5: no position bias);
- order_agreement: the share of pairs whose two verdicts pick the same answer (a judge that always says A
  agrees on none);
- length/longer: among pairs of unequal length, the share of verdicts for the longer answer, beside
  length/correct_is_longer, the share the truth would give.

The pairs are the ones dpo.py trains on by default (the embedded model's own samples, verifier-labelled, cached), or
--dataset pairs.jsonl whose `chosen` is the right answer. Writes OUT/verifier.jsonl and OUT/judge.jsonl (the same
pairs, labelled by each), OUT/report.json, and prints the three dpo.py commands to compare:

    python scripts/judge.py                                   # the embedded model judges DPO's default pairs
    python scripts/judge.py --judge-model runs/sft-.../model  # another judge
    python scripts/judge.py --judge-model tiny --dataset tests/data/pairs.jsonl --out /tmp/judge   # plumbing
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import common  # noqa: E402
import dpo  # noqa: E402
from infra import models  # noqa: E402
from infra import runs  # noqa: E402
from task import preferences, tasks  # noqa: E402

JUDGE_QUESTION = (
    "{question}\n\nAnswer A: {first}\n\nAnswer B: {second}\n\n"
    "Which answer is correct? Reply with the letter A or B only."
)


def judge_question(question: str, first: str, second: str) -> str:
    return JUDGE_QUESTION.format(question=question, first=first, second=second)


@torch.no_grad()
def first_is_better(
    model, tokenizer, questions: list[str], firsts: list[str], seconds: list[str], batch: int = 16
):
    """P(A) / (P(A) + P(B)) at the judge's first reply token, for each (question, first, second), (N,). The letters
    are read as the reply begins: "A" after a chat template's assistant header, " A" after a plain `Answer:`."""
    device = next(model.parameters()).device
    space = "" if tokenizer.chat_template else " "
    letters = [tokenizer(space + letter, add_special_tokens=False).input_ids[-1] for letter in "AB"]
    probabilities = []
    for start in range(0, len(questions), batch):
        texts = [
            judge_question(q, a, b)
            for q, a, b in zip(
                questions[start : start + batch],
                firsts[start : start + batch],
                seconds[start : start + batch],
            )
        ]
        ids, mask = tasks.tokenize_prompts(tokenizer, texts, device)
        with common.autocast(model):
            logits = model(input_ids=ids, attention_mask=mask, position_ids=common.position_ids(mask)).logits
        # left padding: the last position predicts the reply's first token
        probabilities.append(torch.softmax(logits[:, -1, letters].float(), -1)[:, 0])
    return torch.cat(probabilities)


def judge_report(
    p_chosen_first: torch.Tensor,
    p_chosen_second: torch.Tensor,
    chosen_longer: torch.Tensor,
    equal_length: torch.Tensor,
) -> dict:
    """The judge against the verifier, (N,) each: P(A) with the correct answer shown first, P(A) with it shown second,
    whether the correct answer is the longer one, whether the two are of equal length."""
    right_first = p_chosen_first > 0.5  # picks the correct answer, shown as A
    right_second = p_chosen_second < 0.5  # picks the correct answer, shown as B
    verdicts = torch.cat([right_first, right_second]).float()  # (2N,)
    first = torch.cat([p_chosen_first > 0.5, p_chosen_second > 0.5]).float()
    unequal = torch.cat([~equal_length, ~equal_length])
    picks_longer = verdicts.bool() == torch.cat(
        [chosen_longer, chosen_longer]
    )  # right and longer, or wrong and shorter
    return {
        "pairs": len(p_chosen_first),
        "accuracy": verdicts.mean().item(),
        "position/first": first.mean().item(),
        "order_agreement": (right_first == right_second).float().mean().item(),
        "length/longer": picks_longer[unequal].float().mean().item() if unequal.any() else float("nan"),
        "length/correct_is_longer": chosen_longer[~equal_length].float().mean().item()
        if (~equal_length).any()
        else float("nan"),
    }


def judge_labels(
    pairs: list[dict], p_chosen_first: torch.Tensor, p_chosen_second: torch.Tensor, seed: int
) -> list[dict]:
    """The pairs as the judge labels them: chosen and rejected swapped (their finished flags too) where the mean over
    the two orders of P(the verifier's chosen is better) is below 1/2, and on a seeded coin where it is exactly 1/2
    (a judge that only follows the order), since the pair's own order would leak the verifier's label."""
    coin = random.Random(seed)
    labelled = []
    for pair, p1, p2 in zip(pairs, p_chosen_first.tolist(), p_chosen_second.tolist()):
        row = dict(pair)
        score = (p1 + 1 - p2) / 2
        if score < 0.5 or (score == 0.5 and coin.random() < 0.5):
            row["chosen"] = pair["rejected"]
            row["rejected"] = pair["chosen"]
            row["chosen_finished"] = pair.get("rejected_finished", True)
            row["rejected_finished"] = pair.get("chosen_finished", True)
        labelled.append(row)
    return labelled


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--judge-model", default="smollm2", help="the judge: smollm2, tiny, a checkpoint or hub id"
    )
    parser.add_argument(
        "--dataset",
        default=None,
        help="pairs JSONL (prompt, chosen = right, rejected); default: dpo.py's own",
    )
    parser.add_argument("--max-pairs", type=int, default=0, help="judge at most this many pairs (0 = all)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of dpo.py's default pairs")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--out", default="runs/judge", help="output folder")
    args = parser.parse_args(argv)
    if args.max_pairs < 0:
        parser.error(f"--max-pairs must be >= 0, not {args.max_pairs}")
    return args


def main(args: argparse.Namespace) -> dict:
    """Judge the pairs in both orders; write both labellings and the report; print the DPO commands."""
    device = models.resolve_device(args.device)
    precision = models.resolve_precision("auto", device, args.judge_model)
    tokenizer = models.load_tokenizer(args.judge_model)
    defaults = dpo.Args()  # the pairs dpo.py trains on without --dataset: the same cache
    pairs, _, _ = preferences.load_preference_pairs(
        args.dataset,
        defaults.model,
        models.load_tokenizer(defaults.model) if args.dataset is None else tokenizer,
        args.seed,
        defaults.num_prompts,
        defaults.samples_per_prompt,
        defaults.max_new_tokens,
        defaults.temperature,
        device,
        models.resolve_precision("auto", device, defaults.model),
    )
    pairs = pairs[: args.max_pairs or None]
    judge = models.load_model(args.judge_model, len(tokenizer), device, precision, args.seed).eval()
    questions = [p["prompt"] for p in pairs]
    chosen = [p["chosen"] for p in pairs]
    rejected = [p["rejected"] for p in pairs]
    p_chosen_first = first_is_better(judge, tokenizer, questions, chosen, rejected)
    p_chosen_second = first_is_better(judge, tokenizer, questions, rejected, chosen)
    lengths = torch.tensor([[len(c), len(r)] for c, r in zip(chosen, rejected)])
    labelled = judge_labels(pairs, p_chosen_first, p_chosen_second, args.seed)
    report = judge_report(
        p_chosen_first, p_chosen_second, lengths[:, 0] > lengths[:, 1], lengths[:, 0] == lengths[:, 1]
    )
    report["accuracy/both_orders"] = sum(a["chosen"] == b["chosen"] for a, b in zip(labelled, pairs)) / len(
        pairs
    )
    # cDPO's ε: the label's measured error, below DPO's limit of 1/2
    report["label_smoothing"] = round(min(0.49, 1 - report["accuracy/both_orders"]), 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verifier.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    (out / "judge.jsonl").write_text("".join(json.dumps(p) + "\n" for p in labelled))
    (out / "report.json").write_text(json.dumps({"judge_model": args.judge_model, **report}, indent=2) + "\n")
    print(
        "\n".join(
            f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}"
            for key, value in report.items()
        )
    )
    print(f"DPO on the same {len(pairs)} pairs, each label source:")
    for name, extra in (
        ("verifier", ""),
        ("judge", ""),
        ("judge", f" --label-smoothing {report['label_smoothing']}"),
    ):
        print(f"  python dpo.py --dataset {out / name}.jsonl{extra} --output-dir {out / 'dpo'}")
    return report


if __name__ == "__main__":
    runs.run_main(main, parse_args())
