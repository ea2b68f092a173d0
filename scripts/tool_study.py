"""The calculator's study: accuracy without the tool, with it after the SFT cold start, and after GRPO, on seeds.

    python scripts/tool_study.py                         # 3 seeds at the scripts' defaults (docs/tools.md)
    python scripts/tool_study.py --seeds 0 --grpo-steps 20 --out runs/tool-study-small

Each seed runs docs/tools.md's pipeline: scripts/tool_demonstrations.py (its training problems), sft.py on them,
grpo_tools.py from that model. The held-out tool problems are asked greedily (grpo_tools.evaluate_with_tool) of:
- the starting model, the question alone (the tool's instruction cut off) and no calculator: without the tool;
- the starting model, the question with the instruction and the calculator answering: the tool offered, untaught;
- the SFT model (grpo_tools.py's step-0 evaluation) and the GRPO model (its last), with the calculator;
- the same from a second GRPO run with the calculator off (--max-calls 0: a call ends the answer unanswered), so
  that the reward can come only from sums done unaided: what GRPO gains without the tool.
Each row gives accuracy, the share of answers that call the tool and the share of calls the calculator could read.
A finished run is read back (scripts/compare.py's rule), never rerun. Writes OUT/table.md and OUT/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import compare  # noqa: E402  its run, finished_run and measured
import grpo_tools  # noqa: E402
from infra import models, runs  # noqa: E402
from task import tasks, tools  # noqa: E402

COLUMNS = ("accuracy", "tool/use", "tool/well_formed")


def untaught(args, with_tool: bool) -> dict:
    """The starting model on the held-out tool problems: with the instruction and the calculator, or the question
    alone and no calculator (a call then ends the answer: grpo_tools.sample_with_tool's rule past --max-calls)."""
    device = models.resolve_device(args.device)
    tokenizer = models.load_tokenizer(args.model)
    kernels_on = models.resolve_kernels("auto", device)
    policy = models.load_model(args.model, len(tokenizer), device, kernels_on=kernels_on)
    heldout = tasks.heldout_problems(args.eval_size, make=tools.make_tool_problem)
    if not with_tool:
        heldout = [
            tasks.Problem(prompt=p.prompt.removesuffix(tools.TOOL_INSTRUCTION), answer=p.answer)
            for p in heldout
        ]
    options = grpo_tools.Args(model=args.model, max_calls=2 if with_tool else 0)
    result = grpo_tools.evaluate_with_tool(policy, tokenizer, heldout, options, step=0)
    return {key: result[key] for key in COLUMNS}


def pipeline(args, seed: int) -> list[dict]:
    """One seed's demonstrations, SFT and two GRPO runs from it, with the calculator and with it off (each read back
    if finished): the SFT and GRPO rows of each."""
    folder = args.out / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    demonstrations = folder / "demonstrations.jsonl"
    if not demonstrations.exists():
        command = ["scripts/tool_demonstrations.py", "--out", str(demonstrations), "--seed", str(seed)]
        compare.run([*command, "--count", str(args.demonstrations)], folder / "demonstrations.log")
    sft = ["sft.py", "--model", args.model, "--dataset", str(demonstrations), "--seed", str(seed)]
    sft += ["--steps", str(args.sft_steps), "--eval-every", "0", "--eval-size", str(args.eval_size)]
    sft += ["--pass-k", "0", "--device", args.device, "--output-dir", str(folder / "sft")]
    if args.sft_lr is not None:
        sft += ["--lr", str(args.sft_lr)]
    sft_dir = compare.run_once(sft, folder / "sft", folder / "sft.log")
    rows = []
    for max_calls, name, calculator in (
        (2, "grpo", "with the tool"),
        (0, "grpo-calculator-off", "the calculator off"),
    ):
        grpo = ["grpo_tools.py", "--model", str(sft_dir / "model"), "--seed", str(seed)]
        grpo += ["--steps", str(args.grpo_steps), "--eval-every", str(max(1, args.grpo_steps // 4))]
        grpo += ["--eval-size", str(args.eval_size), "--pass-k", "0", "--device", args.device]
        grpo += ["--max-calls", str(max_calls), "--output-dir", str(folder / name)]
        grpo_dir = compare.run_once(grpo, folder / name, folder / f"{name}.log")
        evaluation = json.loads((grpo_dir / "eval.json").read_text())
        first = evaluation["evals"][0]
        last = evaluation["evals"][-1]
        rows.append(
            {"stage": f"after SFT, {calculator}", "seed": seed, **{key: first[key] for key in COLUMNS}}
        )
        rows.append(
            {
                "stage": f"after GRPO, {calculator}",
                "seed": seed,
                **{key: last[key] for key in COLUMNS},
                "curve": [(e["step"], e["accuracy"]) for e in evaluation["evals"]],
                "wall_time_s": evaluation["wall_time_s"],
            }
        )
    return rows


def mean_std(values: list[float]) -> str:
    """Over the seeds that have the value: a model that never calls has no share of well-formed calls (NaN, "—")."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "—"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {spread:.3f}"


def table(rows: list[dict]) -> str:
    """One line a stage: each column's mean ± standard deviation over the seeds (a seed-free row: ± 0)."""
    lines = [
        "| model, asked | held-out accuracy | answers that call the tool | calls the calculator reads | seeds |",
        "| --- | --- | --- | --- | --- |",
    ]
    for stage in dict.fromkeys(r["stage"] for r in rows):
        mine = [r for r in rows if r["stage"] == stage]
        cells = " | ".join(mean_std([r[key] for r in mine]) for key in COLUMNS)
        lines.append(f"| {stage} | {cells} | {len(mine)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", help="the starting model")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--demonstrations", type=int, default=2000, help="tool demonstrations a seed")
    parser.add_argument(
        "--sft-steps", type=int, default=100, help="sft.py --steps (16 demonstrations a step)"
    )
    parser.add_argument("--sft-lr", type=float, default=None, help="sft.py --lr (unset: sft.py's own)")
    parser.add_argument("--grpo-steps", type=int, default=40, help="grpo_tools.py --steps (16 prompts × 8)")
    parser.add_argument("--eval-size", type=int, default=50, help="held-out tool problems")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--out", type=Path, default=Path("runs/tool-study"))
    args = parser.parse_args(argv)
    runs.require(
        min(args.demonstrations, args.sft_steps, args.grpo_steps, args.eval_size) >= 1,
        "--demonstrations, --sft-steps, --grpo-steps and --eval-size must be >= 1",
    )
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for with_tool, stage in (
        (False, "starting model, the question alone"),
        (True, "starting model, with the tool"),
    ):
        name = "with-tool" if with_tool else "without-tool"
        path = args.out / f"starting-model-{name}-{args.eval_size}.json"
        rows.append({"stage": stage, **compare.measured(path, lambda: untaught(args, with_tool))})
    for seed in args.seeds:
        rows += pipeline(args, seed)
    (args.out / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = table(rows)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return rows


if __name__ == "__main__":
    runs.run_main(main, sys.argv[1:])
