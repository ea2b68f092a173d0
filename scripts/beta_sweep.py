"""The β trade-off, measured: one run per β with the same seed and budget, then the frontier.

The source documents say: "too small → hacking, too large → no learning". There are two sweeps:
- `grpo`: grpo.py on the task with its verifier, varying β, the weight of the KL in the loss.
- `ppo`: ppo.py on a learned reward model, the over-optimisation case, varying β, the KL
  coefficient in the reward.

At the end of each run the sweep measures:
- held-out accuracy: greedy, by the verifier;
- the learned score: for PPO, the reward model's mean score of those same greedy answers;
- the KL to the starting model, per completion: the k1 estimate on temperature-1 samples of
  scripts/compare.py (one sample per held-out problem here, eight there), so the x axis means the
  same for both sweeps and for the comparison.
The runs' models are deleted after the KL is measured.

Run (a finished β is read back from its eval.json, never rerun, when its args.json agrees with every
option given):
    python scripts/beta_sweep.py grpo                                        # β ∈ {0, 0.01, 0.04, 0.1, 0.4},
                                                                             # grpo.py's defaults
    python scripts/beta_sweep.py ppo --reward-model runs/rm-.../model        # β ∈ {0.005, 0.02, 0.05, 0.2, 0.5}
    python scripts/beta_sweep.py grpo --steps 40 --extra "--device cuda"

Writes OUT/sweep.md (the table) and OUT/sweep.png (accuracy, and for PPO the learned score, against the KL).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  the run / read-back / KL helpers

BETAS = {"grpo": [0.0, 0.01, 0.04, 0.1, 0.4], "ppo": [0.005, 0.02, 0.05, 0.2, 0.5]}
BETA_FLAG = {"grpo": "--beta", "ppo": "--kl-coef"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "algo",
        choices=["grpo", "ppo"],
        help="grpo: the task's verifier; ppo: a learned reward model (--reward-model)",
    )
    parser.add_argument(
        "--betas",
        nargs="+",
        type=float,
        default=None,
        help="the β values (default: grpo 0 0.01 0.04 0.1 0.4; ppo 0.005 0.02 0.05 0.2 0.5)",
    )
    parser.add_argument(
        "--reward-model", default=None, help="ppo: a reward_model.py checkpoint (runs/rm-.../model)"
    )
    parser.add_argument("--model", default="smollm2", help="the starting model (default: smollm2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: the script's own)")
    parser.add_argument("--eval-size", type=int, default=200, help="held-out problems (default 200)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default=None, help="output folder (default: runs/beta-<algo>)")
    parser.add_argument("--extra", default="", help="more options for every run, one string")
    args = parser.parse_args(argv)
    if args.algo == "ppo" and args.reward_model is None:
        parser.error("the ppo sweep needs --reward-model PATH (train one with `python reward_model.py`)")
    args.betas = args.betas or BETAS[args.algo]
    # --steps is always passed: a read-back run is checked against it
    args.steps = args.steps or importlib.import_module(args.algo).Args().steps
    args.out = Path(args.out or f"runs/beta-{args.algo}")
    return args


def one_beta(args, beta: float) -> dict:
    folder = args.out / f"beta-{beta:g}"
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        f"{args.algo}.py",
        BETA_FLAG[args.algo],
        str(beta),
        "--model",
        args.model,
        "--seed",
        str(args.seed),
        "--steps",
        str(args.steps),
        "--eval-every",
        "0",
        "--eval-size",
        str(args.eval_size),
        "--pass-k",
        "0",
        "--device",
        args.device,
        "--output-dir",
        str(folder),
        *(["--reward-model", args.reward_model] if args.algo == "ppo" else []),
        *args.extra.split(),
    ]
    run_dir = compare.run_once(command, folder, folder / "log.txt")
    evaluation = json.loads((run_dir / "eval.json").read_text())
    max_new_tokens = json.loads((run_dir / "args.json").read_text())["max_new_tokens"]
    kl = compare.measured(
        run_dir / "kl.json",
        lambda: {
            "kl": compare.sampled_measures(
                str(run_dir / "model"), args.model, args.eval_size, args.seed, args.device, 1, max_new_tokens
            )["kl"]
        },
    )["kl"]
    shutil.rmtree(run_dir / "model", ignore_errors=True)
    # the diversity β keeps: last 10 steps
    last = [json.loads(line) for line in open(run_dir / "metrics.jsonl")][-10:]
    return {
        "beta": beta,
        "accuracy_before": evaluation["accuracy_before"],
        "accuracy": evaluation["accuracy_after"],
        "score_before": evaluation.get("score_before"),
        "score": evaluation.get("score_after"),
        "kl": kl,
        "distinct": sum(r["completions/distinct"] for r in last) / len(last),
        "entropy": sum(r["entropy"] for r in last) / len(last),
        "wall_time_s": evaluation["wall_time_s"],
    }


def table(rows: list[dict], args) -> str:
    learned = args.algo == "ppo"
    lines = [
        f"{args.algo}.py, seed {args.seed}, {args.steps} steps; {args.eval_size} held-out problems; "
        "distinct and entropy are means over the last 10 training steps.",
        "",
        "| β | KL to start (per completion) | held-out accuracy |"
        + (" learned score (held-out, greedy) |" if learned else "")
        + " distinct completions | entropy (nats per token) |",
        "| --- | --- | --- |" + (" --- |" if learned else "") + " --- | --- |",
        f"| starting model | 0 | {rows[0]['accuracy_before']:.3f} |"
        + (f" {rows[0]['score_before']:.3f} |" if learned else "")
        + " | |",
    ]
    for r in rows:
        lines.append(
            f"| {r['beta']:g} | {r['kl']:.2f} | {r['accuracy']:.3f} |"
            + (f" {r['score']:.3f} |" if learned else "")
            + f" {r['distinct']:.2f} | {r['entropy']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def picture(rows: list[dict], args, path: Path) -> None:
    plt = compare.pyplot(path)
    if plt is None:
        return
    panels = [("held-out accuracy", "accuracy", "accuracy_before")] + (
        [("learned score (held-out)", "score", "score_before")] if args.algo == "ppo" else []
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (title, key, start) in zip(axes[0], panels):
        # joined in order of KL, not of β
        frontier = sorted([(0.0, rows[0][start])] + [(r["kl"], r[key]) for r in rows])
        ax.plot(*zip(*frontier), "o-")
        ax.annotate("start", (0, rows[0][start]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        for r in rows:
            ax.annotate(
                f"β={r['beta']:g}", (r["kl"], r[key]), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
        ax.set(title=title, xlabel="KL to the starting model (per completion)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{args.algo}.py: the β trade-off", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, beta in enumerate(args.betas, 1):
        print(f"[{i}/{len(args.betas)}] β = {beta:g}", flush=True)
        rows.append(one_beta(args, beta))
        (args.out / "sweep.md").write_text(table(rows, args))
    picture(rows, args, args.out / "sweep.png")
    print(table(rows, args))
    print(f"wrote {args.out / 'sweep.md'} and {args.out / 'sweep.png'}")


if __name__ == "__main__":
    main()
