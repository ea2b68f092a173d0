"""The calculator's study: accuracy without the tool, with it after the SFT cold start, and after GRPO, on seeds.

    python scripts/tool_study.py                                   # docs/tools.md's table, 3 seeds
    python scripts/tool_study.py --seeds 0 --sft-steps 100 --out runs/tool-study-full   # the full cold start

Each seed runs docs/tools.md's pipeline: scripts/tool_demonstrations.py (its training problems), sft.py on them,
two grpo_tools.py runs from that model: with the calculator, and with it off (--max-calls 0: a call ends the
answer unanswered, so the reward can come only from sums done unaided). The held-out tool problems are asked, in
float32, of the starting model (the question alone and no calculator; with the instruction and the calculator), of
the SFT model and of each GRPO model (ask): greedily, giving accuracy, the share of answers that call the tool
and the share of calls the calculator could read, and by --samples transcripts a problem at temperature 1, the draws
GRPO learns from, giving their accuracy (the greedy answer jumps from none right to all right within a few steps
of SFT; the samples move smoothly: docs/tools.md).
A finished run is read back (scripts/compare.py's rule), never rerun. Writes OUT/table.md and OUT/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import compare  # noqa: E402  its run, finished_run and measured
import grpo_tools  # noqa: E402
from infra import models, runs  # noqa: E402
from task import tasks, tools  # noqa: E402

COLUMNS = ("accuracy", "tool/use", "tool/well_formed")  # greedy; each row also has "sampled"


def ask(args, model: str, with_tool: bool, max_calls: int) -> dict:
    """A model on the held-out tool problems, in float32: asked greedily (accuracy, the share of answers that call,
    the share of calls read) and by --samples transcripts a problem at temperature 1, the draws GRPO learns from
    (their mean accuracy, "sampled"; seeded, the same draws for every model). Without the tool the instruction is
    cut off the question; --max-calls 0 leaves the calculator off (a call ends the answer unanswered)."""
    device = models.resolve_device(args.device)
    tokenizer = models.load_tokenizer(model)
    kernels_on = models.resolve_kernels("auto", device)
    policy = models.load_model(model, len(tokenizer), device, kernels_on=kernels_on)
    heldout = tasks.heldout_problems(args.eval_size, make=tools.make_tool_problem)
    if not with_tool:
        heldout = [
            tasks.Problem(prompt=p.prompt.removesuffix(tools.TOOL_INSTRUCTION), answer=p.answer)
            for p in heldout
        ]
    options = grpo_tools.Args(model=model, max_calls=max_calls)
    result = grpo_tools.evaluate_with_tool(policy, tokenizer, heldout, options, step=0)
    generator = torch.Generator(device=device).manual_seed(0)
    right = []
    for start in range(0, len(heldout), 16):
        batch = heldout[start : start + 16]
        ids, mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in batch], device)
        transcripts = grpo_tools.sample_with_tool(
            policy, tokenizer, ids, mask, args.samples, options, generator, 1.0
        )
        right += [
            tasks.verify(t.last_turn, batch[i // args.samples].answer) for i, t in enumerate(transcripts)
        ]
    if max_calls == 0:  # no calculator: its use is not a share of anything
        result |= {"tool/use": math.nan, "tool/well_formed": math.nan}
    return {**{key: result[key] for key in COLUMNS}, "sampled": sum(right) / len(right)}


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
    sft_model = str(sft_dir / "model")
    rows = []
    for max_calls, name, calculator in (
        (2, "grpo", "with the tool"),
        (0, "grpo-calculator-off", "the calculator off"),
    ):
        path = folder / f"sft-asked-{max_calls}-calls-{args.eval_size}x{args.samples}.json"
        asked = compare.measured(path, lambda: ask(args, sft_model, True, max_calls))
        rows.append({"stage": f"after SFT, {calculator}", "seed": seed, **asked})
        grpo = ["grpo_tools.py", "--model", sft_model, "--seed", str(seed)]
        grpo += ["--steps", str(args.grpo_steps), "--eval-every", str(max(1, args.grpo_steps // 4))]
        grpo += ["--eval-size", str(args.eval_size), "--pass-k", "0", "--device", args.device]
        grpo += ["--max-calls", str(max_calls), "--output-dir", str(folder / name)]
        grpo_dir = compare.run_once(grpo, folder / name, folder / f"{name}.log")
        evaluation = json.loads((grpo_dir / "eval.json").read_text())
        path = folder / f"{name}-asked-{args.eval_size}x{args.samples}.json"
        asked = compare.measured(path, lambda: ask(args, str(grpo_dir / "model"), True, max_calls))
        rows.append(
            {
                "stage": f"after GRPO, {calculator}",
                "seed": seed,
                **asked,
                # the run's own greedy evaluations, in its precision
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
        "| model, asked | held-out accuracy, greedy | at temperature 1 | answers that call the tool "
        "| calls the calculator reads | seeds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for stage in dict.fromkeys(r["stage"] for r in rows):
        mine = [r for r in rows if r["stage"] == stage]
        cells = " | ".join(mean_std([r[key] for r in mine]) for key in ("accuracy", "sampled", *COLUMNS[1:]))
        lines.append(f"| {stage} | {cells} | {len(mine)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", help="the starting model")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--demonstrations", type=int, default=2000, help="tool demonstrations a seed")
    parser.add_argument("--sft-steps", type=int, default=10, help="sft.py --steps (16 demonstrations a step)")
    parser.add_argument("--sft-lr", type=float, default=None, help="sft.py --lr (unset: sft.py's own)")
    parser.add_argument("--grpo-steps", type=int, default=10, help="grpo_tools.py --steps (16 prompts × 8)")
    parser.add_argument("--eval-size", type=int, default=50, help="held-out tool problems")
    parser.add_argument("--samples", type=int, default=4, help="temperature-1 transcripts a held-out problem")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--out", type=Path, default=Path("runs/tool-study"))
    args = parser.parse_args(argv)
    runs.require(
        min(args.demonstrations, args.sft_steps, args.grpo_steps, args.eval_size, args.samples) >= 1,
        "--demonstrations, --sft-steps, --grpo-steps, --eval-size and --samples must be >= 1",
    )
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for with_tool, stage in (
        (False, "starting model, the question alone"),
        (True, "starting model, with the tool"),
    ):
        name = "with-tool" if with_tool else "without-tool"
        path = args.out / f"starting-model-{name}-{args.eval_size}x{args.samples}.json"
        asked = compare.measured(path, lambda: ask(args, args.model, with_tool, 2 if with_tool else 0))
        rows.append({"stage": stage, **asked})
    for seed in args.seeds:
        rows += pipeline(args, seed)
    (args.out / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = table(rows)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return rows


if __name__ == "__main__":
    runs.run_main(main, sys.argv[1:])
