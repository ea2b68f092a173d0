"""On-policy distillation against off-policy distillation and GRPO, at one number of student samples.

    python sft.py --eval-every 0 --eval-size 50 --pass-k 0                          # the teacher: prints its folder
    python scripts/distill_compare.py --teacher runs/sft-smollm2-0-<time>/model     # 3 seeds, about 75 min on 2 cores

Each seed trains three students from --model, each on --samples completions:
- on-policy: distill.py; the student samples, the teacher scores the student's tokens (16 prompts × 4 a step);
- off-policy: sft.py on the teacher's own samples (temperature 1, 4 a training problem of the seed, drawn here
  once and kept in OUT/teacher-samples/), each seen once (16 a step); its wall time adds the drawing;
- GRPO: grpo.py on the verifier's reward (16 prompts × 8 a step, its learning rate decaying to 0 at its end).
Each script evaluates its student (greedy, held-out) after every quarter of the samples. Each final student is then
sampled here, --k completions a held-out problem at temperature 1, for its KL to the teacher, KL(π_S ‖ π_T) a token:
k1 = Σ_t log π_S − log π_T over a completion, averaged, over the mean completion length. A finished run is read back
(scripts/compare.py's rule), never rerun. Writes OUT/table.md and OUT/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import compare  # noqa: E402  its run, finished_run, measured and sampled_measures
from infra import models, runs  # noqa: E402
from task import preferences, tasks  # noqa: E402

TEACHER_SAMPLES_PER_PROMPT = 4
# (the script, its options, the completions one step trains on)
METHODS = {
    "on-policy": (["distill.py"], 16 * 4),
    "off-policy": (["sft.py"], 16),
    "grpo": (["grpo.py"], 16 * 8),
}


def rows_to_draw(samples: int) -> int:
    """How many teacher samples to write for sft.py to train on exactly `samples`: it holds out a tenth, at most 64
    and at least 1 (sft.load_demonstrations)."""
    rows = samples
    while rows - max(1, min(64, rows // 10)) < samples:
        rows += 1
    return rows


def teacher_samples(args, seed: int) -> tuple[Path, float]:
    """The teacher's samples of the seed's training problems as sft.py's JSONL (drawn once, then read back), and the
    seconds the drawing took."""
    path = args.out / "teacher-samples" / f"seed-{seed}.jsonl"
    timing = path.with_suffix(".json")
    if not timing.exists():
        rows = rows_to_draw(args.samples)
        device = models.resolve_device(args.device)
        tokenizer = models.load_tokenizer(args.teacher)
        kernels_on = models.resolve_kernels("auto", device)
        teacher = models.load_model(
            args.teacher, len(tokenizer), device, seed=seed, kernels_on=kernels_on
        ).eval()
        stream = tasks.train_problems(seed, tasks.training_exclusion(args.eval_size))
        start = time.perf_counter()
        samples = []
        drawn = 0
        # sft.py refuses an empty completion (the teacher's EOS at once): such a sample is left out, and more drawn
        while len(samples) < rows:
            problems = [next(stream) for _ in range(-(-(rows - len(samples)) // TEACHER_SAMPLES_PER_PROMPT))]
            batch = preferences.label_samples(
                teacher,
                tokenizer,
                problems,
                TEACHER_SAMPLES_PER_PROMPT,
                args.max_new_tokens,
                1.0,
                seed + drawn,
                desc=f"the teacher's samples, seed {seed}",
            )
            drawn += len(batch)
            samples += [s for s in batch if s["completion"].strip()]
            runs.require(drawn < 4 * rows, f"--teacher {args.teacher}: most of its samples are empty")
        samples = samples[:rows]
        seconds = time.perf_counter() - start
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "".join(
                json.dumps({"prompt": s["prompt"], "completion": s["completion"]}) + "\n" for s in samples
            )
        )
        summary = {
            "seconds": seconds,
            "rows": len(samples),
            "drawn": drawn,
            "right": sum(s["label"] for s in samples) / len(samples),
            "finished": sum(s["finished"] for s in samples) / len(samples),
        }
        timing.write_text(json.dumps(summary) + "\n")
    return path, json.loads(timing.read_text())["seconds"]


def one_run(args, method: str, seed: int) -> dict:
    """One student: trained (or read back), its evaluations, and its KL to the teacher."""
    script, per_step = METHODS[method]
    steps = args.samples // per_step
    folder = args.out / method / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    command = [*script, "--model", args.model, "--seed", str(seed), "--steps", str(steps)]
    setup_s = 0.0
    if method == "on-policy":
        command += ["--teacher", args.teacher]
    if method == "off-policy":
        dataset, setup_s = teacher_samples(args, seed)
        command += ["--dataset", str(dataset)]
    command += ["--eval-every", str(max(1, steps // 4)), "--eval-size", str(args.eval_size), "--pass-k", "0"]
    command += [
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--device",
        args.device,
        "--output-dir",
        str(folder),
    ]
    run_dir = compare.run_once(command, folder, folder / "log.txt")
    evaluation = json.loads((run_dir / "eval.json").read_text())
    sampled = compare.measured(
        run_dir / f"kl-to-teacher-k{args.k}.json",
        lambda: compare.sampled_measures(
            str(run_dir / "model"),
            args.teacher,
            args.eval_size,
            seed,
            args.device,
            args.k,
            args.max_new_tokens,
        ),
    )
    return {
        "method": method,
        "seed": seed,
        "samples": steps * per_step,
        "evals": [(e["step"] * per_step, e["accuracy"]) for e in evaluation["evals"]],
        "accuracy": evaluation["accuracy_after"],
        "kl_to_teacher": sampled["kl"] / sampled["length"],
        "wall_time_s": evaluation["wall_time_s"] + setup_s,
        "run_dir": str(run_dir),
    }


def starting_kl(args, seed: int) -> float:
    """The starting model's KL(π_S ‖ π_T) a token, on the same draw as the students'."""
    path = args.out / "starting-model" / f"seed-{seed}-kl-to-teacher-k{args.k}.json"
    sampled = compare.measured(
        path,
        lambda: compare.sampled_measures(
            args.model, args.teacher, args.eval_size, seed, args.device, args.k, args.max_new_tokens
        ),
    )
    return sampled["kl"] / sampled["length"]


def mean_std(values: list[float], digits: int = 3) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {spread:.{digits}f}"


def table(rows: list[dict], start_kl: list[float]) -> str:
    """One line a method: accuracy at each quarter of the samples (the mean over seeds), the last with its spread,
    the KL to the teacher and the wall time."""
    lines = [
        "| student | held-out accuracy at 0, ¼, ½, ¾ of the samples | at all of them | KL(π_S ‖ π_T) a token "
        "| wall time (min) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        curve = [statistics.mean(acc for _, acc in points) for points in zip(*(r["evals"] for r in mine))]
        accuracy = mean_std([r["accuracy"] for r in mine])
        kl = mean_std([r["kl_to_teacher"] for r in mine], 4)
        minutes = mean_std([r["wall_time_s"] / 60 for r in mine], 1)
        lines.append(
            f"| {method} | {', '.join(f'{a:.3f}' for a in curve[:-1])} | {accuracy} | {kl} | {minutes} |"
        )
    lines.append(f"| (the starting model) | | | {mean_std(start_kl, 4)} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--teacher", required=True, help="the teacher: a checkpoint folder (…/model)")
    parser.add_argument("--model", default="smollm2", help="the student's starting model")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--samples", type=int, default=2560, help="student samples each method trains on")
    parser.add_argument("--eval-size", type=int, default=50, help="held-out problems")
    parser.add_argument(
        "--k", type=int, default=4, help="samples a held-out problem for the KL to the teacher"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=32, help="the longest sample, in training and in measuring"
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--out", type=Path, default=Path("runs/distill-compare"))
    args = parser.parse_args(argv)
    runs.require(Path(args.teacher).is_dir(), f"--teacher {args.teacher}: no such checkpoint folder")
    runs.require(
        args.samples >= 512 and args.samples % 512 == 0,
        f"--samples must be a multiple of 512 (four GRPO steps of 128), not {args.samples}",
    )
    runs.require(args.k >= 1 and args.eval_size >= 1, "--k and --eval-size must be >= 1")
    rows = [one_run(args, method, seed) for seed in args.seeds for method in args.methods]
    start_kl = [starting_kl(args, seed) for seed in args.seeds]
    (args.out / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = table(rows, start_kl)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return rows


if __name__ == "__main__":
    runs.run_main(main, sys.argv[1:])
