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
RUNS = {
    "grpo": ["grpo.py", *TINY],
    "dpo": ["dpo.py", *TINY, "--dataset", PAIRS],
    "ppo-verifier": ["ppo.py", "--reward", "verifier", *TINY],
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


def collect(out: Path) -> None:
    numbers = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLHF_CACHE": str(out / "cache")}
    for name, argv in RUNS.items():
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
    options = parser.parse_args()
    if options.compare:
        sys.exit(compare(*options.compare))
    collect(options.out)
