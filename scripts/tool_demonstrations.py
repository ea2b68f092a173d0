"""The tool task's worked demonstrations as JSONL for `sft.py --dataset`: the cold start before grpo_tools.py.

    python scripts/tool_demonstrations.py --out tools.jsonl               # 2,000 rows of prompt and completion
    python sft.py --dataset tools.jsonl --steps 100                      # then: grpo_tools.py --model <its model>

Each row is a training problem of task/tools.py (a sum of three 3- and 4-digit numbers, never a held-out one) and
its worked use of the calculator, `<calc>a + b + c</calc> <result>s</result> The answer is s.`
(tools.tool_demonstration).
sft.py trains on the whole completion, the result's tokens included: it learns the form of a call and where the
answer comes from; grpo_tools.py then trains on the model's own tokens only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra import runs  # noqa: E402
from task import tasks, tools  # noqa: E402


def demonstrations(count: int, seed: int) -> list[dict]:
    """`count` rows {prompt, completion, answer} from the training stream of seed `seed`."""
    heldout = tasks.heldout_problems(tasks.DEFAULT_EVAL_SIZE, make=tools.make_tool_problem)
    stream = tasks.train_problems(seed, heldout, make=tools.make_tool_problem)
    problems = [next(stream) for _ in range(count)]
    return [
        {"prompt": p.prompt, "completion": tools.tool_demonstration(p), "answer": p.answer} for p in problems
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    parser.add_argument("--count", type=int, default=2000, help="rows")
    parser.add_argument("--seed", type=int, default=0, help="picks the problems")
    args = parser.parse_args(argv)
    runs.require(args.count >= 1, "--count must be at least 1")
    rows = demonstrations(args.count, args.seed)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{len(rows)} demonstrations in {args.out}")


if __name__ == "__main__":
    runs.run_main(main, sys.argv[1:])
