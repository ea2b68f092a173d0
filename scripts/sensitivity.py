"""One knob at a time: what each setting the source documents name does, measured on 3 seeds.

Each study varies one option of one script (or swaps one algorithm for another) at one stated budget,
every other option at the script's defaults, and tests one claim of the source documents. Each row is
run on every seed by scripts/compare.py's machinery, so its columns mean what they mean there:
- held-out accuracy: greedy, by the verifier, on --eval-size problems;
- KL to start: k1 per completion on --pass-k temperature-1 samples per held-out problem;
- sampled length: the mean length in tokens of those same samples;
- general NLL change: the forgetting measure, the trained policy's NLL per token of a general English text
  (tasks.general_text_nll) minus the starting model's; the task rewards nothing in that text;
- the columns of the claim: a metric the script logs, averaged over the run's steps (`mean`), its value at
  the last step (`last`), or averaged over the first or last quarter of the steps (`first quarter`, `last
  quarter`: a trend, where one batch is too noisy to read).
A difference smaller than the seed-to-seed spread (the ± columns, a sample std over the seeds) is no
difference at this budget: it may be real at a larger one, but this study cannot tell.

A setting that several studies share (ppo.py's defaults are a row of four) is one run a seed, in the folder of
the first study that has it.

Run (a finished (row, seed) is read back from its eval.json, never rerun):
    python scripts/sensitivity.py --list                       # the studies, their rows and claims
    python scripts/sensitivity.py --studies dpo-beta ppo-clip  # some of them
    python scripts/sensitivity.py                              # all of them (several hours on 2 CPU cores)

Writes OUT/STUDY/table.md and OUT/STUDY/results.jsonl (one row per run) for each study.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  the run / read-back / KL helpers


@dataclass(frozen=True)
class Study:
    claim: str  # the source documents' words
    base: str  # the row of scripts/compare.py that every setting starts from
    budget: int  # training completions per run
    rows: tuple[tuple, ...]  # (setting, the options it adds), or (setting, options, another compare.py row)
    columns: tuple[tuple[str, str], ...] = ()  # (logged metric, how: see logged)


PPO_COLUMNS = (("kl", "mean"), ("entropy", "mean"), ("explained_variance", "mean"))
PAIR_COLUMNS = (("lengths/chosen", "mean"), ("lengths/rejected", "mean"), ("rewards/margins", "last"))
# two 0/1 rewards at equal weights: summed, right-but-long and wrong-but-short tie (task/rewards.py, concise)
CONCISE = ("--rewards", "correct", "concise", "--reward-weights", "1", "1")
# GSPO's clip range of the sequence ratio, which LUSPO keeps
GSPO_CLIP = ("--eps-low", "3e-4", "--eps-high", "4e-4")
GDPO = ("--multi-objective-aggregation", "normalize-then-sum", "--scale-rewards", "batch")
STUDIES = {
    "ppo-clip": Study(
        "ε = 0.1–0.2; too large blows up the KL; the clip or an adaptive KL penalty (PPO, eq. 7 and 8)",
        "ppo-verifier-defaults",
        640,
        (
            ("ε = 0.1", ("--clip-eps", "0.1")),
            ("ε = 0.2 (ppo.py's)", ()),
            ("ε = 0.3", ("--clip-eps", "0.3")),
            # appended: PPO's other surrogate, a KL(π_old ‖ π) penalty with an adaptive β instead of the clip
            ("KL penalty, d_targ = 0.01 (PPO paper)", ("--policy-loss", "penalty")),
            ("KL penalty, d_targ = 0.001", ("--policy-loss", "penalty", "--kl-old-target", "0.001")),
        ),
        PPO_COLUMNS,
    ),
    "ppo-gae": Study(
        "γ = 1, λ = 0.95; don't copy γ = 0.99",
        "ppo-verifier-defaults",
        640,
        (
            ("γ = 1, λ = 0.9", ("--lam", "0.9")),
            ("γ = 1, λ = 0.95", ("--lam", "0.95")),
            ("γ = 1, λ = 1 (ppo.py's, verl's)", ()),
            ("γ = 0.99, λ = 0.95", ("--gamma", "0.99", "--lam", "0.95")),
        ),
        PPO_COLUMNS,
    ),
    "ppo-coefficients": Study(
        "c_v = 0.5, c_e = 0.01",
        "ppo-verifier-defaults",
        640,
        (
            ("c_v = 0.1, c_e = 0 (ppo.py's)", ()),
            ("c_v = 0.5", ("--vf-coef", "0.5")),
            ("c_e = 0.01", ("--entropy-coef", "0.01")),
            ("c_v = 0.5, c_e = 0.01", ("--vf-coef", "0.5", "--entropy-coef", "0.01")),
        ),
        PPO_COLUMNS,
    ),
    "ppo-critic-init": Study(
        "value init from RM or SFT",
        "ppo-rm",
        80,
        (
            ("critic from the reward model (ppo.py's)", ()),
            ("critic from the policy", ("--critic-init", "policy")),
        ),
        PPO_COLUMNS,
    ),
    "ppo-kl": Study(
        "adaptive KL steers to a target; InstructGPT's β = 0.02",
        "ppo-verifier-defaults",
        640,
        (
            ("fixed β = 0.001 (ppo.py's, verl's)", ()),
            ("fixed β = 0.02 (InstructGPT's)", ("--kl-coef", "0.02")),
            ("fixed β = 0.05 (TRL's)", ("--kl-coef", "0.05")),
            # a horizon of one run's completions, so that the controller moves within it (its default is 10,000)
            ("adaptive, target 2 per completion", ("--target-kl", "2", "--kl-horizon", "640")),
        ),
        (*PPO_COLUMNS, ("kl_coef", "last")),
    ),
    "ppo-ensemble": Study(
        "an ensemble's min or mean − k·std (Coste et al. 2024) curbs reward over-optimisation",
        "ppo-rm",
        80,
        (
            ("one reward model", ()),
            # ppo_overoptimisation.py: ppo.py's loop with the ensemble
            (
                f"{compare.ENSEMBLE_SIZE} reward models, min",
                ("--ensemble-agg", "min"),
                "ppo-rm-overoptimisation",
            ),
            (
                f"{compare.ENSEMBLE_SIZE} reward models, mean − 1·std",
                ("--ensemble-agg", "mean-std"),
                "ppo-rm-overoptimisation",
            ),
        ),
        (("score", "mean"), ("verifier", "mean"), ("kl", "mean")),
    ),
    "dpo-beta": Study(
        "β < 0.01 flat; β > 1 collapses; check lengths: y_w systematically shorter → bug",
        "dpo",
        160,
        (
            ("β = 0.01", ("--beta", "0.01")),
            ("β = 0.1", ("--beta", "0.1")),
            ("β = 0.5", ("--beta", "0.5")),
            ("β = 1", ("--beta", "1.0")),
        ),
        PAIR_COLUMNS,
    ),
    "simpo-gamma": Study(
        "SimPO's margin γ; length normalisation removes DPO's length bias",
        "simpo",
        160,
        (
            ("SimPO γ = 0", ("--simpo-gamma", "0")),
            ("SimPO γ = 0.5", ("--simpo-gamma", "0.5")),
            ("SimPO γ = 1.5", ("--simpo-gamma", "1.5")),
            ("DPO, β = 0.1", ("--beta", "0.1"), "dpo"),
        ),
        PAIR_COLUMNS,
    ),
    "kto-imbalance": Study(
        "KTO needs only thumbs up/down; λ_D·n_D / λ_U·n_U in [1, 4/3] for imbalanced data",
        "kto",
        160,
        (
            ("balanced", ()),
            ("1 pair in 8 with its desirable, λ_D = 1", ("--desirable-fraction", "0.125")),
            (
                "1 pair in 8 with its desirable, λ_D = 8",
                ("--desirable-fraction", "0.125", "--desirable-weight", "8"),
            ),
        ),
        (("rewards/chosen", "last"), ("rewards/rejected", "last"), ("kl", "mean")),
    ),
    "dapo-overlong": Study(
        "DAPO's soft overlong punishment shortens the truncated tail",
        "dapo",
        160,
        (("no overlong penalty", ()), ("overlong buffer 8 of 32 tokens", ("--overlong-buffer", "8"))),
        (("completion_length", "mean"), ("completion_truncated", "mean")),
    ),
    "forgetting": Study(
        "narrow-data training overwrites general capabilities; mitigate with LoRA, a general-data mix, fewer epochs",
        "sft",
        320,
        (
            ("SFT, full fine-tuning", ()),
            # an adapter wants about 10x the full fine-tuning rate (common.LoraOptions)
            ("SFT, LoRA r = 16, lr 1e-4", ("--lora-r", "16", "--lr", "1e-4")),
            ("GRPO, full fine-tuning", (), "grpo"),
            ("GRPO, LoRA r = 16, lr 1e-4", ("--lora-r", "16", "--lr", "1e-4"), "grpo"),
            # appended: a row's folder is its index
            ("SFT, full fine-tuning, lr 1e-4", ("--lr", "1e-4")),
        ),
    ),
    "ipo-dpo": Study(
        "with deterministic labels DPO overfits (its margin keeps growing) and IPO stays bounded",
        "dpo",
        480,
        (("DPO", ()), ("IPO", (), "ipo")),
        (
            ("rewards/margins", "first quarter"),
            ("rewards/margins", "last quarter"),
            ("rewards/chosen", "last quarter"),
            ("rewards/rejected", "last quarter"),
        ),
    ),
    # 10 of grpo.py's default steps, through the catalogue (grpo_options.py); the loss types differ only off-policy
    # (at μ = 1 every ρ is 1: docs/grpo.md)
    "grpo-2026": Study(
        "TRL's GRPO options of 2025-26: soft gates, length-unbiased and two-sided ratios, batch std, per-reward "
        "normalisation, entropy bonus and control, truncation mask, high-entropy tokens",
        "grpo-options-defaults",
        1280,
        (
            ("default (clip, μ = 1)", ()),
            ("clip, μ = 2", ("--num-iterations", "2")),
            ("SAPO, μ = 2", ("--num-iterations", "2", "--loss-type", "sapo")),
            (
                "VESPO, μ = 2, token-mean",
                ("--num-iterations", "2", "--loss-type", "vespo", "--loss-agg", "token-mean"),
            ),
            (
                "LUSPO, μ = 2",
                (
                    "--num-iterations",
                    "2",
                    "--loss-type",
                    "luspo",
                    "--importance-level",
                    "sequence",
                    *GSPO_CLIP,
                ),
            ),
            ("clip and δ = 4, μ = 2", ("--num-iterations", "2", "--delta", "4")),
            ("truncated completions masked", ("--mask-truncated-completions",)),
            ("batch std (Lite PPO)", ("--scale-rewards", "batch")),
            ("entropy bonus 0.01", ("--entropy-coef", "0.01")),
            ("entropy target 1.8", ("--entropy-target", "1.8", "--entropy-coef-step", "0.01")),
            ("top 20 % entropy tokens", ("--top-entropy-quantile", "0.2")),
            ("correct + concise, summed", CONCISE),
            ("correct + concise, each normalised (GDPO)", (*CONCISE, *GDPO)),
        ),
        (("entropy", "mean"), ("entropy", "last quarter"), ("rewards/concise/mean", "last quarter")),
    ),
}
DPO_FAMILY = ("dpo", "simpo", "kto")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--studies", nargs="+", default=list(STUDIES), choices=list(STUDIES), metavar="STUDY")
    parser.add_argument(
        "--list", action="store_true", help="print the studies, their rows and claims, and stop"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="(default: 0 1 2)")
    parser.add_argument(
        "--budget", type=int, default=None, help="one budget for every study (default: each its own)"
    )
    parser.add_argument(
        "--model", default="smollm2", help="the starting model of every run (default: smollm2)"
    )
    parser.add_argument("--eval-size", type=int, default=50, help="held-out problems (default: 50)")
    parser.add_argument(
        "--pass-k", type=int, default=4, help="temperature-1 samples per problem (default: 4)"
    )
    parser.add_argument("--device", default="auto", help="passed to every script (default: auto)")
    parser.add_argument("--out", default="runs/sensitivity", help="output folder (default: runs/sensitivity)")
    parser.add_argument("--extra", default="", help="more options for every script, one string")
    args = parser.parse_args(argv)
    args.keep_models = False
    if args.pass_k < 1:
        parser.error(f"--pass-k must be at least 1 (the samples per problem of the KL), not {args.pass_k}")
    return args


def row_slug(study: str, setting: str) -> str:
    """A folder name for a row: 'dpo-beta/β-=-0.01' is awkward on a command line, so the index is used (a new row
    goes at the end of its study, or the finished runs no longer match their folders)."""
    return f"{study}/row-{[row[0] for row in STUDIES[study].rows].index(setting)}"


def row_command(study: str, row: tuple) -> tuple:
    """What a row runs: its budget and its whole command."""
    spec = STUDIES[study]
    setting, extra, *base = row
    return (spec.budget, *compare.ALGORITHMS[base[0] if base else spec.base][1], *extra)


def run_slug(study: str, setting: str) -> str:
    """The folder a row's runs go in: that of the first row, in any study, with the same command and budget, so that
    a setting four studies share (ppo.py's defaults) is run once a seed."""
    command = row_command(study, next(row for row in STUDIES[study].rows if row[0] == setting))
    same = [
        row_slug(other, row[0])
        for other, spec in STUDIES.items()
        for row in spec.rows
        if row_command(other, row) == command
    ]
    return same[0]


def logged(run_dir: Path, key: str, how: str):
    """A metric from the run's metrics.jsonl: its mean over the steps that logged it, its last value, or its mean
    over the first or last quarter of those steps (one batch's value is noisy; a quarter's shows a trend). NaN is a
    step where it is undefined (PPO's explained variance when every return in the batch is equal): left out."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    values = [row[key] for row in map(json.loads, lines) if key in row and not math.isnan(row[key])]
    if not values:
        return None
    quarter = max(1, len(values) // 4)
    steps = {
        "mean": values,
        "last": values[-1:],
        "first quarter": values[:quarter],
        "last quarter": values[-quarter:],
    }
    return statistics.mean(steps[how])


def table(study: str, rows: list[dict], args) -> str:
    spec = STUDIES[study]
    headers = [
        "setting",
        "held-out accuracy",
        "KL to start",
        "sampled length",
        "general NLL change",
        *[column(key, how) for key, how in spec.columns],
        "wall time (min)",
    ]
    lines = [
        f"Claim: {spec.claim}. {rows[0]['completions']} training completions a run; seeds "
        f"{' '.join(map(str, args.seeds))}; {args.eval_size} held-out problems; mean ± sample std over seeds.",
        "",
        "| " + " | ".join(headers) + " |",
        "| --- " * len(headers) + "|",
    ]
    starts = [r["accuracy_before"] for r in {r["seed"]: r for r in rows}.values()]
    start_nlls = [
        r["general_nll_before"] for r in {r["seed"]: r for r in rows}.values() if r["general_nll_before"]
    ]
    start = ["starting model", compare.mean_std(starts), "0", "", ""] + [""] * (len(headers) - 5)
    if start_nlls:
        start[4] = f"(NLL {compare.mean_std(start_nlls)})"
    lines.append("| " + " | ".join(start) + " |")
    for setting, *_ in spec.rows:
        runs = [r for r in rows if r["setting"] == setting]
        if not runs:
            continue
        cells = [
            setting,
            compare.mean_std([r["accuracy"] for r in runs]),
            compare.mean_std([r["kl"] for r in runs], 2),
            compare.mean_std([r["length"] for r in runs], 1),
            nll_change(runs),
        ]
        for key, how in spec.columns:
            cells.append(claim_cell([r[column(key, how)] for r in runs]))
        cells.append(compare.mean_std([r["wall_time_s"] / 60 for r in runs], 1))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def claim_cell(values: list) -> str:
    """A claim column's 'm ± s' over the seeds where the metric is defined (None where a run never logged it), and
    how many those are when they are not all: a mean over 2 seeds must not read as one over 3."""
    defined = [v for v in values if v is not None]
    if not defined:
        return ""
    cell = compare.mean_std(defined, 3)
    if len(defined) < len(values):
        cell = f"{cell} ({len(defined)} of {len(values)} seeds)"
    return cell


def nll_change(runs: list[dict]) -> str:
    """The general text's NLL after minus before, per seed, as 'm ± s' (nats per token); '' when a run was made
    before the measure existed (a mean over some of the seeds would read as one over all)."""
    if any(r["general_nll_after"] is None for r in runs):
        return ""
    return compare.mean_std([r["general_nll_after"] - r["general_nll_before"] for r in runs], 3)


def one_row(args, study: str, row: tuple, seed: int, out: Path) -> dict:
    spec = STUDIES[study]
    setting, extra, *base = row
    _, command, per_step = compare.ALGORITHMS[base[0] if base else spec.base]
    slug = run_slug(study, setting)
    # a row is a compare.py row with its options added: the same run, read-back and KL code
    compare.ALGORITHMS[slug] = (setting, [*command, *extra], per_step)
    run_args = argparse.Namespace(**vars(args))
    run_args.budget = args.budget or spec.budget
    result = compare.one_run(run_args, slug, seed, out)
    run_dir = Path(result["run_dir"])
    sampled = json.loads((run_dir / f"sampled-k{args.pass_k}.json").read_text())
    result.update({"study": study, "setting": setting, "length": sampled.get("length")})
    for key, how in spec.columns:
        result[column(key, how)] = logged(run_dir, key, how)
    return result


def column(key: str, how: str) -> str:
    """A logged metric's name in a study's rows and tables: its own name beside compare.py's measures would replace
    one of theirs (PPO and KTO log a "kl" of their own, the KL to the start is compare.py's "kl")."""
    return f"{key} ({how})"


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.list:
        for study in args.studies:
            spec = STUDIES[study]
            print(f"{study}: {spec.claim} ({spec.base}, {spec.budget} completions)")
            for setting, extra, *base in spec.rows:
                print(
                    f"    {setting}: {' '.join(compare.ALGORITHMS[base[0] if base else spec.base][1] + list(extra))}"
                )
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for study in args.studies:
        rows = []
        total = len(STUDIES[study].rows) * len(args.seeds)
        for seed in args.seeds:  # seed-major: a stopped study has every row on its first seeds
            for row in STUDIES[study].rows:
                print(f"{study} [{len(rows) + 1}/{total}] {row[0]}, seed {seed}", flush=True)
                rows.append(one_row(args, study, row, seed, out))
                (out / study).mkdir(parents=True, exist_ok=True)
                (out / study / "table.md").write_text(table(study, rows, args))
                (out / study / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(table(study, rows, args))
    print(f"wrote {out}/STUDY/table.md and {out}/STUDY/results.jsonl for each study")


if __name__ == "__main__":
    main()
