"""TRL's GRPOTrainer and DPOTrainer at the settings of docs/performance.md's comparison: seconds per step and peak RSS.

It measures TRL's side of the "Against TRL" section of docs/performance.md, one trainer per process, on the
embedded SmolLM2-135M-Instruct with this project's prompts, verifier and pairs. It prints every step's wall time
(from one optimizer step's end to the next's; the first from the start of training), then one line:
    trl grpo: 24.1 s/step (median of steps 3-12 of 12), peak RSS 5.48 GiB
The median skips the first two steps, as the docs' medians of ours do (with two steps the first, with one none).
Peak RSS is the process's own (resource.getrusage), model loading included.

The settings. Where docs/performance.md states one it is mirrored; everything else is TRL's default:
- both: the model folder models.model_path("smollm2") with its tokenizer (models.load_tokenizer), loaded by TRL itself
  (float32 weights); bf16=True (bfloat16 autocast) with use_cpu=True, which TRL needs for bf16 on a CPU;
  logging every step, no evaluation, no saving, no trackers. TRL's defaults are kept for gradient checkpointing
  (on), the optimizer (fused AdamW, weight decay 0, gradient clipping at 1), the schedule (no warm-up, linear decay
  to 0; ours warm up and stay constant), the seed (42) and data shuffling.
- grpo: 4 prompts x 8 completions per step (per_device_train_batch_size=32, num_generations=8), at most 32 new
  tokens, temperature 1, lr 1e-5, beta 0 (the docs' `--beta 0`; TRL's default too; `--beta 0.04` is grpo.py's own
  default, which loads a reference model on both sides), mu = 1, the first 4 x STEPS training problems of
  `grpo.py --eval-size 8` (tasks.load_problems, seed 0; TRL shuffles their order) in its chat template
  (tasks.format_prompt), rewarded by tasks.verify. TRL's defaults: loss_type "dapo", scale_rewards "group",
  epsilon 0.2, top_k 0, top_p 1.
- dpo: 8 pairs per step, beta 0.1, lr 5e-6, the 44 training pairs of `dpo.py --dataset tests/data/pairs.jsonl`
  (preferences.load_preference_pairs, seed 0) with the prompt in its chat template, a frozen reference copy scoring each
  batch (TRL's default; dpo.py scores the reference once up front). TRL appends EOS to every completion and
  tokenises prompt + completion together (the same 39 prompt tokens here). `--dataset own` trains instead on the
  model's own pairs that `python dpo.py --precision bf16-mixed` samples and caches under
  ~/.cache/minimal-rlhf/preference-data/ (built by preferences.preference_data if missing: minutes of sampling); TRL
  appends EOS there also to a sample cut off at 32 tokens, which dpo.py leaves without one.

The docs' comparison, ours and TRL's one after the other (A B A B) on a quiet machine, each timed by the OS:
    python -m venv --system-site-packages /tmp/trl && /tmp/trl/bin/pip install trl==1.16.0 torch==2.13.0
    /usr/bin/time -v python grpo.py --prompts-per-step 4 --beta 0 --steps 12 --eval-size 8 --eval-every 0 \\
        --no-save-model --precision bf16-mixed --output-dir runs/bench
    /usr/bin/time -v /tmp/trl/bin/python scripts/bench_trl.py grpo --steps 12
    /usr/bin/time -v python dpo.py --dataset tests/data/pairs.jsonl --steps 22 --eval-size 8 --no-save-model \\
        --precision bf16-mixed --output-dir runs/bench-dpo
    /usr/bin/time -v /tmp/trl/bin/python scripts/bench_trl.py dpo --steps 22
(twice each, alternating; docs/performance.md has the one-liner that takes the median of ours from metrics.jsonl;
"Elapsed (wall clock) time" and "Maximum resident set size" are /usr/bin/time's whole-process time and peak RSS.)
Pinning torch==2.13.0 keeps pip from replacing the CPU build with a CUDA one.

TRL is never a dependency of this project: it lives in its own virtual environment, and this script is the only
file that imports it.
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from infra import models  # noqa: E402
from infra import runs  # noqa: E402
from task import preferences, tasks  # noqa: E402

NO_TRL = (
    "error: scripts/bench_trl.py needs TRL, which is never a dependency of this project: "
    "python -m venv --system-site-packages /tmp/trl && /tmp/trl/bin/pip install trl, "
    "then run it with /tmp/trl/bin/python"
)
DEFAULT_STEPS = {"grpo": 12, "dpo": 22}  # the docs' runs
# the settings printed before training, as the trainer holds them after its own defaults and checks
SHOWN = {
    "grpo": [
        "per_device_train_batch_size",
        "num_generations",
        "generation_batch_size",
        "max_completion_length",
        "temperature",
        "top_p",
        "top_k",
        "learning_rate",
        "beta",
        "num_iterations",
        "epsilon",
        "loss_type",
        "scale_rewards",
    ],
    "dpo": [
        "per_device_train_batch_size",
        "beta",
        "learning_rate",
        "loss_type",
        "max_length",
        "precompute_ref_log_probs",
    ],
}
SHOWN_BOTH = [
    "max_steps",
    "bf16",
    "use_cpu",
    "gradient_checkpointing",
    "optim",
    "weight_decay",
    "max_grad_norm",
    "lr_scheduler_type",
    "warmup_steps",
    "gradient_accumulation_steps",
    "seed",
]
PAIRS = "tests/data/pairs.jsonl"
SEED = 0  # the project scripts' default: which prompts and pairs; TRL's own seed (42) drives its sampling
# what `python dpo.py --precision bf16-mixed` samples its own pairs with (dpo.Args' defaults)
OWN_PAIRS = {
    "num_prompts": 512,
    "samples_per_prompt": 8,
    "max_new_tokens": 32,
    "temperature": 0.7,
    "eval_size": 200,
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    trainers = parser.add_subparsers(dest="trainer", required=True, metavar="{grpo,dpo}")
    grpo = trainers.add_parser("grpo", help="TRL's GRPOTrainer, as `grpo.py --beta 0 --precision bf16-mixed`")
    grpo.add_argument(
        "--beta",
        type=float,
        default=0.0,
        help="KL coefficient (default 0, as in the docs' comparison; grpo.py's own default is 0.04)",
    )
    dpo = trainers.add_parser("dpo", help="TRL's DPOTrainer, as `dpo.py --precision bf16-mixed`")
    dpo.add_argument(
        "--dataset",
        default=PAIRS,
        help=f"pairs JSONL (default {PAIRS}, as in the docs), or `own`: the model's own cached pairs",
    )
    for name, sub in (("grpo", grpo), ("dpo", dpo)):
        sub.add_argument(
            "--steps",
            type=int,
            default=DEFAULT_STEPS[name],
            help=f"optimizer steps (default {DEFAULT_STEPS[name]}, as in the docs)",
        )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, not {args.steps}")
    return args


def grpo_trainer(args, tokenizer, output_dir: str):
    """GRPOTrainer: 4 prompts x 8 completions per step, the verifier as the reward."""
    import trl
    from datasets import Dataset

    prompts_per_step, group_size = 4, 8
    # grpo.py's stream
    stream, _ = tasks.load_problems(None, SEED, eval_size=8, prompts_per_step=prompts_per_step)
    problems = [next(stream) for _ in range(prompts_per_step * args.steps)]
    dataset = Dataset.from_list(
        [{"prompt": tasks.format_prompt(tokenizer, p.prompt), "answer": p.answer} for p in problems]
    )

    def verifier(completions, answer, **_):
        return [tasks.verify(completion, a) for completion, a in zip(completions, answer)]

    config = trl.GRPOConfig(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=prompts_per_step * group_size,
        num_generations=group_size,
        max_completion_length=32,
        temperature=1.0,
        learning_rate=1e-5,
        beta=args.beta,
        num_iterations=1,
        bf16=True,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
    )
    return trl.GRPOTrainer(
        model=models.model_path("smollm2"),
        reward_funcs=verifier,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def dpo_trainer(args, tokenizer, output_dir: str):
    """DPOTrainer: 8 pairs per step, beta 0.1, a frozen reference copy."""
    import trl
    from datasets import Dataset

    # a file: shuffled by the seed, a tenth held out, as dpo.py --dataset; `own`: the cached samples (the rest of
    # OWN_PAIRS is what they are sampled with, unused for a file)
    dataset = None if args.dataset == "own" else repo_file(args.dataset)
    train, _, _ = preferences.load_preference_pairs(
        dataset,
        "smollm2",
        tokenizer,
        SEED,
        OWN_PAIRS["num_prompts"],
        OWN_PAIRS["samples_per_prompt"],
        OWN_PAIRS["max_new_tokens"],
        OWN_PAIRS["temperature"],
        torch.device("cpu"),
        "bf16-mixed",
        OWN_PAIRS["eval_size"],
    )
    dataset = Dataset.from_list(
        [
            {
                "prompt": tasks.format_prompt(tokenizer, p["prompt"]),
                "chosen": p["chosen"],
                "rejected": p["rejected"],
            }
            for p in train
        ]
    )
    print(f"{len(train)} training pairs")
    config = trl.DPOConfig(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        beta=0.1,
        learning_rate=5e-6,
        bf16=True,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
    )
    return trl.DPOTrainer(
        model=models.model_path("smollm2"), args=config, train_dataset=dataset, processing_class=tokenizer
    )


def repo_file(path: str) -> str:
    """`path` as given, or relative to the repository when it is not there (tests/data/pairs.jsonl from anywhere)."""
    return path if Path(path).exists() or not (REPO / path).exists() else str(REPO / path)


def step_timer():
    """A callback keeping each optimizer step's wall time: from the previous step's end (the first: training's
    start) to this one's, so generation, forward, backward, the optimizer and the step's logging are all in it."""

    class StepTimer(transformers.TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self.last = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            self.times.append(now - self.last)
            self.last = now

    return StepTimer()


def summary(name: str, times: list[float]) -> str:
    """`trl grpo: 24.1 s/step (median of steps 3-12 of 12), peak RSS 5.48 GiB`: the first two steps are skipped
    (with fewer than three steps, the first only; with one, none)."""
    skip = 2 if len(times) >= 3 else len(times) - 1
    kept = times[skip:]
    steps = f"step {skip + 1}" if len(kept) == 1 else f"steps {skip + 1}-{len(times)}"
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    return (
        f"trl {name}: {statistics.median(kept):.2f} s/step (median of {steps} of {len(times)}), "
        f"peak RSS {peak_gib:.2f} GiB"
    )


def main(argv=None) -> None:
    args = parse_args(argv)
    if importlib.util.find_spec("trl") is None:
        print(NO_TRL, file=sys.stderr)
        raise SystemExit(2)
    import trl

    print(
        f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    tokenizer = models.load_tokenizer("smollm2")
    # save_strategy="no": nothing is written
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as output_dir:
        trainer = (grpo_trainer if args.trainer == "grpo" else dpo_trainer)(args, tokenizer, output_dir)
        shown = SHOWN[args.trainer] + SHOWN_BOTH
        print("settings: " + ", ".join(f"{key}={getattr(trainer.args, key)}" for key in shown))
        timer = step_timer()
        trainer.add_callback(timer)
        trainer.train()
    print("step times (s): " + " ".join(f"{t:.2f}" for t in timer.times))
    if args.trainer == "grpo":  # the docs compare completion lengths too (tokens per step)
        lengths = [
            row["completions/mean_length"]
            for row in trainer.state.log_history
            if "completions/mean_length" in row
        ]
        print("mean completion length per step (tokens): " + " ".join(f"{n:.1f}" for n in lengths))
    print(summary(args.trainer, timer.times))


if __name__ == "__main__":
    runs.run_main(main, sys.argv[1:])
