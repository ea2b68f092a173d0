"""The process reward model as an RL reward: GRPO on the multi-step chains with a PRM's per-step reward (DeepSeekMath's
process supervision, `grpo_prm.py`) against the verifier's outcome reward alone, at the same budget, on several seeds.

    python scripts/prm_reward.py                                  # SmolLM2-135M-Instruct (embedded), 3 seeds
    python scripts/prm_reward.py --model tiny --quick --out runs/prm-reward-tiny   # the plumbing, about a minute

Stages, each one of the project's scripts run as a user runs it (a finished stage is read back, never rerun):
1. SFT on worked answers (`sft.py --dataset OUT/demos.jsonl`, tasks.worked_demonstration of 2,000 training chains),
   so that the policy writes one step per line: a PRM can only score steps that are there.
2. The PRM: `prm.py --policy SFT`, Math-Shepherd labels from that policy's own rollouts (as scripts/prm_vs_orm.py).
3. The RL data: OUT/chains.jsonl, held-out chains that neither the SFT demonstrations (excluded up to
   --num-chains) nor the held-out evaluation of step 1 touch; grpo.py holds out a tenth of them for its evaluation.
4. On each seed, from the SFT policy: `grpo.py --dataset OUT/chains.jsonl` (outcome supervision, the verifier's
   0/1) and `grpo_prm.py --prm PRM` with the same options (process supervision), everything else equal.
SFT and the PRM are trained once (seed 0); the seeds vary the GRPO runs, and with them which tenth of the chains
is held out. Writes OUT/prm-reward-STEPS-steps.md and OUT/results-STEPS-steps.jsonl (several --steps share one OUT,
its SFT policy and its PRM).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import compare  # noqa: E402  mean_std
import prm_vs_orm  # noqa: E402  run_stage: a script's run, read back when finished
from task import tasks  # noqa: E402

ROWS = {"outcome": False, "process": True}  # with --prm?


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="smollm2", help="the SFT start and the PRM's backbone (default: smollm2)"
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=[0, 1, 2], help="GRPO's seeds (default: 0 1 2)"
    )
    parser.add_argument(
        "--steps", type=int, default=10, help="GRPO steps of 4 chains × 8 samples (default: 10)"
    )
    parser.add_argument(
        "--num-chains", type=int, default=600, help="chains in OUT/chains.jsonl (default: 600)"
    )
    parser.add_argument("--out", default="runs/prm-reward", help="output folder (default: runs/prm-reward)")
    parser.add_argument(
        "--quick", action="store_true", help="3 steps a stage and few chains: the plumbing only"
    )
    parser.add_argument("--device", default="auto")
    return parser.parse_args(argv)


def table(rows: list[dict], args) -> str:
    lines = [
        f"GRPO from the SFT policy on the chains, {args.steps} steps × 32 samples, seeds "
        f"{' '.join(map(str, args.seeds))}; mean ± sample std over seeds.",
        "",
        "| reward | held-out accuracy (from) | general NLL change | PRM step score (step mean) | wall time (min) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in ROWS:
        runs = [r for r in rows if r["reward"] == name]
        if not runs:
            continue
        scores = [r["prm/step_score"] for r in runs if r["prm/step_score"] is not None]
        lines.append(
            f"| {name} | {compare.mean_std([r['accuracy_after'] for r in runs])} "
            f"(from {compare.mean_std([r['accuracy_before'] for r in runs])}) | "
            f"{compare.mean_std([r['general_nll_after'] - r['general_nll_before'] for r in runs])} | "
            f"{compare.mean_std(scores) if scores else ''} | "
            f"{compare.mean_std([r['wall_time_s'] / 60 for r in runs])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    args.steps = 3 if args.quick else args.steps
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    quick = ["--steps", "3"] if args.quick else []
    device = ["--device", args.device]
    num_chains = 40 if args.quick else args.num_chains

    # 1. SFT on worked answers of training chains that exclude every chain of step 3
    demos, _ = tasks.multistep_problems(0, 64 if args.quick else 2000, num_chains)
    rows = [{"prompt": p.prompt, "completion": tasks.worked_demonstration(p)} for p in demos]
    (out / "demos.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sft_command = ["sft.py", "--model", args.model, "--dataset", str(out / "demos.jsonl"), "--pass-k", "0"]
    sft = prm_vs_orm.run_stage(out, "sft", [*sft_command, *quick, *device])
    policy = str(sft / "model")

    # 2. the PRM on that policy's solutions and rollouts
    prm_command = ["prm.py", "--model", args.model, "--policy", policy, *quick, *device]
    if args.quick:
        prm_command += [
            "--num-problems",
            "4",
            "--eval-size",
            "4",
            "--num-solutions",
            "2",
            "--num-rollouts",
            "2",
        ]
    prm_run = prm_vs_orm.run_stage(out, "prm", prm_command)

    # 3. the chains GRPO trains and is evaluated on
    chains = tasks.heldout_problems(num_chains, make=tasks.make_multistep_problem)
    (out / "chains.jsonl").write_text(
        "".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n" for p in chains)
    )

    # 4. GRPO, outcome against process supervision, on each seed
    results = []
    for seed in args.seeds:
        for name, with_prm in ROWS.items():
            # process supervision is grpo.py's variant, with the PRM named
            script = "grpo_prm.py" if with_prm else "grpo.py"
            grpo_command = [
                script,
                "--model",
                policy,
                "--dataset",
                str(out / "chains.jsonl"),
                "--prompts-per-step",
                "4",
                "--steps",
                str(args.steps),
                "--max-new-tokens",
                "48",
                "--eval-size",
                str(num_chains // 10),
                "--eval-every",
                "0",
                "--pass-k",
                "0",
                "--seed",
                str(seed),
                "--no-save-model",
                *(["--prm", str(prm_run / "model")] if with_prm else []),
                *device,
            ]
            run = prm_vs_orm.run_stage(out, f"grpo-{name}-{args.steps}-steps-seed{seed}", grpo_command)
            evaluation = json.loads((run / "eval.json").read_text())
            logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            scores = [row["prm/step_score"] for row in logged if "prm/step_score" in row]
            results.append(
                {
                    "reward": name,
                    "seed": seed,
                    **{k: evaluation[k] for k in ("accuracy_before", "accuracy_after", "wall_time_s")},
                    "general_nll_before": evaluation["general_nll_before"],
                    "general_nll_after": evaluation["general_nll_after"],
                    "prm/step_score": statistics.mean(scores) if scores else None,
                }
            )
            (out / f"results-{args.steps}-steps.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in results)
            )
            (out / f"prm-reward-{args.steps}-steps.md").write_text(table(results, args))
    print(table(results, args))
    print(f"wrote {out}/prm-reward-{args.steps}-steps.md and {out}/results-{args.steps}-steps.jsonl")
    return results


if __name__ == "__main__":
    main()
