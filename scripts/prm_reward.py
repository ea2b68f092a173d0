"""The process reward model as an RL reward: GRPO and PPO on the multi-step chains with a PRM's per-step reward
(DeepSeekMath's process supervision, `grpo_prm.py`; Math-Shepherd's step-by-step PPO, `ppo_prm.py`) against the
verifier's outcome reward alone, at the same number of sampled completions, on several seeds.

    python scripts/prm_reward.py                                  # SmolLM2-135M-Instruct (embedded), 3 seeds
    python scripts/prm_reward.py --model tiny --quick --out runs/prm-reward-tiny   # the plumbing, a few minutes

Stages, each one of the project's scripts run as a user runs it (a finished stage is read back, never rerun):
1. SFT on worked answers (`sft.py --dataset OUT/demos.jsonl`, tasks.worked_demonstration of 2,000 training chains),
   so that the policy writes one step per line: a PRM can only score steps that are there.
2. The PRM: `prm.py --policy SFT`, Math-Shepherd labels from that policy's own rollouts (as scripts/prm_vs_orm.py).
3. The RL data: OUT/chains.jsonl, held-out chains that neither the SFT demonstrations (excluded up to
   --num-chains) nor the held-out evaluation of step 1 touch; each run holds out a tenth of them for its evaluation.
4. On each seed, from the SFT policy, each row of --rows: `grpo.py --dataset OUT/chains.jsonl` (outcome
   supervision, the verifier's 0/1), `grpo_prm.py --prm PRM` (process supervision), `ppo.py --reward verifier`
   (outcome) and `ppo_prm.py --prm PRM` (the dense reward). GRPO samples --steps x --prompts-per-step x 8
   completions at --lr; PPO samples as many, --ppo-batch-size a step, at its own defaults otherwise.
SFT and the PRM are trained once (seed 0); the seeds vary the RL runs, and with them which tenth of the chains
is held out. Writes OUT/prm-reward-TAG.md and OUT/results-TAG.jsonl, TAG = STEPS-steps-PROMPTS-prompts (several
budgets share one OUT, its SFT policy and its PRM).
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

# row: (script, with --prm?)
ROWS = {
    "grpo-outcome": ("grpo.py", False),
    "grpo-process": ("grpo_prm.py", True),
    "ppo-outcome": ("ppo.py", False),
    "ppo-dense": ("ppo_prm.py", True),
}
GROUP_SIZE = 8  # grpo.py's default G


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="smollm2", help="the SFT start and the PRM's backbone (default: smollm2)"
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=[0, 1, 2], help="the RL runs' seeds (default: 0 1 2)"
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=list(ROWS),
        default=list(ROWS),
        help="the runs on each seed (default: all four)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=10,
        help="GRPO steps of --prompts-per-step chains × 8 samples (default: 10)",
    )
    parser.add_argument(
        "--prompts-per-step", type=int, default=16, help="GRPO's prompts a step (default: 16)"
    )
    parser.add_argument("--lr", type=float, default=2e-6, help="GRPO's learning rate (default: 2e-6)")
    parser.add_argument(
        "--ppo-batch-size",
        type=int,
        default=128,
        help="PPO's completions a step (ppo.py's default); its steps make GRPO's number of samples (default: 128)",
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
        f"From the SFT policy on the chains, {samples(args)} sampled completions a run (GRPO: {args.steps} steps × "
        f"{args.prompts_per_step} chains × {GROUP_SIZE}, lr {args.lr:g}; PPO: {ppo_steps(args)} steps × "
        f"{args.ppo_batch_size}), seeds {' '.join(map(str, args.seeds))}; mean ± sample std over seeds.",
        "",
        "| row | held-out accuracy (from) | per seed | general NLL change | PRM step score (step mean) "
        "| critic's explained variance, last quarter | wall time (min) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in ROWS:
        runs = [r for r in rows if r["reward"] == name]
        if not runs:
            continue
        scores = [r["prm/step_score"] for r in runs if r["prm/step_score"] is not None]
        variances = [r["explained_variance"] for r in runs if r.get("explained_variance") is not None]
        lines.append(
            f"| {name} | {compare.mean_std([r['accuracy_after'] for r in runs])} "
            f"(from {compare.mean_std([r['accuracy_before'] for r in runs])}) | "
            f"{per_seed(runs)} | "
            f"{compare.mean_std([r['general_nll_after'] - r['general_nll_before'] for r in runs])} | "
            f"{compare.mean_std(scores) if scores else ''} | "
            f"{compare.mean_std(variances) if variances else ''} | "
            f"{compare.mean_std([r['wall_time_s'] / 60 for r in runs])} |"
        )
    return "\n".join(lines) + "\n"


def last_quarter_mean(values: list[float]) -> float | None:
    """The mean over the last quarter of a run's steps (at least one step); None for a run that logs none."""
    if not values:
        return None
    return statistics.mean(values[-max(1, len(values) // 4) :])


def per_seed(runs: list[dict]) -> str:
    return ", ".join(f"{r['accuracy_after']:.3f}" for r in runs)


def samples(args) -> int:
    """Completions one run samples: GRPO's steps × prompts × group, which PPO's steps match."""
    return args.steps * args.prompts_per_step * GROUP_SIZE


def ppo_steps(args) -> int:
    if samples(args) % args.ppo_batch_size:
        raise SystemExit(
            f"error: --ppo-batch-size {args.ppo_batch_size} must divide GRPO's {samples(args)} samples a run"
        )
    return samples(args) // args.ppo_batch_size


def rl_command(row: str, policy: str, prm: str, chains: Path, eval_size: int, seed: int, args) -> list[str]:
    """One row's script and options: both algorithms from the same policy, on the same chains and samples."""
    script, with_prm = ROWS[row]
    if script.startswith("grpo"):
        budget = [
            "--prompts-per-step",
            str(args.prompts_per_step),
            "--steps",
            str(args.steps),
            "--lr",
            str(args.lr),
        ]
    else:
        # PPO's own defaults (lr, minibatch of 8, 2 epochs); only the batch and the steps set the budget
        budget = [
            "--reward",
            "verifier",
            "--batch-size",
            str(args.ppo_batch_size),
            "--steps",
            str(ppo_steps(args)),
        ]
    return [
        script,
        "--model",
        policy,
        "--dataset",
        str(chains),
        *budget,
        "--max-new-tokens",
        "48",
        "--eval-size",
        str(eval_size),
        "--eval-every",
        "0",
        "--pass-k",
        "0",
        "--seed",
        str(seed),
        "--no-save-model",
        *(["--prm", prm] if with_prm else []),
        "--device",
        args.device,
    ]


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    args.steps = 3 if args.quick else args.steps
    ppo_steps(args)  # a batch that does not divide the budget stops the run here, before any stage
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

    # 4. outcome against process supervision, GRPO and PPO, on each seed
    tag = f"{args.steps}-steps-{args.prompts_per_step}-prompts"
    results = []
    for seed in args.seeds:
        for name in args.rows:
            command = rl_command(
                name, policy, str(prm_run / "model"), out / "chains.jsonl", num_chains // 10, seed, args
            )
            run = prm_vs_orm.run_stage(out, f"{name}-{tag}-seed{seed}", command)
            evaluation = json.loads((run / "eval.json").read_text())
            logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            scores = [row["prm/step_score"] for row in logged if "prm/step_score" in row]
            variances = [row["explained_variance"] for row in logged if "explained_variance" in row]
            results.append(
                {
                    "reward": name,
                    "seed": seed,
                    **{k: evaluation[k] for k in ("accuracy_before", "accuracy_after", "wall_time_s")},
                    "general_nll_before": evaluation["general_nll_before"],
                    "general_nll_after": evaluation["general_nll_after"],
                    "prm/step_score": statistics.mean(scores) if scores else None,
                    "explained_variance": last_quarter_mean(variances),
                }
            )
            (out / f"results-{tag}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
            (out / f"prm-reward-{tag}.md").write_text(table(results, args))
    print(table(results, args))
    print(f"wrote {out}/prm-reward-{tag}.md and {out}/results-{tag}.jsonl")
    return results


if __name__ == "__main__":
    main()
