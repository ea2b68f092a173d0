"""Every algorithm at one budget on several seeds: docs/results.md's comparison table and its picture.

The budget is a number of *training completions*: the completions a loss is computed on.
- Online algorithms count their samples. GRPO and RLOO sample 32 per step; PPO and ReMax sample 8 (PPO's shape
  pinned: ppo.py's default batch of 128 is over the CPU budget; its other defaults are ppo.py's).
  ReMax's 8 greedy baselines are not counted, since no loss is computed on them.
- RFT counts its samples too, kept or not: 4 prompts × 8 a round, one update per round, so it
  samples exactly what GRPO samples and trains once per batch as GRPO does.
- SFT counts demonstrations: 16 per step.
- The pairwise offline algorithms (DPO, IPO, SimPO, ORPO) count the chosen and the rejected
  completion of each pair: 16 per step.
- KTO counts the same 16 per step. Its reference-point completions are not counted.
- Each algorithm gets steps = budget // (completions per step).
Counting this way is reproducible on any machine, which equal wall time is not. Wall time is in
the table beside the counts, so both views are there.

Every run starts from the same model with the script's own defaults. Each run:
- is evaluated by its own script for greedy held-out accuracy, before and after;
- is then sampled by this script, k completions per held-out problem at temperature 1 (`--pass-k`),
  which give both its pass@k and its KL to the starting model;
- has its model deleted after that measurement (`--keep-models` keeps them).
The starting model's pass@k is measured once per seed, from the same random numbers.

The KL column is a sequence-level KL(π ‖ π_ref) per completion: k1 = Σ_t log π − log π_ref,
averaged over those k completions of every held-out prompt. The same estimator is used for every
algorithm; the KL each script logs is defined differently from one algorithm to another.
The wall-time column is the script's own run, timed from after its data and models are loaded:
training and its two greedy evaluations. So:
- PPO on the reward model first trains `reward_model.py` on the same seed (an ensemble: on seeds
  1000 and 2000 up too, on the first's sampled pairs). Their wall time is added to the row.
- The reward model and the offline algorithms share each seed's preference data, sampled once
  and cached (also across comparisons). Its sampling time is in no row, cached or not: about
  8 min per seed on the 2-core CPU (7 min 55 s for seed 1).

Run (a finished (algorithm, seed) is read back from its eval.json, never rerun, when its args.json
agrees with every option given):
    python scripts/compare.py                                    # every algorithm, 3 seeds, the CPU budget
                                                                 # (see docs/results.md for its cost)
    python scripts/compare.py --full --device cuda               # the GPU budget
    python scripts/compare.py --algos grpo dpo --seeds 0 --budget 320 --out runs/compare-small

Writes OUT/comparison.md (the table), OUT/comparison.png (held-out accuracy against wall time)
and OUT/results.jsonl (one row per run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# 4 prompts × 8 completions = 32 a step: the shape the comparison was run with (grpo.py's own default is 16 prompts)
GRPO = ["grpo.py", "--prompts-per-step", "4"]
# the same shape, as an asynchronous trainer runs it (grpo_async.py: --staleness, --is-correction)
GRPO_ASYNC = ["grpo_async.py", "--prompts-per-step", "4"]
# the same shape, with the later papers' options (grpo_options.py, the catalogue: --loss-type, --importance-level, ...)
GRPO_OPTIONS = ["grpo_options.py", "--prompts-per-step", "4"]
# PPO at the budget's scale: 8 completions a step in one minibatch (ppo.py's default batch is 128)
PPO_SHAPE = ["--batch-size", "8", "--minibatch-size", "8"]
# slug: (name in the table, command after `python`, training completions per step)
ALGORITHMS = {
    "sft": ("SFT", ["sft.py"], 16),
    "grpo": ("GRPO", GRPO, 32),
    "dapo": (
        "GRPO, DAPO settings",
        [*GRPO, "--loss-agg", "token-mean", "--eps-high", "0.28", "--dynamic-sampling", "--beta", "0"],
        32,
    ),
    "dr-grpo": (
        "GRPO, Dr. GRPO settings",
        [*GRPO, "--no-scale-by-std", "--loss-agg", "seq-mean-token-sum-norm"],
        32,
    ),
    "rloo": ("RLOO", ["variants.py", "--algo", "rloo"], 32),
    "remax": ("ReMax", ["variants.py", "--algo", "remax"], 8),
    "ppo-verifier": ("PPO, verifier", ["ppo.py", "--reward", "verifier", *PPO_SHAPE], 8),
    "ppo-rm": ("PPO, reward model", ["ppo.py", "--reward", "model", *PPO_SHAPE], 8),
    # ppo.py at its own defaults, 128 completions a step in 4 minibatches: the PPO knobs' studies (sensitivity.py) and
    # the search for the budget where PPO learns (ppo_budget.py)
    "ppo-verifier-defaults": ("PPO, verifier, ppo.py's batch", ["ppo.py", "--reward", "verifier"], 128),
    "grpo-defaults": ("GRPO, grpo.py's batch", ["grpo.py"], 128),
    # the same run through the catalogue, whose options at their defaults are grpo.py's: the 2026 options' study
    "grpo-options-defaults": ("GRPO, grpo.py's batch, the catalogue", ["grpo_options.py"], 128),
    # its variant with the mitigations of over-optimisation (--ensemble-agg, --reward-clip, ...), all off
    "ppo-rm-overoptimisation": (
        "PPO, reward model, over-optimisation variant",
        ["ppo_overoptimisation.py", "--reward", "model", *PPO_SHAPE],
        8,
    ),
    "dpo": ("DPO", ["dpo.py"], 16),
    "ipo": ("IPO", ["variants.py", "--algo", "ipo"], 16),
    "kto": ("KTO", ["variants.py", "--algo", "kto"], 16),
    "simpo": ("SimPO", ["variants.py", "--algo", "simpo"], 16),
    "orpo": ("ORPO", ["variants.py", "--algo", "orpo"], 16),
    "reinforce-pp": ("REINFORCE++", ["variants.py", "--algo", "reinforce_pp"], 32),
    "reinforce-pp-baseline": (
        "REINFORCE++, baseline",
        ["variants.py", "--algo", "reinforce_pp_baseline"],
        32,
    ),
    "online-dpo": ("Online DPO", ["dpo_online.py"], 16),  # two samples per prompt, kept pairs or not
    # With μ = 1 the ratio is 1 and GSPO and CISPO are GRPO itself: they differ only with μ > 1.
    "grpo-mu2": ("GRPO, μ = 2", [*GRPO, "--num-iterations", "2"], 32),
    "gspo": (
        "GSPO, μ = 2",
        [
            *GRPO_OPTIONS,
            "--num-iterations",
            "2",
            "--importance-level",
            "sequence",
            "--eps-low",
            "3e-4",
            "--eps-high",
            "4e-4",
        ],
        32,
    ),
    "cispo": ("CISPO, μ = 2", [*GRPO_OPTIONS, "--num-iterations", "2", "--loss-type", "cispo"], 32),
    "r1-rewards": (
        "GRPO, correct + 0.5 format, R1 prompt",
        [*GRPO, "--rewards", "correct", "format", "--reward-weights", "1", "0.5", "--prompt-style", "r1"],
        32,
    ),
    # GRPO's shape without the RL: 4 prompts × 8 samples a round, the verified kept, one SFT step on them
    "rft": ("RFT (rejection sampling)", ["rft.py", "--prompts-per-round", "4", "--steps-per-round", "1"], 32),
    # each step trains on the batch sampled k updates earlier, uncorrected or with truncated IS (grpo_async.py)
    "grpo-tis": ("GRPO, token-truncate IS", [*GRPO_ASYNC, "--is-correction", "token-truncate"], 32),
    "grpo-stale2": ("GRPO, staleness 2", [*GRPO_ASYNC, "--staleness", "2"], 32),
    "grpo-stale2-tis": (
        "GRPO, staleness 2, token-truncate IS",
        [*GRPO_ASYNC, "--staleness", "2", "--is-correction", "token-truncate"],
        32,
    ),
    "grpo-stale4": ("GRPO, staleness 4", [*GRPO_ASYNC, "--staleness", "4"], 32),
    "grpo-stale4-tis": (
        "GRPO, staleness 4, token-truncate IS",
        [*GRPO_ASYNC, "--staleness", "4", "--is-correction", "token-truncate"],
        32,
    ),
}
# Choices by name only: the default set is the one docs/results.md's comparison was run with.
NOT_BY_DEFAULT = (
    "ppo-rm-overoptimisation",
    "rft",
    "reinforce-pp",
    "reinforce-pp-baseline",
    "online-dpo",
    "grpo-mu2",
    "gspo",
    "cispo",
    "r1-rewards",
    "grpo-tis",
    "grpo-stale2",
    "grpo-stale2-tis",
    "grpo-stale4",
    "grpo-stale4-tis",
    "grpo-options-defaults",
)
CPU_BUDGET, GPU_BUDGET = 160, 3200  # training completions per run


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default = [slug for slug in ALGORITHMS if slug not in NOT_BY_DEFAULT]
    parser.add_argument(
        "--algos",
        nargs="+",
        default=default,
        choices=list(ALGORITHMS),
        metavar="ALGO",
        help=f"which algorithms (default: {', '.join(default)}; also {', '.join(NOT_BY_DEFAULT)})",
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds, one run each (default: 0 1 2)"
    )
    parser.add_argument(
        "--budget",
        type=int,
        default=None,
        help=f"training completions per run (default: {CPU_BUDGET}, or {GPU_BUDGET} with --full)",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help=f"the GPU budget: {GPU_BUDGET} completions and 200 held-out problems",
    )
    parser.add_argument(
        "--model", default="smollm2", help="the starting model of every run (default: smollm2)"
    )
    parser.add_argument(
        "--eval-size", type=int, default=None, help="held-out problems (default: 50, or 200 with --full)"
    )
    parser.add_argument(
        "--pass-k",
        type=int,
        default=8,
        help="k of pass@k, also the samples per problem of the KL (default 8)",
    )
    parser.add_argument("--device", default="auto", help="passed to every script (default: auto)")
    parser.add_argument("--out", default="runs/compare", help="output folder (default: runs/compare)")
    parser.add_argument(
        "--keep-models",
        action="store_true",
        help="keep every run's model (about 0.5 GB each for SmolLM2-135M)",
    )
    parser.add_argument(
        "--extra",
        default="",
        help='more options for every script, one string (e.g. "--precision bf16-mixed")',
    )
    args = parser.parse_args(argv)
    args.budget = args.budget or (GPU_BUDGET if args.full else CPU_BUDGET)
    args.eval_size = args.eval_size or (200 if args.full else 50)
    shape = [
        flag
        for flag in ("--batch-size", "--prompts-per-step", "--group-size", "--minibatch-size")
        if flag in args.extra.split()
    ]
    if shape:
        parser.error(
            f"--extra {' '.join(shape)} changes the completions per step that the equal budget is counted in; "
            "leave it out"
        )
    if args.pass_k < 1:
        parser.error(
            f"--pass-k must be at least 1 (the samples per problem of pass@k and the KL), not {args.pass_k}"
        )
    if "--pass-k" in args.extra.split():
        parser.error("--extra --pass-k: this script measures pass@k itself; give it as --pass-k")
    too_small = [slug for slug in args.algos if args.budget < ALGORITHMS[slug][2]]
    if too_small:
        parser.error(
            f"--budget {args.budget} is less than one step of {', '.join(too_small)} "
            f"(needs {max(ALGORITHMS[s][2] for s in too_small)} completions)"
        )
    return args


def run(command: list[str], log_path: Path) -> None:
    """One script, its output kept in a log file; a failure stops the comparison with the log's tail."""
    with open(log_path, "w") as log:
        code = subprocess.run(
            [sys.executable, *command], cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    if code != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-5:])
        raise SystemExit(f"`python {' '.join(command)}` failed (exit {code}); the end of {log_path}:\n{tail}")


def run_once(command: list[str], folder: Path, log_path: Path) -> Path:
    """The run folder under `folder` that `command` made: read back if finished (finished_run), else run first."""
    if finished_run(folder, command) is None:
        run(command, log_path)
    return finished_run(folder, command)


def command_settings(command: list[str]) -> dict:
    """The settings a script's command line sets, under the names its args.json gives them:
    `--eps-high 0.28` -> {"eps_high": "0.28"}, `--rewards correct format` -> {"rewards": ["correct", "format"]},
    `--dynamic-sampling` -> True, `--no-scale-by-std` -> {"scale_by_std": False}. The script's name and
    --output-dir (where, not what) are left out."""
    options, settings, i = [a for a in command if not a.endswith(".py")], {}, 0
    while i < len(options):
        key, values = options[i][2:].replace("-", "_"), []
        # values (negative numbers: one dash)
        while i + 1 < len(options) and not options[i + 1].startswith("--"):
            values.append(options[i + 1])
            i += 1
        if values:
            settings[key] = values[0] if len(values) == 1 else values
        else:  # a switch
            settings[key.removeprefix("no_")] = not key.startswith("no_")
        i += 1
    settings.pop("output_dir", None)
    return settings


def same_setting(made, given) -> bool:
    """args.json's value against the command line's text: 0.0 is "0", True is a switch, a list item by item."""
    # `--rewards correct` is ["correct"] in args.json, ("correct",) in the parsed Args
    if isinstance(made, (list, tuple)) or isinstance(given, list):
        given = given if isinstance(given, list) else [given]
        return (
            isinstance(made, (list, tuple))
            and len(made) == len(given)
            and all(map(same_setting, made, given))
        )
    if isinstance(given, bool) or made is None:
        return made == given
    try:
        return float(made) == float(given)
    except (TypeError, ValueError):
        return str(made) == given or same_path(str(made), given)


def same_path(made: str, given: str) -> bool:
    """One file named two ways: `--out /abs/runs` saves an absolute --reward-model, `--out runs` a relative one."""
    # scripts run with the repository as their working folder, so a relative path is relative to it
    return (REPO / made).resolve() == (REPO / given).resolve()


def finished_run(folder: Path, command: list[str]):
    """The run folder under `folder` with an eval.json, or None. A run whose args.json disagrees with
    a setting `command` gives (another --budget, --model, --extra or reward model into the same --out)
    stops the comparison: reading it back would put it in the table as this command's result."""
    done = sorted(p.parent for p in folder.glob("*/eval.json"))
    if not done:
        return None
    # a script's own options, and its groups run and lora
    saved = json.loads((done[-1] / "args.json").read_text())
    made = {k: v for group in (saved, saved.get("run", {}), saved.get("lora", {})) for k, v in group.items()}
    differ = [
        f"{key}={made.get(key)} (not {value})"
        for key, value in command_settings(command).items()
        if not same_setting(made.get(key), value)
    ]
    if differ:
        raise SystemExit(
            f"error: {done[-1]} was run with {', '.join(differ)}; give another --out, or delete it"
        )
    return done[-1]


def sampled_measures(
    model: str,
    base: str,
    eval_size: int,
    seed: int,
    device: str,
    k: int,
    max_new_tokens: int = 32,
    prompt_style: str = "question",
) -> dict:
    """pass@k and KL(π ‖ π_ref) per completion, both from one draw of k completions per held-out problem
    at temperature 1 from `model` (a checkpoint folder, or `base` itself for the starting model), the problems
    asked as the run asked them (grpo.py --prompt-style: `r1` adds R1's instruction to each question).
    - pass@k: Chen et al.'s unbiased estimator with n = k, the same as tasks.evaluate_pass_at_k.
    - KL: k1 = Σ_t log π − log π_ref of each completion, averaged over all k·eval_size completions;
      0 without scoring when `model` is `base`.
    - length: the mean completion length in tokens, EOS included.
    The generator is seeded by `seed`, so every model of a seed draws the same random numbers."""
    import torch

    import common
    from infra import models
    from task import tasks

    dev = models.resolve_device(device)
    tokenizer = models.load_tokenizer(str(model))
    kernels = models.resolve_kernels("auto", dev)
    policy = models.load_model(str(model), len(tokenizer), dev, seed=seed, kernels_on=kernels).eval()
    reference = (
        models.load_model(base, len(tokenizer), dev, seed=seed, kernels_on=kernels).eval()
        if model != base
        else None
    )
    _, problems = tasks.with_prompt_style(prompt_style, iter([]), tasks.heldout_problems(eval_size))
    generator = torch.Generator(device=dev).manual_seed(seed)
    passed, kl, tokens, prompts_per_batch = 0.0, 0.0, 0, max(1, 128 // k)
    with torch.no_grad():
        for start in range(0, len(problems), prompts_per_batch):
            batch = problems[start : start + prompts_per_batch]
            ids, mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in batch], dev)
            # completion_ids: (len(batch)·k, T)
            completion_ids = common.sample_completions(
                policy,
                ids,
                mask,
                k,
                max_new_tokens,
                tokenizer.eos_token_id,
                tokenizer.pad_token_id,
                1.0,
                1.0,
                generator,
            )
            completion_mask = common.completion_mask(completion_ids, tokenizer.eos_token_id)
            tokens += int(completion_mask.sum())
            texts = tasks.decode_completions(tokenizer, completion_ids, completion_mask)
            for i, p in enumerate(batch):
                passed += tasks.pass_at_k(
                    k, int(sum(tasks.verify(t, p.answer) for t in texts[i * k : (i + 1) * k])), k
                )
            if reference is not None:
                repeats = torch.full((len(batch),), k, dtype=torch.long, device=dev)
                logprobs, _ = common.completion_logprobs(policy, ids, mask, completion_ids, repeats)
                ref_logprobs, _ = common.completion_logprobs(reference, ids, mask, completion_ids, repeats)
                kl += common.masked_sum(logprobs - ref_logprobs, completion_mask).item()
    return {
        f"pass@{k}": passed / len(problems),
        "kl": kl / (k * len(problems)),
        "length": tokens / (k * len(problems)),
    }


def measured(path: Path, measure) -> dict:
    """The JSON at `path`, or measure() written there first: a rerun reads a measurement back."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(measure()) + "\n")
    return json.loads(path.read_text())


ENSEMBLE_SIZE = 3  # reward models of a run that names --ensemble-agg (Coste et al. 2024 use 5)


def reward_model_seeds(command: list[str], seed: int) -> list[int]:
    """The seeds of the reward models a run trains first: none for a verifier's reward; for PPO on a learned reward,
    the run's own seed, and for an ensemble (a run that names --ensemble-agg) ENSEMBLE_SIZE − 1 more, 1000 apart,
    so that no member is another run's own (they train on the first's pairs: reward_model_run)."""
    if command[0] not in ("ppo.py", "ppo_overoptimisation.py") or command[1:3] != ["--reward", "model"]:
        return []
    members = ENSEMBLE_SIZE if "--ensemble-agg" in command else 1
    return [seed + 1000 * member for member in range(members)]


def sampled_pairs(rm_folder: Path) -> Path:
    """The training pairs a reward model's run sampled (the JSONL its log names), for another to train on."""
    for line in (rm_folder / "log.txt").read_text().splitlines():
        if line.startswith("preference pairs: ") and " from " in line:
            return Path(line.rsplit(" from ", 1)[1]) / "train.jsonl"
    raise SystemExit(
        f"{rm_folder / 'log.txt'} names no sampled preference pairs: delete {rm_folder} to rerun it"
    )


def reward_model_run(args, seed: int, out: Path, pairs_of: int | None = None) -> Path:
    """reward_model.py on one seed, trained once into OUT/reward-model/seed-N and read back after; its run folder.

    With `pairs_of`, an ensemble member: it trains on the pairs that seed's reward model sampled (--dataset; it
    holds out a tenth of them itself), as Coste et al. 2024 train their members on the same data with different
    seeds, so members differ in the score head's initialisation, the pair order and that tenth."""
    folder = out / "reward-model" / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        "reward_model.py",
        "--model",
        args.model,
        "--seed",
        str(seed),
        "--device",
        args.device,
        "--output-dir",
        str(folder),
        *args.extra.split(),
    ]
    if pairs_of is not None:
        command = [*command, "--dataset", str(sampled_pairs(out / "reward-model" / f"seed-{pairs_of}"))]
    return run_once(command, folder, folder / "log.txt")


def one_run(args, slug: str, seed: int, out: Path) -> dict:
    name, command, per_step = ALGORITHMS[slug]
    steps = args.budget // per_step
    folder = out / slug / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    rm_runs = []
    for rm_seed in reward_model_seeds(command, seed):
        # an ensemble's members after the first train on the first's pairs
        pairs_of = None if rm_seed == seed else seed
        rm_runs.append(reward_model_run(args, rm_seed, out, pairs_of))
    setup_s = sum(json.loads((rm_run / "eval.json").read_text())["wall_time_s"] for rm_run in rm_runs)
    if rm_runs:
        command = [*command, "--reward-model", str(rm_runs[0] / "model")]
    if len(rm_runs) > 1:
        command = [*command, "--ensemble", *[str(rm_run / "model") for rm_run in rm_runs[1:]]]
    # --pass-k 0: pass@k is measured here, with the KL
    command = [
        *command,
        "--model",
        args.model,
        "--seed",
        str(seed),
        "--steps",
        str(steps),
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
        *args.extra.split(),
    ]
    run_dir = run_once(command, folder, folder / "log.txt")
    evaluation = json.loads((run_dir / "eval.json").read_text())
    run_args = json.loads((run_dir / "args.json").read_text())
    max_new_tokens = run_args["max_new_tokens"]
    # every column on the prompts the run trained and was evaluated on, the start's pass@k too
    prompt_style = run_args.get("prompt_style", "question")
    k = args.pass_k
    after = measured(
        run_dir / f"sampled-k{k}.json",
        lambda: sampled_measures(
            str(run_dir / "model"),
            args.model,
            args.eval_size,
            seed,
            args.device,
            k,
            max_new_tokens,
            prompt_style,
        ),
    )
    style = "" if prompt_style == "question" else f"-{prompt_style}-prompts"
    start = measured(
        out
        / "starting-model"
        / f"seed-{seed}-k{k}-{args.eval_size}-problems-{max_new_tokens}-tokens{style}.json",
        lambda: sampled_measures(
            args.model, args.model, args.eval_size, seed, args.device, k, max_new_tokens, prompt_style
        ),
    )
    if not args.keep_models:
        shutil.rmtree(run_dir / "model", ignore_errors=True)
    return {
        "algo": slug,
        "name": name,
        "seed": seed,
        "steps": steps,
        "completions": steps * per_step,
        "accuracy_before": evaluation["accuracy_before"],
        "accuracy": evaluation["accuracy_after"],
        f"pass@{k}_before": start[f"pass@{k}"],
        f"pass@{k}": after[f"pass@{k}"],
        "kl": after["kl"],
        # the forgetting measure (tasks.general_text_nll); absent from runs made before it existed
        "general_nll_before": evaluation.get("general_nll_before"),
        "general_nll_after": evaluation.get("general_nll_after"),
        "wall_time_s": evaluation["wall_time_s"] + setup_s,
        "peak_gb": evaluation["memory/peak_gb"],
        "run_dir": str(run_dir),
    }


def mean_std(values: list[float], digits: int = 3) -> str:
    """'m ± s' with the sample std over seeds, or 'm' for one seed."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(rows: list[dict], args) -> str:
    k = args.pass_k
    lines = [
        f"Budget {args.budget} training completions per run; "
        f"{len(args.seeds)} seed(s) ({' '.join(map(str, args.seeds))}); "
        f"{args.eval_size} held-out problems; mean ± sample std over seeds.",
        "",
        f"| algorithm | steps | held-out accuracy | pass@{k} | KL to start (per completion) | wall time (min) | "
        "peak memory (GiB) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    # one row per seed: the starting model is measured once per seed, read from each seed's first run
    first = {r["seed"]: r for r in reversed(rows)}
    starts = list(first.values())
    if starts:
        passes = [r[f"pass@{k}_before"] for r in starts if r[f"pass@{k}_before"] is not None]
        lines.append(
            f"| starting model | | {mean_std([r['accuracy_before'] for r in starts])} | "
            f"{mean_std(passes) if passes else ''} | 0 | | |"
        )
    for slug in args.algos:
        runs = [r for r in rows if r["algo"] == slug]
        if not runs:
            continue
        passes = [r[f"pass@{k}"] for r in runs if r[f"pass@{k}"] is not None]
        # another prompt (the R1 style): its start's accuracy and pass@k, measured on that prompt, in its row
        own_start = any(r["accuracy_before"] != first[r["seed"]]["accuracy_before"] for r in runs)
        start = f" (from {mean_std([r['accuracy_before'] for r in runs])})" if own_start else ""
        pass_cell = mean_std(passes) if passes else ""
        start_passes = [r[f"pass@{k}_before"] for r in runs if r[f"pass@{k}_before"] is not None]
        if own_start and passes and start_passes:
            pass_cell += f" (from {mean_std(start_passes)})"
        lines.append(
            f"| {runs[0]['name']}{start} | {runs[0]['steps']} | {mean_std([r['accuracy'] for r in runs])} | "
            f"{pass_cell} | {mean_std([r['kl'] for r in runs], 2)} | "
            f"{mean_std([r['wall_time_s'] / 60 for r in runs], 1)} | "
            f"{mean_std([r['peak_gb'] for r in runs], 2)} |"
        )
    return "\n".join(lines) + "\n"


def pyplot(path: Path):
    """matplotlib.pyplot drawing to files only, or None with a note that `path` is skipped (matplotlib is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"note: {path.name} skipped (pip install matplotlib to draw it)", file=sys.stderr)
        return None
    return plt


def picture(rows: list[dict], args, path: Path) -> None:
    """Held-out accuracy against wall time, one point per algorithm (mean over seeds, bars = std)."""
    plt = pyplot(path)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, slug in enumerate(args.algos):
        runs = [r for r in rows if r["algo"] == slug]
        if not runs:
            continue
        acc, minutes = [r["accuracy"] for r in runs], [r["wall_time_s"] / 60 for r in runs]

        def spread(v: list[float]) -> float:
            return statistics.stdev(v) if len(v) > 1 else 0.0

        # 13 markers: colours repeat after 10
        ax.errorbar(
            statistics.mean(minutes),
            statistics.mean(acc),
            xerr=spread(minutes),
            yerr=spread(acc),
            fmt="osD^vP*Xhp<>d"[i % 13],
            capsize=3,
            label=runs[0]["name"],
        )
    ax.axhline(rows[0]["accuracy_before"], color="grey", linestyle="--", linewidth=1, label="starting model")
    ax.set(
        xlabel="wall time per run (min)",
        ylabel="held-out accuracy (greedy)",
        title=f"{args.budget} training completions per run",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # outside: no point hidden
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    total = len(args.algos) * len(args.seeds)
    for seed in args.seeds:  # seed-major: a stopped comparison has every algorithm on its first seeds
        for slug in args.algos:
            print(f"[{len(rows) + 1}/{total}] {ALGORITHMS[slug][0]}, seed {seed}", flush=True)
            rows.append(one_run(args, slug, seed, out))
            (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (out / "comparison.md").write_text(table(rows, args))
    picture(rows, args, out / "comparison.png")
    print(table(rows, args))
    print(f"wrote {out / 'comparison.md'}, {out / 'comparison.png'} and {out / 'results.jsonl'}")


if __name__ == "__main__":
    main()
