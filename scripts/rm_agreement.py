"""Does a reward model still agree with the verifier on a policy's own answers? For each policy: fresh samples of
the held-out problems, labelled by the verifier and scored by the reward model; how well the scores order them
(AUC), and the accuracy of each problem's top-scored sample beside a random one's.

    python scripts/rm_agreement.py --reward-model runs/rm-…/model --policies runs/sft-…/model runs/ppo-…/model
    python scripts/rm_agreement.py --reward-model runs/rm-tiny-…/model --policies tiny --eval-size 4   # plumbing

reward_model.py measures the same agreement on its starting policy's samples, the ones its pairs come from. PPO
then moves the policy to answers the reward model never saw: measured on the policy PPO ends with, the AUC says
whether the score it was paid still meant a right answer there. The problems are tasks.heldout_problems, which no
reward model's pairs include (tasks.training_exclusion). Prints a markdown table; --out FILE writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra import models  # noqa: E402
import reward_model  # noqa: E402
from infra import runs  # noqa: E402
from task import preferences, tasks  # noqa: E402


def sampling_parser(description: str) -> argparse.ArgumentParser:
    """The options of a script that samples a policy (this one and policy_pairs.py): how, and where."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--samples-per-prompt", type=int, default=8, help="samples of each problem")
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature; 1.0 is ppo.py's"
    )
    parser.add_argument("--max-new-tokens", type=int, default=32, help="the longest sample, in tokens")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16-mixed", "bf16-true"],
        help="as the training scripts' --precision",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = sampling_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--reward-model",
        required=True,
        default=argparse.SUPPRESS,
        help="a reward_model.py checkpoint folder (…/model)",
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        required=True,
        default=argparse.SUPPRESS,
        help="the policies to sample: checkpoint folders or model names, on one tokenizer",
    )
    parser.add_argument("--eval-size", type=int, default=tasks.DEFAULT_EVAL_SIZE, help="held-out problems")
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed, the same for every policy")
    parser.add_argument("--out", help="also write the rows to this JSON file")
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> list[dict]:
    """One row per policy: its sample accuracy and the reward model's agreement with the verifier on its samples."""
    runs.require(
        args.eval_size >= 1 and args.samples_per_prompt >= 2 and args.max_new_tokens >= 1,
        "--eval-size and --max-new-tokens must be at least 1, --samples-per-prompt at least 2",
    )
    runs.require(args.temperature > 0, f"--temperature must be > 0, not {args.temperature}")
    device = models.resolve_device(args.device)
    precision = models.resolve_precision(args.precision, device, args.policies[0])
    tokenizer = models.load_tokenizer(args.policies[0])
    scorer = models.load_reward_model(args.reward_model, tokenizer, device, precision)
    problems, rows = tasks.heldout_problems(args.eval_size), []
    for name in args.policies:
        runs.require(
            models.load_tokenizer(name).get_vocab() == tokenizer.get_vocab(),
            f"{name} has another tokenizer than {args.policies[0]}; compare policies of one base model",
        )
        policy = models.load_model(name, len(tokenizer), device, precision).eval()
        samples = preferences.label_samples(
            policy,
            tokenizer,
            problems,
            args.samples_per_prompt,
            args.max_new_tokens,
            args.temperature,
            args.seed,
            desc=f"sampling {Path(name).name}",
        )
        # reward_model.py's
        scored = reward_model.agreement(scorer, tokenizer, samples, max_completion_tokens=256)
        rows.append({"policy": name, **scored})
        del policy
    print("| policy | sample accuracy (verifier) | AUC | best-of-n accuracy | oracle |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print(
            f"| {row['policy']} | {row['agreement/sample_accuracy']:.3f} | {row['agreement/auc']:.3f} | "
            f"{row['agreement/best_of_n_accuracy']:.3f} | {row['agreement/oracle_accuracy']:.3f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    runs.run_main(main, parse_args())
