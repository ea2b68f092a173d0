"""Tiny runs whose every non-timing number must stay the same across a change that moves code but no math.

    python dev/same_numbers.py --out /tmp/before        # at the commit before the change
    python dev/same_numbers.py --out /tmp/after         # after it
    python dev/same_numbers.py --compare /tmp/before /tmp/after

Each run is 3 steps on the tiny model, one CPU thread (so that no reduction changes order); numbers.json holds, for
each, every metrics.jsonl row and eval.json without times, memory, dates or paths.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAIRS = "tests/data/pairs.jsonl"
TINY = ["--model", "tiny", "--steps", "3", "--eval-size", "8", "--seed", "0"]
# concise (1 for 1 to 8 words) varies within a tiny model's groups, where the verifier scores every completion 0
VARIED = [*TINY, "--rewards", "correct", "concise", "--max-new-tokens", "12"]
RUNS = {
    "grpo": ["grpo.py", *TINY],
    "grpo-varied": ["grpo.py", *VARIED],
    "grpo-dapo": ["grpo.py", *VARIED, "--loss-agg", "token-mean", "--eps-high", "0.28", "--dynamic-sampling"],
    "grpo-drgrpo": ["grpo.py", *VARIED, "--no-scale-by-std", "--loss-agg", "seq-mean-token-sum-norm"],
    "grpo-mu2-k2": ["grpo.py", *VARIED, "--num-iterations", "2", "--kl-estimator", "k2", "--batch-size", "8"],
    "grpo-overlong": ["grpo.py", *VARIED, "--overlong-buffer", "4", "--mask-truncated-completions"],
    "grpo-r1": [
        "grpo.py",
        *TINY,
        "--rewards",
        "correct",
        "format",
        "--reward-weights",
        "1",
        "0.5",
        "--prompt-style",
        "r1",
    ],
    "gspo": ["grpo_options.py", *VARIED, "--importance-level", "sequence", "--num-iterations", "2"],
    "cispo": ["grpo_options.py", *VARIED, "--loss-type", "cispo", "--num-iterations", "2"],
    "sapo": ["grpo_options.py", *VARIED, "--loss-type", "sapo", "--num-iterations", "2"],
    "vespo": ["grpo_options.py", *VARIED, "--loss-type", "vespo", "--num-iterations", "2"],
    "luspo": ["grpo_options.py", *VARIED, "--loss-type", "luspo", "--importance-level", "sequence"],
    "delta": ["grpo_options.py", *VARIED, "--delta", "1.3", "--num-iterations", "2"],
    "entropy-bonus": ["grpo_options.py", *VARIED, "--entropy-coef", "0.01"],
    "entropy-target": ["grpo_options.py", *VARIED, "--entropy-target", "5", "--entropy-coef-step", "0.01"],
    "top-entropy": ["grpo_options.py", *VARIED, "--top-entropy-quantile", "0.2"],
    "batch-std": ["grpo_options.py", *VARIED, "--scale-rewards", "batch"],
    "gdpo": [
        "grpo_options.py",
        *VARIED,
        "--multi-objective-aggregation",
        "normalize-then-sum",
        "--scale-rewards",
        "batch",
    ],
    "reward-clip": ["grpo_options.py", *VARIED, "--reward-clip", "0.5", "0.5", "--reward-weights", "1", "2"],
    "grpo_async": ["grpo_async.py", *VARIED, "--staleness", "1", "--is-correction", "token-truncate"],
    "grpo_adaptive": ["grpo_adaptive.py", *VARIED],
    "grpo_tools": ["grpo_tools.py", *TINY],
    "dpo": ["dpo.py", *TINY, "--dataset", PAIRS],
    "dpo-options": ["dpo.py", *TINY, "--dataset", PAIRS, "--beta", "0.3", "--label-smoothing", "0.1"],
    "ppo-verifier": ["ppo.py", "--reward", "verifier", *TINY],
    "ppo-options": ["ppo.py", "--reward", "verifier", *TINY, "--gamma", "0.99", "--lam", "0.9"],
    "sft": ["sft.py", *TINY, "--num-demonstrations", "20"],
    "reward_model": ["reward_model.py", "--model", "tiny", "--steps", "3", "--dataset", PAIRS],
    "ipo": ["variants.py", "--algo", "ipo", *TINY, "--dataset", PAIRS],
    "rloo": ["variants.py", "--algo", "rloo", *TINY, "--max-new-tokens", "8"],
    "reinforce_pp": ["variants.py", "--algo", "reinforce_pp", *TINY, "--max-new-tokens", "8"],
    "prm": ["prm.py", *TINY],
}
VARYING = ("time", "memory/", "tokens_per_second", "run_dir", "wall_time_s")


def steady(value):
    """`value` without the entries that change from run to run."""
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items() if not k.startswith(VARYING)}
    if isinstance(value, list):
        return [steady(v) for v in value]
    return value


def collect(out: Path, only: list[str]) -> None:
    numbers = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLHF_CACHE": str(out / "cache")}
    for name, argv in RUNS.items():
        if only and name not in only:
            continue
        output_dir = out / name
        proc = subprocess.run(
            [sys.executable, *argv, "--output-dir", str(output_dir)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{name}: {proc.stderr[-2000:]}")
        (run_dir,) = list(output_dir.iterdir())
        rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
        numbers[name] = {
            "metrics": steady(rows),
            "eval": steady(json.loads((run_dir / "eval.json").read_text())),
        }
        print(f"{name}: {len(rows)} rows", flush=True)
    (out / "numbers.json").write_text(json.dumps(numbers, indent=1, sort_keys=True) + "\n")


def differences(before, after, path: str = "") -> list[str]:
    """Where two numbers.json entries part: "key: before -> after", a key one of them lacks as "(none)"."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after)):
            found += differences(before.get(key, "(none)"), after.get(key, "(none)"), f"{path}/{key}")
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [d for i, (x, y) in enumerate(zip(before, after)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if before == after else [f"{path}: {before} -> {after}"]


def compare(a: Path, b: Path) -> int:
    before = json.loads((a / "numbers.json").read_text())
    after = json.loads((b / "numbers.json").read_text())
    differing = [name for name in before if before[name] != after.get(name)]
    for name in before:
        print(f"{name:<14} {'DIFFERENT' if name in differing else 'identical'}")
        for line in differences(before[name], after.get(name, {}))[:10]:
            print(f"    {line}")
    return 1 if differing else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", type=Path, nargs=2)
    parser.add_argument("--only", nargs="*", default=[], help="these runs alone (the names of RUNS)")
    options = parser.parse_args()
    if options.compare:
        sys.exit(compare(*options.compare))
    collect(options.out, options.only)
