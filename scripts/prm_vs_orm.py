"""Best-of-N on the multi-step chains: the process reward model against the outcome reward model, majority vote,
a random pick and the oracle, all choosing among the same N solutions of one SFT policy per held-out chain.

    python scripts/prm_vs_orm.py                              # SmolLM2-135M-Instruct (embedded), 2-core CPU: ~1 h
    python scripts/prm_vs_orm.py --model tiny --quick --out runs/prm-vs-orm-tiny   # the plumbing, about a minute

Stages, each one of the project's scripts run as a user runs it (a finished stage is read back, never rerun):
1. SFT on worked answers: `sft.py --dataset OUT/demos.jsonl`, rows {prompt, completion: tasks.worked_demonstration}
   over training chains of tasks.multistep_problems, so that the policy writes one step per line.
2. Labels (timed here: the label cost): the SFT policy samples N solutions of every training and held-out chain and
   rolls out k completions from each step's prefix (prm.step_label_data, cached where prm.py reads it).
3. PRM: `prm.py --policy SFT` on those labels.
4. ORM: `reward_model.py --dataset OUT/orm-pairs.jsonl`: (right, wrong) pairs of the same training solutions, on the
   same backbone as the PRM. Its labels are the N solutions alone, no rollout.
5. Each held-out chain's N solutions are chosen from by the PRM (min, and product, of its step probabilities), the
   ORM (highest score), majority vote over the final numbers (`majority_pick`), a random pick (the mean accuracy of
   a solution) and the oracle (any of the N right).
Writes OUT/prm-vs-orm.md (the table) and OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from infra import models  # noqa: E402
from task import stepwise, tasks  # noqa: E402
import compare  # noqa: E402  run_once: a script's run, read back when finished with the same settings
import prm  # noqa: E402
import reward_model  # noqa: E402


def majority_pick(completions: list[str]) -> int:
    """The index of the first solution whose final number is the most frequent one among those with a number (a tie
    goes to the number seen first); 0 when none has a number."""
    answers = [tasks.extract_final_number(c) for c in completions]
    # insertion-ordered: most_common keeps the first of a tie
    votes = Counter(a for a in answers if a is not None)
    return answers.index(votes.most_common(1)[0][0]) if votes else 0


def right_wrong_pairs(rows: list[dict], per_problem: int) -> list[dict]:
    """ORM pairs from labelled solutions: for each prompt, up to `per_problem` (right, wrong) pairs, the i-th right
    solution with the i-th wrong one, cycling the shorter list. Prompts whose solutions are all right or all wrong
    give no pair."""
    by_prompt: dict[str, list[dict]] = {}
    for row in rows:
        by_prompt.setdefault(row["prompt"], []).append(row)
    pairs = []
    for prompt, solutions in by_prompt.items():
        right = [s["completion"] for s in solutions if s["correct"]]
        wrong = [s["completion"] for s in solutions if not s["correct"]]
        if right and wrong:
            count = min(per_problem, max(len(right), len(wrong)))
            pairs += [
                {"prompt": prompt, "chosen": right[i % len(right)], "rejected": wrong[i % len(wrong)]}
                for i in range(count)
            ]
    return pairs


def run_stage(out: Path, name: str, command: list[str]) -> Path:
    """`python command --output-dir OUT/name`, or the finished run there when its args.json agrees with every
    option `command` gives (compare.run_once; one that differs stops the study); its run folder."""
    folder = out / name
    return compare.run_once([*command, "--output-dir", str(folder)], folder, out / f"{name}.log")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", help="the SFT start and the PRM's and ORM's backbone")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/prm-vs-orm", help="output folder (default: runs/prm-vs-orm)")
    parser.add_argument("--num-problems", type=int, default=96, help="training chains labelled (default: 96)")
    parser.add_argument("--eval-size", type=int, default=64, help="held-out chains (default: 64)")
    parser.add_argument("--num-solutions", type=int, default=8, help="N of best-of-N (default: 8)")
    parser.add_argument("--num-rollouts", type=int, default=4, help="k rollouts from each step (default: 4)")
    parser.add_argument(
        "--quick", action="store_true", help="3 steps a stage and few problems: the plumbing only"
    )
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = ["--steps", "3"] if args.quick else []
    common_options = ["--seed", str(args.seed), "--device", args.device]
    if args.quick:
        args.num_problems, args.eval_size, args.num_solutions, args.num_rollouts = 4, 4, 2, 2

    # 1. SFT on the worked answers of training chains (never a held-out one: tasks.training_exclusion)
    demos, _ = tasks.multistep_problems(args.seed, 64 if args.quick else 2000, args.eval_size)
    (out / "demos.jsonl").write_text(
        "".join(
            json.dumps({"prompt": p.prompt, "completion": tasks.worked_demonstration(p)}) + "\n"
            for p in demos
        )
    )
    sft = run_stage(
        out,
        "sft",
        [
            "sft.py",
            "--model",
            args.model,
            "--dataset",
            str(out / "demos.jsonl"),
            "--eval-size",
            "16" if args.quick else "50",
            "--pass-k",
            "0",
            *steps,
            *common_options,
        ],
    )
    policy = str(sft / "model")

    # 2. the labels, timed; 3. the PRM on them
    prm_args = prm.Args(
        model=args.model,
        policy=policy,
        seed=args.seed,
        eval_size=args.eval_size,
        num_problems=args.num_problems,
        num_solutions=args.num_solutions,
        num_rollouts=args.num_rollouts,
    )
    prm_args.run.device = args.device
    device = models.resolve_device(args.device)
    precision = models.resolve_precision(prm_args.run.precision, device, prm_args.model)
    tokenizer = models.load_tokenizer(args.model)
    t0 = time.time()
    data, _ = prm.step_label_data(prm_args, tokenizer, device, precision)  # read back when cached: then ~0 s
    label_minutes = (time.time() - t0) / 60
    prm_run = run_stage(
        out,
        "prm",
        [
            "prm.py",
            "--model",
            args.model,
            "--policy",
            policy,
            "--eval-size",
            str(args.eval_size),
            "--num-problems",
            str(args.num_problems),
            "--num-solutions",
            str(args.num_solutions),
            "--num-rollouts",
            str(args.num_rollouts),
            *steps,
            *common_options,
        ],
    )

    # 4. the ORM on (right, wrong) pairs of the same training solutions
    pairs = right_wrong_pairs(data["train"], per_problem=4)
    # a random tiny policy is never right: its worked answers stand in (plumbing)
    if args.quick and len(pairs) < 2:
        pairs = [
            {
                "prompt": r["prompt"],
                "chosen": tasks.worked_demonstration(tasks.Problem(r["prompt"], r["answer"])),
                "rejected": r["completion"],
            }
            for r in data["train"]
        ]
    (out / "orm-pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    orm_run = run_stage(
        out,
        "orm",
        [
            "reward_model.py",
            "--model",
            args.model,
            "--dataset",
            str(out / "orm-pairs.jsonl"),
            *steps,
            *common_options,
        ],
    )

    # 5. every way of choosing among each held-out chain's N solutions
    rows, n = data["heldout"], args.num_solutions
    prompts, completions = [r["prompt"] for r in rows], [r["completion"] for r in rows]
    correct = torch.tensor([r["correct"] for r in rows], dtype=torch.float)
    with torch.no_grad():
        prm_model = models.load_model(
            str(prm_run / "model"), len(tokenizer), device, precision, head="trained-score"
        ).eval()
        step_probs, step_mask = [], []
        orm_model = models.load_reward_model(str(orm_run / "model"), tokenizer, device, precision)
        orm_scores = []
        for i in range(0, len(rows), 32):
            logits, mask = stepwise.score_steps(
                prm_model, tokenizer, prompts[i : i + 32], completions[i : i + 32]
            )
            step_probs += list(torch.sigmoid(logits).float().cpu())
            step_mask += list(mask.float().cpu())
            orm_scores.append(
                reward_model.score_texts(
                    orm_model,
                    tokenizer,
                    prompts[i : i + 32],
                    completions[i : i + 32],
                    prm_args.max_new_tokens,
                ).cpu()
            )
    probs = torch.nn.utils.rnn.pad_sequence(step_probs, batch_first=True)
    masks = torch.nn.utils.rnn.pad_sequence(step_mask, batch_first=True)
    majority = [i + majority_pick(completions[i : i + n]) for i in range(0, len(rows), n)]
    accuracy = {
        "PRM, min over steps": prm.best_of_n_accuracy(prm.aggregate_steps(probs, masks, "min"), correct, n),
        "PRM, product of steps": prm.best_of_n_accuracy(
            prm.aggregate_steps(probs, masks, "product"), correct, n
        ),
        "ORM": prm.best_of_n_accuracy(torch.cat(orm_scores).float(), correct, n),
        "majority vote": correct[majority].mean().item(),
        "random pick": correct.mean().item(),
        "oracle (any of N right)": correct.view(-1, n).amax(1).mean().item(),
    }
    train_rows = data["train"]
    rollouts = sum(max(0, len(r["rollouts_correct"]) - 1) * r["rollouts"] for r in train_rows)
    cost = {
        "PRM, min over steps": f"{len(train_rows)} solutions + {rollouts} rollouts",
        "PRM, product of steps": "the same labels",
        "ORM": f"{len(train_rows)} solutions ({len(pairs)} pairs)",
    }
    steps_per_solution = sum(len(r["rollouts_correct"]) for r in rows) / len(rows)
    lines = [
        f"{args.eval_size} held-out chains, N = {n} solutions each from the SFT policy ({policy}); "
        f"{steps_per_solution:.2f} steps a solution; labels: {args.num_problems} training chains, "
        f"k = {args.num_rollouts} rollouts a step, {label_minutes:.1f} min to sample (training and held-out "
        f"solutions, and their rollouts; 0 when read from the cache).",
        "",
        "| choice among the N | held-out accuracy | labels it needs |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {name} | {value:.3f} | {cost.get(name, 'none')} |" for name, value in accuracy.items()]
    (out / "prm-vs-orm.md").write_text("\n".join(lines) + "\n")
    result = {
        "accuracy": accuracy,
        "label_minutes": label_minutes,
        "rollouts": rollouts,
        "pairs": len(pairs),
        "steps_per_solution": steps_per_solution,
        "sft": str(sft),
        "prm": str(prm_run),
        "orm": str(orm_run),
    }
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
