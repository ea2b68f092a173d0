"""Held-out accuracy against wall time, for several run folders in one picture.

Each run folder's eval.json gives the accuracy at each evaluation step and metrics.jsonl the elapsed time at that
step (`time/elapsed`, seconds since the run began, evaluations included; step 0 is the start). Runs that share a
label (`--label` given once per run, in order) are drawn in one colour.

    python scripts/accuracy_vs_time.py runs/grpo-a runs/grpo-b --label "old defaults" --label "new defaults" \
        --out docs/grpo-defaults.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def curve(run_dir: Path) -> tuple[list[float], list[float]]:
    """(minutes, accuracy) at each evaluation of a run."""
    elapsed = {0: 0.0}
    for line in open(run_dir / "metrics.jsonl"):
        row = json.loads(line)
        elapsed[row["step"]] = row["time/elapsed"]
    evals = json.loads((run_dir / "eval.json").read_text())["evals"]
    points = [(elapsed[e["step"]] / 60, e["accuracy"]) for e in evals if e["step"] in elapsed]
    return [m for m, _ in points], [a for _, a in points]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "runs", nargs="+", type=Path, help="run folders (each with eval.json and metrics.jsonl)"
    )
    parser.add_argument(
        "--label", action="append", default=[], help="one per run, in order (default: folder name)"
    )
    parser.add_argument("--out", type=Path, default=Path("accuracy_vs_time.png"))
    parser.add_argument("--title", default="held-out accuracy against wall time")
    args = parser.parse_args(argv)
    if args.label and len(args.label) != len(args.runs):
        parser.error(f"{len(args.label)} --label for {len(args.runs)} runs: give one per run, or none")
    for run in args.runs:
        if not (run / "eval.json").is_file() or not (run / "metrics.jsonl").is_file():
            parser.error(f"{run}: not a finished run folder (no eval.json or metrics.jsonl)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = args.label or [run.name for run in args.runs]
    colours = {label: f"C{i}" for i, label in enumerate(dict.fromkeys(labels))}
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drawn = set()
    for run, label in zip(args.runs, labels):
        minutes, accuracy = curve(run)
        ax.plot(
            minutes,
            accuracy,
            marker="o",
            markersize=3,
            color=colours[label],
            label=None if label in drawn else label,
        )
        drawn.add(label)
    ax.set(xlabel="wall time (min)", ylabel="held-out accuracy", title=args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
