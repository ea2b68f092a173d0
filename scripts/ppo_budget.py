"""The smallest budget at which PPO learns, then PPO's knobs there: the clip, KL and GAE studies on 3 seeds.

    python scripts/ppo_budget.py --budgets 640 1280 2560 --device cuda                  # the search alone
    python scripts/ppo_budget.py --budgets 640 --then-studies --device cuda             # and the studies there

PPO learns at a budget when, on every seed, its critic explains the returns (explained variance > 0, averaged over
the last quarter of its steps) and its held-out accuracy ends above the start. Each budget runs ppo.py on the
verifier at its defaults (scripts/sensitivity.py's ppo-clip row "ε = 0.2 (ppo.py's)", 128 completions a step) on
every seed, smallest first, and the search stops at the first that passes. --then-studies runs sensitivity.py's
ppo-clip, ppo-kl and ppo-gae studies at it, into --out/studies. Finished runs are read back, never rerun, so a
stopped search goes on where it stopped. Writes --out/search.md and --out/search.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402
import sensitivity  # noqa: E402  its rows, read-back and logged metrics

STUDIES = ("ppo-clip", "ppo-kl", "ppo-gae")
DEFAULT_ROW = sensitivity.STUDIES["ppo-clip"].rows[1]  # ε = 0.2: ppo.py at its defaults
PER_STEP = compare.ALGORITHMS["ppo-verifier-defaults"][2]  # ppo.py's batch: 128 completions a step


def learns(run: dict) -> bool:
    """The criterion on one run: explained variance > 0 over the last quarter, and accuracy above the start."""
    explained = run["explained_variance (last quarter)"]
    return explained is not None and explained > 0 and run["accuracy"] > run["accuracy_before"]


def search_table(rows: list[dict]) -> str:
    lines = [
        "| completions | seed | held-out accuracy, start → end | explained variance, last quarter | learns |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        explained = r["explained_variance (last quarter)"]
        shown = "—" if explained is None else f"{explained:.3f}"
        accuracy = f"{r['accuracy_before']:.3f} → {r['accuracy']:.3f}"
        lines.append(
            f"| {r['completions']} | {r['seed']} | {accuracy} | {shown} | {'yes' if learns(r) else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int | None:
    """The search (and the studies); returns the budget found, or None."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--budgets", nargs="+", type=int, default=[640, 1280, 2560], help="completions, tried in order"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--then-studies", action="store_true", help="run the clip, KL and GAE studies at the budget"
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--eval-size", type=int, default=50)
    parser.add_argument(
        "--pass-k", type=int, default=4, help="temperature-1 samples a problem for the KL to start"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--extra", default="", help="more options for every run, one string")
    parser.add_argument("--out", type=Path, default=Path("runs/ppo-budget"))
    args = parser.parse_args(argv)
    budgets = sorted(args.budgets)
    if min(budgets) < PER_STEP or any(b % PER_STEP for b in budgets):
        parser.error(f"--budgets: multiples of {PER_STEP} (PPO's completions a step), not {args.budgets}")
    args.keep_models = False
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    found = None
    columns = (*sensitivity.STUDIES["ppo-clip"].columns, ("explained_variance", "last quarter"))
    for budget in budgets:
        for seed in args.seeds:
            run_args = argparse.Namespace(**vars(args), budget=budget)
            slug = f"ppo-verifier-{budget}"
            # compare.py's row "PPO, verifier" under a folder of its own budget
            _, command, per_step = compare.ALGORITHMS["ppo-verifier-defaults"]
            compare.ALGORITHMS[slug] = (DEFAULT_ROW[0], command, per_step)
            result = compare.one_run(run_args, slug, seed, args.out / "search")
            for key, how in columns:
                result[sensitivity.column(key, how)] = sensitivity.logged(Path(result["run_dir"]), key, how)
            rows.append(result)
            (args.out / "search.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (args.out / "search.md").write_text(search_table(rows) + "\n")
        if all(learns(r) for r in rows if r["completions"] == budget):
            found = budget
            break
    print(search_table(rows))
    if found is None:
        print(f"PPO does not learn on every seed at any of {budgets} completions")
        return None
    print(f"PPO learns on every seed at {found} completions ({found // PER_STEP} steps)")
    if args.then_studies:
        options = ["--studies", *STUDIES, "--budget", str(found), "--seeds", *map(str, args.seeds)]
        options += ["--model", args.model, "--eval-size", str(args.eval_size), "--pass-k", str(args.pass_k)]
        options += ["--device", args.device, "--out", str(args.out / "studies"), "--extra", args.extra]
        sensitivity.main(options)
    return found


if __name__ == "__main__":
    main()
