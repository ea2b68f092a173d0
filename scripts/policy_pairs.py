"""Preference pairs from a policy's own samples, written as JSONL for `reward_model.py --dataset`: the next round of
comparisons, collected from the policy RL produced, as InstructGPT collected comparisons again from its PPO policies.

    python scripts/policy_pairs.py --policy runs/ppo-…/model --seed 1 --out pairs.jsonl --add <round 1>/train.jsonl
    python reward_model.py --model runs/sft-…/model --dataset pairs.jsonl --steps 360

The policy samples --samples-per-prompt completions of each of --num-prompts training problems (from --seed's
stream, never a held-out one: tasks.training_exclusion), the verifier labels them, and each right answer is paired
with a wrong one of the same prompt (preferences.preference_data: cached, as reward_model.py's own pairs are; that
run prints its folder, whose train.jsonl and heldout.jsonl are round 1). --add puts earlier rounds' pairs first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra import models  # noqa: E402
import rm_agreement  # noqa: E402  its sampling options
from infra import runs  # noqa: E402
from task import preferences, tasks  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = rm_agreement.sampling_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--policy",
        required=True,
        default=argparse.SUPPRESS,
        help="the policy to sample: a checkpoint folder or a model name",
    )
    parser.add_argument(
        "--out",
        required=True,
        default=argparse.SUPPRESS,
        help="the JSONL file to write (prompt, chosen, rejected, ...)",
    )
    parser.add_argument("--add", nargs="*", default=[], help="earlier rounds' pair files, written first")
    parser.add_argument("--num-prompts", type=int, default=1024, help="training problems sampled")
    parser.add_argument("--seed", type=int, default=0, help="picks the problems and the samples")
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> list[dict]:
    """The earlier pairs, then the policy's: every pair written to --out, returned too."""
    runs.require(
        args.num_prompts >= 8 and args.samples_per_prompt >= 2 and args.max_new_tokens >= 1,
        "--num-prompts must be at least 8, --samples-per-prompt at least 2, --max-new-tokens at least 1",
    )
    runs.require(args.temperature > 0, f"--temperature must be > 0, not {args.temperature}")
    for path in args.add:
        runs.require(Path(path).is_file(), f"--add {path}: no such file")
    earlier = [pair for path in args.add for pair in tasks.read_jsonl(path, ("prompt", "chosen", "rejected"))]
    device = models.resolve_device(args.device)
    precision = models.resolve_precision(args.precision, device, args.policy)
    tokenizer = models.load_tokenizer(args.policy)
    data, folder = preferences.preference_data(
        args.policy,
        tokenizer,
        args.seed,
        args.num_prompts,
        args.samples_per_prompt,
        args.max_new_tokens,
        args.temperature,
        device,
        precision,
    )
    pairs = earlier + data["train"] + data["heldout"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    samples = [
        s for split in tasks.read_splits(folder, ("train_samples", "heldout_samples")).values() for s in split
    ]
    print(
        f"{len(pairs)} pairs in {args.out}: {len(earlier)} from --add, {len(pairs) - len(earlier)} from "
        f"{args.policy}'s {len(samples)} samples ({sum(s['label'] for s in samples) / len(samples):.3f} right; "
        f"cached in {folder})"
    )
    return pairs


if __name__ == "__main__":
    runs.run_main(main, parse_args())
